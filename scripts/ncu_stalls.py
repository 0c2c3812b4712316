"""Summarises an Nsight Compute source page (`ncu --import R.ncu-rep --page source --csv
--print-source sass`, as `scripts/ncu_parts.sh --source` writes it): per kernel, the warp stall samples
by reason, the runs of consecutive instructions that executed equally often (a loop body or a
branch's block: its length is the instructions one warp issues per pass), and the instructions
holding the most samples.

    python3 scripts/ncu_stalls.py ncu-out/ncu-source-backward_kernels-olmoe-1b-7b.csv [--top 30]
"""
import argparse
import collections
import csv
import sys


def kernels(path):
    """Yields (kernel name, header, rows) for each kernel block of the csv."""
    name, header, rows = None, None, []
    for row in csv.reader(open(path, newline="")):
        if not row:
            continue
        if row[0] == "Kernel Name":
            if header:
                yield name, header, rows
            name, header, rows = row[1], None, []
        elif header is None and name is not None and "Source" in row:
            header = row
        elif header is not None:
            rows.append(row)
    if header:
        yield name, header, rows


def as_int(text):
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def summarise(name, header, rows, top):
    src = header.index("Source")
    samples = header.index("Warp Stall Sampling (All Samples)")
    executed = header.index("Instructions Executed")
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]

    def top_reasons(subset, n=4):
        counts = collections.Counter()
        for r in subset:
            for i, reason in reasons:
                counts[reason] += as_int(r[i])
        return ", ".join(f"{reason} {v}" for reason, v in counts.most_common(n) if v)

    total = sum(as_int(r[samples]) for r in rows)
    print(f"== {name[:150]}")
    print(f"{len(rows)} instructions, {total} samples; by reason: {top_reasons(rows, 8)}")
    runs, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or as_int(rows[i][executed]) != as_int(rows[start][executed]):
            runs.append((start, i))
            start = i
    busiest = max((as_int(r[executed]) for r in rows), default=0)
    print(f"runs of equal execution counts (>= 1% of the busiest, {busiest}):")
    print(f"{'first':>6}{'last':>6}{'instrs':>7}{'executed':>12}{'samples':>9}  top reasons / first instruction")
    for a, b in runs:
        count = as_int(rows[a][executed])
        part = sum(as_int(r[samples]) for r in rows[a:b])
        if count * 100 >= busiest and (b - a > 2 or part * 100 >= total):
            print(f"{a:>6}{b - 1:>6}{b - a:>7}{count:>12}{part:>9}  {top_reasons(rows[a:b], 3)} | {rows[a][src].strip()[:50]}")
    print(f"top {top} instructions by samples:")
    for k in sorted(sorted(range(len(rows)), key=lambda k: -as_int(rows[k][samples]))[:top]):
        r = rows[k]
        print(f"{k:>6} {r[src].strip()[:64]:<64}{as_int(r[samples]):>8}{as_int(r[executed]):>12}  {top_reasons([r], 3)}")
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    found = False
    for name, header, rows in kernels(args.csv):
        found = True
        summarise(name, header, rows, args.top)
    if not found:
        sys.exit(f"{args.csv}: no kernel with a source table")


if __name__ == "__main__":
    main()
