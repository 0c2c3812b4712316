"""benchmarks/profile_sustained.py's matching of a sustained step's kernels to the isolated
step's, on the CPU with fake profiler events. With the tail on a second stream the kernels of a
step interleave differently in start order from step to step:
they must pair by name and occurrence."""

import importlib
import pathlib
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def profile_sustained(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(ROOT / "python"))
    return importlib.import_module("profile_sustained")


def events(*pairs):
    return [types.SimpleNamespace(name=name, device_time=us) for name, us in pairs]


def test_kernels_pair_by_name_and_occurrence_not_position(profile_sustained):
    isolated = events(("K4", 100.0), ("combine", 50.0), ("K5", 80.0), ("splitK", 5.0), ("combine", 40.0))
    # The side stream's kernels start at other points of the main stream's in these steps.
    steps = [events(("K4", 110.0), ("K5", 90.0), ("combine", 60.0), ("combine", 44.0), ("splitK", 6.0)),
             events(("combine", 58.0), ("K4", 120.0), ("splitK", 7.0), ("K5", 88.0), ("combine", 42.0))]
    rows = profile_sustained.kernel_rows(isolated, steps)
    assert rows == [(100.0, 115.0, "K4"), (50.0, 59.0, "combine"), (80.0, 89.0, "K5"), (5.0, 6.5, "splitK"),
                    (40.0, 43.0, "combine")]


def test_a_step_with_other_kernels_gives_no_table(profile_sustained):
    isolated = events(("K4", 100.0), ("K5", 80.0))
    assert profile_sustained.kernel_rows(isolated, [events(("K4", 1.0), ("K6", 2.0))]) is None
    assert profile_sustained.kernel_rows(isolated, [events(("K4", 1.0), ("K5", 2.0), ("K5", 3.0))]) is None


def test_impls_name_sidebysides_layers_and_leave_out_an_absent_upstream(profile_sustained, monkeypatch, capsys):
    assert profile_sustained.impls_arg("project,torch") == ["project", "torch"]
    with pytest.raises(SystemExit, match=r"--impls 'project,cutlass': each must be one of \['project', 'torch', "
                                         r"'upstream'\]"):
        profile_sustained.impls_arg("project,cutlass")
    monkeypatch.setattr(profile_sustained, "upstream_available", lambda: False)
    assert profile_sustained.impls_arg("project,upstream") == ["project"]
    assert "not importable as upstream_sonicmoe" in capsys.readouterr().out
