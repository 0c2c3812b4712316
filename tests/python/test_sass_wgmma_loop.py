"""scripts/sass_wgmma_loop.py (the k-loop column of scripts/check_sass.sh), on the CPU from a SASS
listing in cuobjdump's format."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "sass_wgmma_loop.py"


def listing(name, instructions):
    lines = [f"\t\tFunction : {name}"]
    lines += [f"        /*{16 * i:04x}*/                   {text} ;   /* 0x0 */" for i, text in enumerate(instructions)]
    return "\n".join(lines) + "\n"


def run(tmp_path, text):
    path = tmp_path / "unit.sass"
    path.write_text(text)
    out = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


# A prologue HGMMA outside any loop, then a k loop (target 0x0020) of two HGMMAs.
VECTOR_LOOP = ["S2R R0, SR_TID.X", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT",
               "R2UR UR8, R10", "R2UR UR9, R11", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24",
               "R2UR UR8, R12", "@P0 R2UR UR9, R13", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0",
               "@!P0 BRA 0x20", "EXIT"]
UNIFORM_LOOP = ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT", "UIADD3 UR8, UR8, 0x2, URZ",
                "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24", "@P1 BRA 0x10", "@P0 BRA 0x0", "EXIT"]


def test_the_shortest_loop_holding_an_hgmma_with_its_r2ur_counted(tmp_path):
    lines = run(tmp_path, listing("k_vector", VECTOR_LOOP) + listing("k_uniform", UNIFORM_LOOP))
    # k_vector: 0x20..0x80 is 7 instructions, 4 R2UR (a predicated one too), 2 HGMMA
    assert lines[0] == "7 4 2 k_vector"
    # k_uniform: the inner loop 0x10..0x30 (3 instructions, 1 HGMMA) beats the outer one
    assert lines[1] == "3 0 1 k_uniform"
    assert lines[2] == "worst 7 4 2"  # the most R2UR per HGMMA


def test_hgmma_outside_every_loop_reads_zero(tmp_path):
    straight = ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT", "@P0 BRA 0x30", "NOP", "EXIT"]
    loop_without_hgmma = ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT", "NOP", "@P0 BRA 0x10", "EXIT"]
    lines = run(tmp_path, listing("k_straight", straight) + listing("k_other_loop", loop_without_hgmma))
    assert lines == ["worst 0 0 0"]
