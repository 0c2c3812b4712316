"""scripts/ncu_durations.py (the table of `ncu_parts.sh --durations`), on the CPU from ncu's csv."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "ncu_durations.py"
HEAD = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'


def run(stdin):
    return subprocess.run([sys.executable, str(SCRIPT)], input=stdin, capture_output=True, text=True)


def test_durations_in_launch_order_in_microseconds_with_their_sum():
    csv = (HEAD + '"0","void sonicmoe::sm90::varlen_gemm_kernel<cute::C<128>>(T)","gpu__time_duration.sum","ns","542,656"\n'
           '"1","nvjet_sm90_tst_128x192","gpu__time_duration.sum","us","32.25"\n'
           '"2","void at::elementwise_kernel","gpu__time_duration.sum","ms","1.5"\n')
    out = run("==PROF== Connected to process\n" + csv)  # ncu's own lines are skipped
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()[1:]
    assert [line.split()[0] for line in lines] == ["542.7", "32.2", "1500.0", "2074.9"]
    assert "sm90::varlen_gemm_kernel<C<128>>(T)" in lines[0] and lines[-1].endswith("all kernels")


def test_no_rows_and_unknown_units_are_refused_by_name():
    out = run("==PROF== no kernels\n")
    assert out.returncode != 0 and "no ncu csv rows" in out.stderr
    out = run(HEAD + '"0","k","gpu__time_duration.sum","cycle","5"\n')
    assert out.returncode != 0 and "Metric Unit 'cycle' of k: must be one of" in out.stderr
