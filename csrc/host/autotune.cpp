// Tile choice by measurement (autotune.h): the per-device cache, its file, and the timing.
#include "host/autotune.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/cuda_check.h"
#include "common/tile_size.h"

#ifndef SONICMOE_LIBRARY_VERSION
#define SONICMOE_LIBRARY_VERSION "dev"
#endif

namespace sonicmoe::autotune {
namespace {

// A candidate's time is the median of kRounds windows, the candidates interleaved round by round.
// A window is the candidate's settle (untimed launches, autotune.h), then kWindowLaunches launches
// back to back between two events: the start event queues behind the settle, so no host launch
// latency is inside, and the card runs the kernel back to back as in a layer's step (single
// launches after a host sync ranked the tiles differently from the layer). With a settle, a first
// round of windows after one untimed launch each sizes the settles, is not counted, and leaves
// only the contenders (autotune.h) to the counted rounds.
constexpr int kRounds = 3;
constexpr int kWindowLaunches = 4;

struct DeviceCache {
  bool loaded = false;
  std::string path;
  std::vector<std::pair<Key, GemmTileConfig>> choices;
};

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}

std::vector<DeviceCache>& caches() {
  static std::vector<DeviceCache> c;
  return c;
}

std::string sanitized(const std::string& s) {
  std::string out;
  for (char ch : s) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

std::string cache_dir() {
  if (const char* dir = std::getenv("SONICMOE_CACHE_DIR")) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return std::string(xdg) + "/sonicmoe";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::string(home) + "/.cache/sonicmoe";
  return "";
}

std::string device_cache_path(int device) {
  const std::string dir = cache_dir();
  if (dir.empty()) return "";
  cudaDeviceProp prop{};
  int driver = 0;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess || cudaDriverGetVersion(&driver) != cudaSuccess) {
    (void)cudaGetLastError();  // ours: no file for this device, nothing else to report
    return "";
  }
  // The keys of autotune.h, the number of tile configurations among them.
  // The timing's name (time_candidates): "windows" without a settle, "settle<ms>" with one;
  // choices of another timing are timed again.
  double settle = 0.0;
  if (!settle_ms(&settle).ok()) return "";  // run() reports the variable before any lookup
  char timing[32];
  if (settle > 0.0) std::snprintf(timing, sizeof(timing), "settle%g", settle);
  else std::snprintf(timing, sizeof(timing), "windows");
  return dir + "/autotune-" + SONICMOE_LIBRARY_VERSION + "-" + timing + "-tiles" + std::to_string(kNumGemmTileConfigs) +
         "-" + sanitized(prop.name) + "-sm" + std::to_string(prop.multiProcessorCount) + "-driver" +
         std::to_string(driver) + ".txt";
}

// mkdir -p (C library only: the library links into processes whose C++ runtime it does not choose).
void make_dirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') mkdir(dir.substr(0, i).c_str(), 0755);  // EEXIST is fine
}

// The device's cache, its file read on first use. Caller holds cache_mutex().
DeviceCache& device_cache(int device) {
  auto& all = caches();
  if (static_cast<int>(all.size()) <= device) all.resize(device + 1);
  DeviceCache& cache = all[device];
  if (!cache.loaded) {
    cache.loaded = true;
    cache.path = device_cache_path(device);
    FILE* file = cache.path.empty() ? nullptr : std::fopen(cache.path.c_str(), "r");
    char line[256];
    Key key;
    GemmTileConfig config;
    while (file != nullptr && std::fgets(line, sizeof(line), file) != nullptr) {
      if (!parse_entry(line, &key, &config)) continue;  // a torn or foreign line
      auto it = std::find_if(cache.choices.begin(), cache.choices.end(), [&](auto& e) { return e.first == key; });
      if (it != cache.choices.end()) it->second = config;  // the later line wins
      else cache.choices.emplace_back(key, config);
    }
    if (file != nullptr) std::fclose(file);
  }
  return cache;
}

bool lookup(int device, const Key& key, GemmTileConfig* config) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  for (const auto& [k, c] : device_cache(device).choices)
    if (k == key) {
      *config = c;
      return true;
    }
  return false;
}

