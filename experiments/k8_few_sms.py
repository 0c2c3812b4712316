"""Per-SM memory rates with the memory system otherwise idle: K8 (combine_dx), a fill (writes only)
and a sum (reads only) on the few SMs a spinning kernel leaves free, against each alone on the whole
GPU. The spinner holds one block per SM (all of its shared memory, so nothing else fits there) and
spins on the global timer, touching no memory. experiments/k8_timeline.py measures K8 beside K5 / K7
instead (29-39 GB/s an SM, session 40).

Session 40 (T 8192, d 2048, top_k 8, 336 MB a call), GB/s an SM:

    op      132 SMs alone   4 SMs beside the spinner   8 SMs
    K8      22.6-26.2       41.6-42.7                  38.0-40.0
    fill    21.7            58.0                       54.0
    sum     23.1            55.6                       48.8

An SM moves ~40 GB/s of K8's gather (512-byte chunks of random rows) and ~55 of a contiguous
stream when nothing else loads the memory system; the whole GPU's ~4 TB/s is ~31 GB/s an SM.
(The run also timed torch's copy_, dropped here: on contiguous tensors it is a DMA copy, not an SM
kernel, and read 1.7 TB/s "on 4 SMs".)

    python3 experiments/k8_few_sms.py [k8]   # on the H200, linked build; k8: K8 only
"""
import sys
import time
import torch
from torch.utils.cpp_extension import load_inline
sys.path.insert(0, "python")
import sonicmoe  # noqa: E402

src = r"""
__global__ void spin(long long ns) {
  extern __shared__ char smem[];
  long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
  if (ns < 0) smem[threadIdx.x] = 0;
}
void launch(int64_t blocks, int64_t ns) {
  static bool once = false;
  if (!once) { cudaFuncSetAttribute(spin, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024); once = true; }
  spin<<<blocks, 128, 227 * 1024, at::cuda::getCurrentCUDAStream()>>>(ns);
}
"""
ext = load_inline("spin_ext", cpp_sources="void launch(int64_t blocks, int64_t ns);",
                  cuda_sources="#include <ATen/cuda/CUDAContext.h>\n" + src, functions=["launch"], verbose=False)
sms = torch.cuda.get_device_properties(0).multi_processor_count
T, d, K = 8192, 2048, 8
rows = torch.randn(T * K, d, device="cuda").bfloat16()
rev = torch.randperm(T * K, device="cuda").int().view(T, K)
add = torch.randn(T, d, device="cuda").bfloat16()
nbytes = (T * K * d + 2 * T * d) * 2
side = torch.cuda.Stream(priority=-1)
big = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16)
ops = {"K8": (lambda: sonicmoe.combine_dx(rows, rev, add), nbytes),
       "fill (write only)": (lambda: big.fill_(1.0), nbytes),
       "sum (read only)": (lambda: big.sum(dtype=torch.float32), nbytes)}
for name, (fn, moved) in ops.items():
    if sys.argv[1:] == ["k8"] and name != "K8":
        continue
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    for free in (0, 4, 8):
        times = []
        for _ in range(5):
            if free:
                ext.launch(sms - free, 60_000_000)  # 60 ms: longer than the op on the free SMs
                time.sleep(0.005)  # let the spinner take its SMs first
            with torch.cuda.stream(side):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); fn(); b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        us = sorted(times)[2]
        n = free or sms
        print(f"{name} ({moved / 1e6:.0f} MB) on {n} SMs{' beside a spinner' if free else ' alone'}: {us:.0f} µs, "
              f"{moved / us / 1e6:.3f} TB/s, {moved / us / 1e3 / n:.1f} GB/s an SM", flush=True)
