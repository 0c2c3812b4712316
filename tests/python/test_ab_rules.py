"""benchmarks/ab_rules.py on the CPU: its variants name functional.py's rules with their
signatures, unknown names are refused, and a variant's rule holds only while its call runs."""

import importlib
import inspect
import pathlib
import sys

import pytest


@pytest.fixture(scope="module")
def ab_rules():
    # ab_rules puts the source tree's python/ first on sys.path (as every benchmark does); the
    # path is restored after this module's tests, so that the processes later tests spawn (the
    # distributed ranks) import the package under test, not the source tree.
    saved = list(sys.path)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        yield importlib.import_module("ab_rules")
    finally:
        sys.path[:] = saved


def test_each_variant_replaces_functional_names_in_kind(ab_rules):
    from sonicmoe import functional

    for variant, swaps in ab_rules.VARIANTS.items():
        for name, value in swaps.items():
            original = getattr(functional, name)
            if callable(original):
                params = list(inspect.signature(original).parameters)
                assert list(inspect.signature(value).parameters) == params, variant
            else:
                assert type(value) is type(original), variant


def test_unknown_variants_are_refused_and_base_runs_first(ab_rules):
    with pytest.raises(ValueError, match=r"variants \['dw1=k5'\] are unknown; must be among base, dw1=k7"):
        ab_rules.check_variants(["dw1=k5"])
    assert ab_rules.check_variants(["dw1=k7", "base"]) == ["base", "dw1=k7"]
    with pytest.raises(ValueError, match="config 'olmoe' is unknown"):
        ab_rules.main(["olmoe"])


def test_a_variant_holds_only_while_its_call_runs(ab_rules):
    from sonicmoe import functional

    kept = functional._dw1_on_k7
    seen = []
    ab_rules.under("dw1=copy", lambda: seen.append(functional._dw1_on_k7(512)))()
    assert seen == [False] and functional._dw1_on_k7 is kept and kept(512)

    def fails():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        ab_rules.under("tail=after", fails)()
    assert functional._tail_beside_weight_grads.__name__ == "_tail_beside_weight_grads"
    margin, margins = functional._TAIL_SM_MARGIN, []
    ab_rules.under("tail=beside16", lambda: margins.append(functional._TAIL_SM_MARGIN))()
    assert margins == [16] and functional._TAIL_SM_MARGIN == margin
    assert ab_rules.under("base", fails) is fails


def test_a_tile_variant_fixes_one_kernels_tile_while_its_call_runs(ab_rules):
    from sonicmoe import functional

    tile = "varlen_cooperative_128x256x64_c2x1"
    kept = functional.grouped_gemm
    seen = []
    ab_rules.under(f"k2={tile}", lambda: seen.append(functional.grouped_gemm))()
    assert seen[0].func is kept and seen[0].keywords == {"tile_config": tile}
    assert functional.grouped_gemm is kept
    assert set(ab_rules.tile_swaps(f"k57={tile}")) == {"weight_grad"}
    assert ab_rules.check_variants([f"k6={tile}"]) == ["base", f"k6={tile}"]
    for bad in ("k3=" + tile, "k2=auto", "k2=varlen_pingpong_999", "k2"):
        assert ab_rules.tile_swaps(bad) is None
        with pytest.raises(ValueError, match="or KERNEL=TILE with KERNEL among k1, k2, k4, k6, k57"):
            ab_rules.check_variants([bad])


def test_an_environment_variant_holds_only_while_its_call_runs(ab_rules, monkeypatch):
    import os

    import sonicmoe

    cleared = []
    monkeypatch.setattr(sonicmoe, "autotune_clear", lambda: cleared.append(os.environ.get(
        "SONICMOE_AUTOTUNE_SETTLE_MS")))
    monkeypatch.setenv("SONICMOE_AUTOTUNE_SETTLE_MS", "150")
    seen = []
    ab_rules.under("tune=windows", lambda: seen.append(os.environ["SONICMOE_AUTOTUNE_SETTLE_MS"]))()
    assert seen == ["0"] and cleared == ["0", "150"]  # each side reads its own timing's file
    monkeypatch.delenv("SONICMOE_AUTOTUNE_SETTLE_MS")
    with pytest.raises(RuntimeError):
        ab_rules.under("tune=windows", lambda: (_ for _ in ()).throw(RuntimeError("boom")))()
    assert "SONICMOE_AUTOTUNE_SETTLE_MS" not in os.environ and cleared[-1] is None


def test_main_times_every_variant_against_the_base(ab_rules, monkeypatch, capsys):
    from sonicmoe import functional

    calls = []
    monkeypatch.setattr(ab_rules.sidebyside, "project_fns",
                        lambda T, d, n, E, K: (None, lambda: calls.append(functional._dw1_on_k7(n))))
    # K7 (the variant: the rule read True during its call) 5% faster than the base's copy path
    monkeypatch.setattr(ab_rules.sidebyside, "bench", lambda fn: (fn(), 9.5 if calls[-1] else 10.0)[1])
    monkeypatch.setattr(ab_rules.sidebyside, "energy_interleaved",
                        lambda fns, ms: {v: (700.0, 1400.0, ms[v] * 1.1) for v in fns})
    monkeypatch.setattr(ab_rules.torch.cuda, "get_device_name", lambda: "card")
    monkeypatch.setattr(ab_rules.torch.cuda, "synchronize", lambda: None)
    ab_rules.main(["qwen3-235b-a22b", "dw1=k7"])
    out = capsys.readouterr().out
    assert "card, qwen3-235b-a22b (T 32768, d 4096, n 1536, E 128, K 8), fwd+bwd, 6 rounds" in out
    assert len(calls) == 2 + 12 and calls[:2] == [False, True]  # n 1536: the base's rule is the copy
    rows = {line.split()[0]: line for line in out.splitlines()[2:-1]}
    assert out.splitlines()[-1].startswith("first call, s (the autotuner's tuning") and "dw1=k7 0.0" in out
    assert set(rows) == {"base", "dw1=k7"}
    assert "10.00  1.0000 (1.000-1.000)" in rows["base"] and "11.00, 7.70, 700, 1400; 1.0000, 1.0000" in rows["base"]
    assert "9.50  1.0526 (1.053-1.053)" in rows["dw1=k7"] and "10.45, 7.32, 700, 1400; 1.0526, 1.0526" in rows["dw1=k7"]
