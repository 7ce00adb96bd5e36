#!/usr/bin/env python3
"""Summarise per-epoch benchmark samples as Markdown tables.

Input lines: "system rep epoch seconds storage_bytes hit_rate" (hit_rate may be "-").
Prints, per system, the median over repetitions of each epoch's time, storage bytes and hit
rate (the system's own count, or else 1 - storage bytes / the first epoch's storage bytes),
and with --samples N (samples per epoch) the median samples/s; then the speed-up of every
system over --baseline for each epoch (median of per-repetition ratios of epoch times).
"""
import argparse
import collections
import statistics
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--baseline", default="native")
    p.add_argument("--dataset-bytes", type=float, required=True)
    p.add_argument("--samples", type=int, help="samples per epoch: adds a samples/s column")
    a = p.parse_args()
    rows = collections.defaultdict(dict)  # (system, epoch) -> rep -> (secs, bytes, hit)
    systems, epochs = [], set()
    for line in sys.stdin:
        f = line.split()
        if len(f) != 6:
            continue
        s, rep, ep, secs, by, hit = f
        rows[(s, int(ep))][rep] = (float(secs), float(by), None if hit == "-" else float(hit))
        epochs.add(int(ep))
        if s not in systems:
            systems.append(s)
    epochs = sorted(epochs)
    med = lambda xs: statistics.median(xs) if xs else float("nan")

    rate = "samples/s | " if a.samples else ""
    print(f"| system | epoch | seconds | {rate}storage MiB | storage / dataset | hit rate |")
    print("|---|---|---|---|---|---|" + ("---|" if a.samples else ""))
    for s in systems:
        for e in epochs:
            r = rows[(s, e)].values()
            secs = med([x[0] for x in r])
            by = med([x[1] for x in r])
            hits = [x[2] for x in r if x[2] is not None]
            # Without the system's own count, the byte hit rate against its first epoch, which
            # read everything (this also cancels the partial pages read at the ends of files).
            first = med([x[1] for x in rows[(s, epochs[0])].values()])
            hit = f"{med(hits):.3f}" if hits else f"{1 - by / first:.3f} (bytes)"
            rate = f"{med([a.samples / x[0] for x in r]):.0f} | " if a.samples else ""
            print(f"| {s} | {e} | {secs:.2f} | {rate}{by / 2**20:.0f} | {by / a.dataset_bytes:.3f} | {hit} |")
    print()
    others = [s for s in systems if s != a.baseline]
    print("| epoch | " + " | ".join(f"{s} speed-up over {a.baseline}" for s in others) + " |")
    print("|---|" + "---|" * len(others))
    for e in epochs:
        cells = []
        for s in others:
            base, mine = rows[(a.baseline, e)], rows[(s, e)]
            ratios = [base[r][0] / mine[r][0] for r in base if r in mine and mine[r][0] > 0]
            cells.append(f"{med(ratios):.2f}x")
        print(f"| {e} | " + " | ".join(cells) + " |")
    reps = max((len(v) for v in rows.values()), default=0)
    print(f"\nMedians over {reps} repetitions.")


if __name__ == "__main__":
    main()