void store(int device, const Key& key, GemmTileConfig config) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  DeviceCache& cache = device_cache(device);
  cache.choices.emplace_back(key, config);
  if (cache.path.empty()) return;
  make_dirs(cache.path.substr(0, cache.path.rfind('/')));
  // One short line appended per choice (one write): concurrent processes (ranks on one host)
  // append whole lines; a file that cannot be written leaves the choice in memory only.
  const std::string line = format_entry(key, config) + "\n";
  if (FILE* file = std::fopen(cache.path.c_str(), "a")) {
    std::fwrite(line.data(), 1, line.size(), file);
    std::fclose(file);
  }
}

// Each candidate's time (ms per launch, the median of its windows); -1 where a launch failed (a
// shape the configuration does not take) or the sizing round left it out.
Status time_candidates(const std::vector<GemmTileConfig>& candidates, double settle, cudaStream_t stream,
                       const std::function<Status(GemmTileConfig)>& launch, std::vector<float>* ms) {
  const size_t n = candidates.size();
  ms->assign(n, -1.0f);
  std::vector<bool> ok(n);
  for (size_t i = 0; i < n; ++i) ok[i] = launch(candidates[i]).ok();
  std::vector<std::vector<float>> windows(n);
  std::vector<float> sizing(n, -1.0f);  // the uncounted first round's time a launch (with a settle)
  const int first_counted = settle > 0.0 ? 1 : 0;
  cudaEvent_t start = nullptr, stop = nullptr;
  SONICMOE_CUDA_TRY(cudaEventCreate(&start));
  Status status = cuda_status(cudaEventCreate(&stop), "cudaEventCreate");
  for (int round = 0; round < first_counted + kRounds && status.ok(); ++round) {
    if (round == first_counted && first_counted > 0) {  // sized: the counted rounds time contenders only
      const std::vector<bool> keep = contenders(sizing);
      for (size_t i = 0; i < n; ++i) ok[i] = ok[i] && keep[i];
    }
    for (size_t j = 0; j < n && status.ok(); ++j) {
      const size_t i = (j + round) % n;  // rotated: no candidate always follows the same one
      if (!ok[i]) continue;
      bool launched = true;
      const int untimed = settle_launches(settle, sizing[i]);  // one in the sizing round: no size yet
      for (int l = 0; l < untimed && launched; ++l) launched = launch(candidates[i]).ok();
      if (launched) status = cuda_status(cudaEventRecord(start, stream), "cudaEventRecord");
      for (int l = 0; l < kWindowLaunches && launched && status.ok(); ++l) launched = launch(candidates[i]).ok();
      if (!launched) {
        ok[i] = false;
        continue;
      }
      if (status.ok()) status = cuda_status(cudaEventRecord(stop, stream), "cudaEventRecord");
      if (status.ok()) status = cuda_status(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float t = 0.0f;
      if (status.ok()) status = cuda_status(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
      if (status.ok() && round < first_counted) sizing[i] = t / kWindowLaunches;
      else if (status.ok()) windows[i].push_back(t / kWindowLaunches);
    }
  }
  cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  for (size_t i = 0; i < n && status.ok(); ++i) {
    if (!ok[i] || windows[i].empty()) continue;
    std::sort(windows[i].begin(), windows[i].end());
    (*ms)[i] = windows[i][windows[i].size() / 2];
  }
  return status;
}

}  // namespace

int bit_width(int64_t m_total) {
  int bits = 0;
  for (uint64_t v = m_total > 0 ? static_cast<uint64_t>(m_total) : 0; v != 0; v >>= 1) ++bits;
  return bits;
}

std::string format_entry(const Key& key, GemmTileConfig config) {
  char line[256];
  std::snprintf(line, sizeof(line), "%d %" PRId64 " %" PRId64 " %d %d %d %d %d %s", static_cast<int>(key.op), key.n_out,
                key.k, key.rows_bits, key.num_experts, key.sm_count, key.flags, static_cast<int>(config),
                gemm_tile_config_name(config));
  return line;
}

bool parse_entry(const std::string& line, Key* key, GemmTileConfig* config) {
  int op = 0, cfg = 0;
  Key k;
  char name[64] = {0};
  if (std::sscanf(line.c_str(), "%d %" SCNd64 " %" SCNd64 " %d %d %d %d %d %63s", &op, &k.n_out, &k.k, &k.rows_bits,
                  &k.num_experts, &k.sm_count, &k.flags, &cfg, name) != 9)
    return false;  // a line cut short lacks the name, its last field
  if (op < static_cast<int>(Op::kUpProj) || op > static_cast<int>(Op::kWeightGrad)) return false;
  if (cfg < 1 || cfg >= kNumGemmTileConfigs ||
      std::strcmp(name, gemm_tile_config_name(static_cast<GemmTileConfig>(cfg))) != 0)
    return false;
  k.op = static_cast<Op>(op);
  *key = k;
  *config = static_cast<GemmTileConfig>(cfg);
  return true;
}

int choose_fastest(const std::vector<GemmTileConfig>& candidates, const std::vector<float>& ms, GemmTileConfig rule) {
  int best = -1, rule_index = -1;
  for (int i = 0; i < static_cast<int>(candidates.size()) && i < static_cast<int>(ms.size()); ++i) {
    if (ms[i] < 0.0f) continue;
    if (candidates[i] == rule) rule_index = i;
    if (best < 0 || ms[i] < ms[best]) best = i;
  }
  if (best >= 0 && rule_index >= 0 && ms[rule_index] <= ms[best] * (1.0 + kAutotuneMargin)) return rule_index;
  return best;
}

bool enabled() {
  const char* v = std::getenv("SONICMOE_AUTOTUNE");
  return v == nullptr || std::string(v) != "0";
}

Status settle_ms(double* ms) {
  *ms = kSettleMs;
  const char* v = std::getenv("SONICMOE_AUTOTUNE_SETTLE_MS");
  if (v == nullptr) return Status::success();
  char* end = nullptr;
  errno = 0;
  const double parsed = std::strtod(v, &end);
  if (end == v || *end != '\0' || errno != 0 || !(parsed >= 0.0) || parsed > 60000.0)
    return Status::error(std::string("SONICMOE_AUTOTUNE_SETTLE_MS='") + v +
                         "': must be a number of milliseconds from 0 to 60000");
  *ms = parsed;
  return Status::success();
}

std::vector<bool> contenders(const std::vector<float>& sizing_ms) {
  float fastest = -1.0f;
  for (float t : sizing_ms)
    if (t >= 0.0f && (fastest < 0.0f || t < fastest)) fastest = t;
  std::vector<bool> keep(sizing_ms.size());
  for (size_t i = 0; i < sizing_ms.size(); ++i)
    keep[i] = sizing_ms[i] >= 0.0f && sizing_ms[i] <= fastest * kContenderRatio;
  return keep;
}

int settle_launches(double settle, float ms_per_launch) {
  if (!(settle > 0.0) || !(ms_per_launch > 0.0f)) return 1;
  const double launches = std::ceil(settle / ms_per_launch);
  return launches >= kMaxSettleLaunches ? kMaxSettleLaunches : std::max(1, static_cast<int>(launches));
}

std::string cache_path() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  std::lock_guard<std::mutex> lock(cache_mutex());
  return device_cache(device).path;
}

