"""benchmarks/bench.py's --energy readings on the CPU, against a fake energy counter and clock: the
mean power over a window between two counter steps, the SM clock read inside it, and the rounds'
medians. On the GPU they read NVML. Also the anchors'
protocol (moe_anchor_protocol): the do_bench windows and the idle ahead of each, on a host clock."""

import importlib
import pathlib
import sys
import time
import types

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch):
    """bench.py with CUDA's events and syncs as no-ops (the fake work runs on the host)."""
    class Event:
        def record(self):
            pass

        def synchronize(self):
            pass

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("bench")


def fake_counter(watts, step_s=0.02):
    """An energy counter in mJ that moves every step_s seconds, as NVML's does on some cards."""
    t0 = time.perf_counter()
    return lambda: int((time.perf_counter() - t0) / step_s) * watts * step_s * 1e3


def work():
    time.sleep(0.0005)


def test_mean_power_and_clock(bench):
    watts, mhz, ms = bench.mean_power_w(work, 0.5, fake_counter(500.0), clock=lambda: 1755, seconds=0.2, settle=0.05)
    assert watts == pytest.approx(500.0, rel=0.15)
    assert mhz == 1755
    assert 0.5 <= ms < 2.0  # a call sleeps 0.5 ms on the host (plus the loop's own time)
    watts, mhz, _ = bench.mean_power_w(work, 0.5, fake_counter(300.0), seconds=0.2, settle=0.05)
    assert watts == pytest.approx(300.0, rel=0.15) and mhz != mhz  # NaN without a clock reader


def test_a_counter_that_never_moves_reads_nan(bench):
    watts, mhz, ms = bench.mean_power_w(work, 0.5, lambda: 7.0, give_up=0.1)
    assert watts != watts and mhz != mhz and ms != ms


def test_energy_interleaved_medians_through_nvml(bench, monkeypatch):
    counter = fake_counter(650.0)
    nvml = types.SimpleNamespace(NVML_CLOCK_SM=1, nvmlDeviceGetTotalEnergyConsumption=lambda handle: counter(),
                                 nvmlDeviceGetClockInfo=lambda handle, kind: 1410)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "_get_pynvml_handler", lambda: None, raising=False)
    power = bench.energy_interleaved({"a": work, "b": work}, {"a": 0.5, "b": 0.5}, rounds=2)
    assert set(power) == {"a", "b"}
    for watts, mhz, ms in power.values():
        assert watts == pytest.approx(650.0, rel=0.15) and mhz == 1410 and ms >= 0.5


def test_settle_calls_fill_the_settle_time(bench):
    assert bench.settle_calls(0, 2.5) == 0
    assert bench.settle_calls(250, 2.5) == 100
    assert bench.settle_calls(250, 300.0) == 1  # a call longer than the settle time: one
    assert bench.settle_calls(250, 0.0) == 10000  # a call too short to time: capped


def test_time_interleaved_settles_each_window_on_its_own_part(bench, monkeypatch):
    monkeypatch.setattr(bench, "time_ms", lambda fn, warmup=10, iters=100: 2.0)
    calls = {"a": 0, "b": 0}
    fns = {k: (lambda k=k: calls.__setitem__(k, calls[k] + 1)) for k in calls}
    assert bench.time_interleaved(fns, rounds=3, iters=4) == {"a": 2.0, "b": 2.0}
    assert calls == {"a": 0, "b": 0}  # time_ms (stubbed) makes every timed call; no settling
    bench.time_interleaved(fns, rounds=3, iters=4, settle_ms=20)
    assert calls == {"a": 30, "b": 30}  # 10 calls of 2 ms ahead of each of 3 windows
    monkeypatch.setattr(bench, "SETTLE_MS", 8.0)
    bench.time_interleaved(fns, rounds=2, iters=4)
    assert calls == {"a": 38, "b": 38}


class VirtualClock:
    """CUDA events on a clock that only the fake work advances: exact, whatever the host's load."""

    def __init__(self):
        self.now_ms = 0.0

    def event(self, enable_timing=False):
        clock = self

        class Event:
            def record(self):
                self.t = clock.now_ms

            def elapsed_time(self, end):
                return end.t - self.t

        return Event()


