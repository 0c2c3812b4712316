"""benchmarks/ab_rules.py on the CPU: its variants name functional.py's rules with their
signatures, unknown names are refused, and a variant's rule holds only while its call runs."""

import importlib
import inspect
import pathlib
import sys

import pytest


@pytest.fixture(scope="module")
def ab_rules():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    return importlib.import_module("ab_rules")


def test_each_variant_replaces_a_rule_with_its_signature(ab_rules):
    from sonicmoe import functional

    for name, (rule, replacement) in ab_rules.VARIANTS.items():
        original = getattr(functional, rule)
        assert list(inspect.signature(replacement).parameters) == list(inspect.signature(original).parameters), name


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
    assert ab_rules.under("base", fails) is fails
