"""Smoke test of benchmarks/quality_token_rounding.py (the token-rounding quality check): a few
steps of a tiny model on the CPU, so the script keeps working between H200 runs."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_quality_script_runs_both_routings(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "quality_token_rounding.py"), "--out", str(tmp_path),
           "--device", "cpu", "--steps", "3", "--eval-every", "3", "--eval-batches", "1", "--batch", "2",
           "--seq", "32", "--d", "32", "--heads", "2", "--n", "16", "--experts", "4", "--tile", "8",
           "--corpus-bytes", "200000"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "quality_token_rounding.json").read_text())
    assert set(result["runs"]) == {"softmax_topk", "token_rounding"}
    for run in result["runs"].values():
        assert len(run["train_loss"]) == 3 and run["final_val_loss"] > 0
    assert "relative difference" in done.stdout