def test_flushed_mean_ms_times_do_bench_windows(bench, monkeypatch):
    clock = VirtualClock()
    monkeypatch.setattr(torch.cuda, "Event", clock.event)
    counts = {"fn": 0, "flush": 0}

    def fn():
        counts["fn"] += 1
        clock.now_ms += 2.0

    def flush():  # outside the timed range: it must not count
        counts["flush"] += 1
        clock.now_ms += 0.5 if counts["flush"] > 5 else 0.0

    assert bench.flushed_mean_ms(fn, warmup_ms=10, rep_ms=40, flush=flush) == pytest.approx(2.0)
    # do_bench's counts: 5 flushed estimating calls of 2 ms, then 10 / 2 warm-up calls unflushed,
    # then 40 / 2 timed calls each after a flush; and the first call ahead of it all.
    assert counts == {"fn": 1 + 5 + 5 + 20, "flush": 5 + 20}


def test_anchor_protocol_idles_before_its_window(bench, monkeypatch):
    slept = []
    monkeypatch.setattr(bench.time, "sleep", slept.append)
    timer = lambda fn, warmup_ms, rep_ms: (fn(), warmup_ms, rep_ms)[1:]  # noqa: E731
    assert bench.anchor_protocol_ms(lambda: None, timer) == (5.0, 500.0)
    assert slept == [0.5]
    bench.anchor_protocol_ms(lambda: None, timer, idle_s=0.0)
    assert slept == [0.5, 0.0]


def test_layer_data_names_are_checked(bench):
    with pytest.raises(ValueError, match="data = 'zeros' breaks the rule"):
        bench.layer_params(8, 8, 8, 2, data="zeros")



def test_anchor_protocol_interleaved_rotates_and_takes_medians(bench, monkeypatch):
    order = []
    monkeypatch.setattr(bench, "anchor_protocol_ms", lambda fn, timer: (order.append(fn()), len(order))[1])
    ms = bench.anchor_protocol_interleaved({"a": lambda: "a", "b": lambda: "b", "c": lambda: "c"}, rounds=3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert ms == {"a": 6, "b": 4, "c": 5}  # medians of the window numbers each took


def test_card_matmul_tflops_is_the_median_windows_rate(bench):
    windows = iter([4.0, 2.0, 8.0])
    calls = []

    def timer(fn, warmup_ms, rep_ms):
        calls.append((fn().shape, warmup_ms, rep_ms))  # the timed call is a 16 x 16 bf16 matmul
        return next(windows)

    tflops = bench.card_matmul_tflops(timer, windows=3, n=16, device="cpu")
    assert calls == [(torch.Size([16, 16]), 200.0, 1000.0)] * 3
    assert tflops == pytest.approx(2 * 16 ** 3 / 4.0 / 1e9)  # the median window, 4 ms


def test_card_speed_line_against_the_anchors_card(bench):
    line = bench.card_speed_line({"before": 720.0, "after": 714.0}, 752)
    assert "720.0 / 714.0 TFLOP/s" in line and "752" in line and "0.957 / 0.949" in line
    assert "anchors" not in bench.card_speed_line({"before": 720.0, "after": 714.0}, None)


def test_kernel_energy_is_the_power_times_its_own_windows_time(bench, monkeypatch):
    # the timed rounds read 2 ms a call (a higher clock), the power's window 2.5 ms at 600 W
    monkeypatch.setattr(bench, "time_interleaved", lambda fns, rounds, iters: {k: 2.0 for k in fns})
    monkeypatch.setattr(bench, "energy_interleaved", lambda fns, ms: {k: (600.0, 1400.0, 2.5) for k in fns})
    monkeypatch.setattr(bench, "MEASURE_ENERGY", True)
    row = bench.time_kernels("cfg", {"K1": (work, 4e12)})
    assert row["K1_us"] == 2000.0 and row["K1_window_us"] == 2500.0
    assert row["K1_mJ"] == pytest.approx(1500.0) and row["K1_pJ_per_flop"] == pytest.approx(0.375)
