"""benchmarks/sidebyside.py's argument rules and its kernel table, on the CPU (the timing itself
needs a GPU and, for upstream SonicMoE, its sources)."""

import importlib
import pathlib
import sys

import pytest


@pytest.fixture(scope="module")
def sidebyside():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    return importlib.import_module("sidebyside")


def test_unknown_configs_and_layers_are_refused_before_anything_runs(sidebyside):
    with pytest.raises(ValueError, match="IMPLS = project,cublas: unknown"):
        sidebyside.run(["olmoe-1b-7b"], impls=["project", "cublas"])
    with pytest.raises(ValueError, match=r"configs \['olmoe'\] are unknown"):
        sidebyside.run(["olmoe"], impls=["project"])


def test_the_other_models_are_distinct_real_shapes_the_kernels_take(sidebyside):
    names = [c[0] for c in sidebyside.CONFIGS + sidebyside.MODELS]
    assert len(names) == len(set(names)) and len(sidebyside.MODELS) >= 4
    for _, T, d, n, E, K in sidebyside.MODELS:
        assert d % 8 == 0 and n % 8 == 0 and 1 <= K <= min(E, 32) and T * K < 2**31


def test_kernel_table_sums_calls_by_name(sidebyside, capsys):
    row = {"config": "c", "project_kernels": [{"kernel": "k1", "us": 2.0}, {"kernel": "k2", "us": 5.0},
                                              {"kernel": "k1", "us": 4.0}]}
    sidebyside.print_kernels(row, ["project", "upstream"])
    out = capsys.readouterr().out.splitlines()
    assert "11 µs of kernels" in out[0]
    assert out[1].split() == ["6.0", "µs", "2x", "k1"] and out[2].split() == ["5.0", "µs", "1x", "k2"]


def test_an_activation_the_project_lacks_is_refused_before_anything_runs(sidebyside, monkeypatch):
    import sonicmoe

    assert sidebyside.ACTIVATIONS == tuple(sonicmoe.GLU_ACTIVATIONS)
    with pytest.raises(ValueError, match="ACTIVATION = 'gelu' breaks the rule: must be one of swiglu, geglu, reglu"):
        sidebyside.run(["olmoe-1b-7b"], impls=["project"], activation="gelu")
    monkeypatch.setenv("ACTIVATION", "relu2")
    with pytest.raises(ValueError, match="ACTIVATION = 'relu2' breaks the rule"):
        sidebyside.run(["olmoe-1b-7b"], impls=["project"])


def test_rounds_rotate_so_no_layer_always_follows_the_other(sidebyside):
    names = ["upstream", "project", "torch"]
    orders = [sidebyside.rotated(names, r) for r in range(3)]
    assert orders == [["upstream", "project", "torch"], ["project", "torch", "upstream"],
                      ["torch", "upstream", "project"]]
    assert {o[0] for o in orders} == set(names)  # each layer opens one round


def test_paired_ratios_cancel_a_drift_common_to_both_layers(sidebyside):
    # Ours 10% faster in every phase; the card slows by 1.0, 1.3, 0.9 across the rounds.
    drift = [1.0, 1.3, 0.9]
    ours = {"f": [1.0 * c for c in drift], "fb": [3.0 * c for c in drift]}
    other = {"f": [1.1 * c for c in drift], "fb": [3.3 * c for c in drift]}
    per_round = sidebyside.paired_ratios(ours, other)
    for key in ("fwd_tflops", "bwd_tflops", "fwd_bwd_tflops"):
        assert per_round[key] == pytest.approx([1.1] * 3)


def test_sustained_reads_each_layer_and_call_and_prints_the_ratios(sidebyside, monkeypatch, capsys):
    # A fake energy_interleaved: upstream draws the same power but takes 5% longer a call.
    def readings(calls, ms):
        assert set(calls) == {("project", "fwd"), ("project", "fwd_bwd"), ("upstream", "fwd"), ("upstream", "fwd_bwd")}
        return {key: (650.0, 1500.0, ms[key] * 1.2) for key in calls}

    monkeypatch.setattr(sidebyside, "energy_interleaved", readings)
    fns = {"project": (None, None), "upstream": (None, None)}
    out = sidebyside.sustained(fns, {"project": (10.0, 30.0), "upstream": (10.5, 31.5)})
    assert out["project"]["fwd_bwd_ms"] == pytest.approx(36.0)
    assert out["project"]["fwd_bwd_J"] == pytest.approx(650.0 * 36.0 / 1e3)
    assert out["upstream"]["fwd_MHz"] == 1500.0
    q = {f"{k}_{x}": out["upstream"][f"{k}_{x}"] / out["project"][f"{k}_{x}"]
         for k in ("fwd", "fwd_bwd") for x in ("ms", "J")}
    row = {"config": "c", "project": {}, "sustained": out, "project_over_upstream_sustained": q}
    sidebyside.print_table({"device": "d", "commit": "x", "when": "w", "dense_tflops_before": 1.0,
                            "dense_tflops_after": 1.0, "rows": [row]}, [])
    text = capsys.readouterr().out
    assert "fwd+bwd 1.050 time, 1.050 energy" in text and "f+b 36.00 ms 23.40 J 650 W 1500 MHz" in text
