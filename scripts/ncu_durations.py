"""Prints each kernel's duration from `ncu --csv --metrics gpu__time_duration.sum` output (on
stdin, as `scripts/ncu_parts.sh --durations` pipes it) in launch order, and their sum. Two builds'
runs of one layer (scripts/ab_variants.sh) pair line by line: the variants share the autotuner's
cache file, so the second runs the first one's tiles.

    ncu --csv --metrics gpu__time_duration.sum ... | python3 scripts/ncu_durations.py
"""
import csv
import re
import sys

TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def short(name, width=110):
    """The kernel's name without 'void ', namespaces' repetition and whitespace, cut to width."""
    name = re.sub(r"\bvoid ", "", name)
    name = re.sub(r"\b(sonicmoe|cute|cutlass)::", "", name)
    return re.sub(r"\s+", "", name)[:width]


def main():
    rows = list(csv.reader(line for line in sys.stdin if line.startswith('"')))
    if not rows:
        sys.exit("no ncu csv rows on stdin (was a kernel profiled?)")
    head = rows[0]
    name_i, value_i, unit_i = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
    total = 0.0
    print(f"{'µs':>9}  kernel")
    for row in rows[1:]:
        if row[unit_i] not in TO_US:
            sys.exit(f"Metric Unit {row[unit_i]!r} of {short(row[name_i], 60)}: must be one of {sorted(TO_US)}")
        us = float(row[value_i].replace(",", "")) * TO_US[row[unit_i]]
        total += us
        print(f"{us:9.1f}  {short(row[name_i])}")
    print(f"{total:9.1f}  all kernels")


if __name__ == "__main__":
    main()
