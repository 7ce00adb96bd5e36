#!/usr/bin/env python3
"""Summarise benchmark samples: medians per (workload, system) and the median of per-repetition
ratios against a baseline system, as a Markdown table.

Input: lines of "workload system rep value" on stdin (value: higher is better).
    benchstats.py --baseline native --unit MiB/s < samples.txt
"""
import argparse
import collections
import statistics
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--baseline", required=True, help="system the ratios divide by")
    p.add_argument("--unit", default="MiB/s")
    p.add_argument("--also", action="append", default=[], help="extra ratio NUM/DEN, e.g. coorfs/bindfs")
    p.add_argument("--digits", type=int, default=0, help="decimals of the medians")
    a = p.parse_args()
    samples = collections.defaultdict(dict)  # (workload, system) -> {rep: value}
    order_w, order_s = [], []
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 4:
            continue
        w, s, rep, v = parts
        samples[(w, s)][rep] = float(v)
        if w not in order_w:
            order_w.append(w)
        if s not in order_s:
            order_s.append(s)

    def ratio(w, num, den):
        reps = set(samples[(w, num)]) & set(samples[(w, den)])
        vals = [samples[(w, num)][r] / samples[(w, den)][r] for r in reps if samples[(w, den)][r] > 0]
        return statistics.median(vals) if vals else float("nan")

    ratios = [(s, a.baseline) for s in order_s if s != a.baseline]
    ratios += [tuple(x.split("/")) for x in a.also]
    head = ["workload"] + [f"{s} {a.unit}" for s in order_s] + [f"{n}/{d}" for n, d in ratios]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for w in order_w:
        row = [w]
        for s in order_s:
            vals = list(samples[(w, s)].values())
            row.append(f"{statistics.median(vals):.{a.digits}f}" if vals else "-")
        for n, d in ratios:
            row.append(f"{ratio(w, n, d):.2f}x")
        print("| " + " | ".join(row) + " |")
    reps = max((len(v) for v in samples.values()), default=0)
    print(f"\nMedians over {reps} repetitions; ratios are medians of per-repetition ratios.")


if __name__ == "__main__":
    main()