Status run(const Key& key, GemmTileConfig rule, const std::vector<GemmTileConfig>& candidates, cudaStream_t stream,
           const std::function<Status(GemmTileConfig)>& launch) {
  if (!enabled() || candidates.size() < 2) return launch(rule);
  int device = 0;
  SONICMOE_CUDA_TRY(cudaGetDevice(&device));
  GemmTileConfig chosen = rule;
  // A cached choice outside this op's candidates (a hand-edited file) is not launched.
  if (lookup(device, key, &chosen) && std::find(candidates.begin(), candidates.end(), chosen) != candidates.end())
    return launch(chosen);
  chosen = rule;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();  // e.g. the legacy stream while another captures: not ours to tune
    return launch(rule);
  }
  if (capture != cudaStreamCaptureStatusNone) return launch(rule);
  double settle = 0.0;
  SONICMOE_TRY(settle_ms(&settle));  // read only to tune: a cached choice's launch stays lean
  // Relaxed: another thread capturing in global mode must not forbid this thread's event sync.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  SONICMOE_CUDA_TRY(cudaThreadExchangeStreamCaptureMode(&mode));
  std::vector<float> ms;
  const Status timed = time_candidates(candidates, settle, stream, launch, &ms);
  SONICMOE_CUDA_TRY(cudaThreadExchangeStreamCaptureMode(&mode));
  SONICMOE_TRY(timed);
  const int best = choose_fastest(candidates, ms, rule);
  if (best < 0) return launch(rule);  // no candidate ran: the rule's own error, if any, is the answer
  chosen = candidates[best];
  store(device, key, chosen);
  return launch(chosen);
}

void clear_memory() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  caches().clear();
}

}  // namespace sonicmoe::autotune
