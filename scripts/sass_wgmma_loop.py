"""The steady k loop of each sm90 kernel in a SASS listing (cuobjdump -sass): per function, the
shortest loop (a backward branch and its target) that holds an HGMMA, with its instruction count
and how many of them are R2UR (a value moved from a vector to a uniform register: in a WGMMA loop,
a descriptor built on the vector datapath, four a WGMMA). scripts/check_sass.sh reports the last
line.

    python3 scripts/sass_wgmma_loop.py UNIT.sass
    -> one line per function: "<instructions> <R2UR> <HGMMA> <function>", then the loop with the
       most R2UR per HGMMA: "worst <instructions> <R2UR> <HGMMA>" (0 0 0 when none has one)
"""

import re
import sys

FUNCTION = re.compile(r"Function : (\S+)")
INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\s+(0x[0-9a-f]+)")
R2UR = re.compile(r"\bR2UR\b")


def functions(lines):
    name, body = None, []
    for line in lines:
        m = FUNCTION.search(line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
            continue
        m = INSTRUCTION.match(line)
        if m and name:
            body.append((int(m.group(1), 16), m.group(2)))
    if name:
        yield name, body


def wgmma_loop(body):
    """The shortest loop holding an HGMMA, as (instructions, R2UR, HGMMA), or None."""
    index = {address: i for i, (address, _) in enumerate(body)}
    best = None
    for i, (address, text) in enumerate(body):
        m = BRANCH.search(text)
        target = int(m.group(1), 16) if m else address
        if target >= address or target not in index:  # not a branch back into this function
            continue
        loop = [t for _, t in body[index[target]:i + 1]]
        hgmma = sum("HGMMA" in t for t in loop)
        if hgmma and (best is None or len(loop) < best[0]):
            best = (len(loop), sum(bool(R2UR.search(t)) for t in loop), hgmma)
    return best


def main(path):
    worst = (0, 0, 0)
    with open(path) as f:
        for name, body in functions(f):
            loop = wgmma_loop(body)
            if loop:
                print(*loop, name)
                worst = max(worst, loop, key=lambda x: (x[1] / max(x[2], 1), x[0]))
    print("worst", *worst)


if __name__ == "__main__":
    main(sys.argv[1])
