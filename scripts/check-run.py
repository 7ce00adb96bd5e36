#!/usr/bin/env python3
"""Checks one input-pipeline run through a coorfs mount against the same pipeline on the
source, and coorfs's stats against what the pipeline did (scripts/check-frameworks.sh).

    check-run.py --source DIR --mount-run M.jsonl --source-run S.jsonl --stats STATS.json
                 [--reference] [--hinted] [--ranks K]

The runs are train-input*.py --json output: one object per epoch. Checked:
- every epoch, on both sides, read every file of the source once: samples and bytes equal
  the source's file count and size, and the checksums of the two sides are equal (with
  --reference, also equal to the checksum of a plain walk of the source, hashed the way
  train-input.py hashes);
- coorfs's stats account for every read: reads = epochs x files (listing the dataset
  opened no file, every open was a sample), hits + misses = reads, one complete
  dataset-wide epoch per pipeline epoch, each of `files` reads; epoch 1 all misses with the
  whole dataset from the source; every later epoch hits exactly the files the cache holds
  (MinIO never evicts) with their bytes from the cache and the rest from the source; the
  totals are the sums of the epochs.
  With prefetch on (prefetch_memory > 0), how epoch 1's misses split into hits and misses, and
  which epoch a prefetched byte counts in, depend on timing; checked instead: later epochs hit
  exactly the cached files, nothing prefetched went unread, and in all every file not cached
  was read from the source once an epoch (epoch 1: every file; with --ranks, at most once:
  each rank is a job, and a block one rank read may reach another from staging, a shared hit,
  or from the blocks read moments ago at an epoch's end, 2%).
- with --hinted (the pipeline sampled with coorfs.HintedSampler, or ran under `coorfs run`): the
  mount accepted one order hint an epoch from each rank and rejected none, and with prefetch on,
  the prefetcher served at least 90% of the reads the cache missed from epoch 2 on (it follows
  the order from the first file of an epoch; without it, it waits for 32 files of each).
- with --ranks K, the mount run is K ranks of one torchrun job, each reporting its own shard:
  an epoch is the sum of the ranks' samples, bytes and checksums.
Standard library only. Exits 1 with every failed check listed.
"""
import argparse
import json
import os
import sys

import trainlib


def source_files(root):
    files = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            files[os.path.relpath(p, root)] = p
    return files


def walk_checksum(files):
    """The checksum of one epoch as train-input.py computes it, from a plain walk."""
    total = 0
    for rel, path in files.items():
        with open(path, "rb") as f:
            total = trainlib.fold(total, [trainlib.sample_hash(rel, f.read())])
    return f"{total:016x}"


def fold_ranks(reports):
    """One report an epoch from the reports of the ranks of a job (one each an epoch): samples,
    bytes and checksums add up, the epoch lasts as long as its slowest rank."""
    by_epoch = {}
    for r in reports:
        by_epoch.setdefault(r["epoch"], []).append(r)
    folded = []
    for epoch, ranks in sorted(by_epoch.items()):
        row = dict(ranks[0])
        row.pop("rank", None)
        row["samples"] = sum(r["samples"] for r in ranks)
        row["bytes"] = sum(r["bytes"] for r in ranks)
        row["checksum"] = "%016x" % trainlib.fold(0, [int(r["checksum"], 16) for r in ranks])
        row["seconds"] = max(r["seconds"] for r in ranks)
        row["samples_per_s"] = round(row["samples"] / max(row["seconds"], 1e-9), 1)
        row["ranks"] = len(ranks)
        folded.append(row)
    return folded


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", required=True)
    p.add_argument("--mount-run", required=True)
    p.add_argument("--source-run", required=True)
    p.add_argument("--stats", required=True)
    p.add_argument("--reference", action="store_true",
                   help="also compare with a plain walk of the source hashed as train-input.py does")
    p.add_argument("--hinted", action="store_true",
                   help="the mount run handed each epoch's order to the mount: check the hints")
    p.add_argument("--ranks", type=int, default=1,
                   help="the mount run is this many ranks, each reporting its shard [1]")
    a = p.parse_args()

    files = source_files(a.source)
    n = len(files)
    size = sum(os.path.getsize(f) for f in files.values())
    load = lambda path: [json.loads(line) for line in open(path) if line.startswith("{")]
    mount_run, source_run = fold_ranks(load(a.mount_run)), load(a.source_run)
    with open(a.stats) as f:
        s = json.load(f)
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got}, want {want}")

    reference = walk_checksum(files) if a.reference else None
    expect("epochs through the mount", len(mount_run), len(source_run))
    for m, r in zip(mount_run, source_run):
        e = m["epoch"]
        expect(f"epoch {e} ranks reporting", m["ranks"], a.ranks)
        for side, run in (("mount", m), ("source", r)):
            expect(f"epoch {e} {side} samples", run["samples"], n)
            expect(f"epoch {e} {side} bytes", run["bytes"], size)
        expect(f"epoch {e} checksum, mount vs source", m["checksum"], r["checksum"])
        if reference:
            expect(f"epoch {e} checksum vs a plain walk of the source", m["checksum"], reference)

    epochs = len(mount_run)
    expect("dataset_files", s["dataset_files"], n)
    expect("dataset_bytes", s["dataset_bytes"], size)
    expect("reads (every open is a sample read)", s["reads"], epochs * n)
    expect("hits + misses", s["hits"] + s["misses"], s["reads"])
    expect("source_errors", s["source_errors"], 0)
    expect("dataset-wide epochs", len(s["epochs"]), epochs)
    cached_files, cached_bytes = s["cached_files"], s["cached_bytes"]
    prefetch = s.get("prefetch_memory", 0) > 0
    for i, ep in enumerate(s["epochs"]):
        e = i + 1
        expect(f"stats epoch {e} number", ep["epoch"], e)
        expect(f"stats epoch {e} complete", ep["complete"], True)
        expect(f"stats epoch {e} files", ep["files"], n)
        expect(f"stats epoch {e} reads", ep["reads"], n)
        expect(f"stats epoch {e} hits + misses", ep["hits"] + ep["misses"], n)
        if prefetch and e == 1:
            continue
        want_hits = 0 if e == 1 else cached_files
        want_cache = 0 if e == 1 else cached_bytes
        expect(f"stats epoch {e} hits", ep["hits"], want_hits)
        expect(f"stats epoch {e} hit_rate", round(ep["hit_rate"], 4), round(want_hits / n, 4))
        expect(f"stats epoch {e} bytes_from_cache", ep["bytes_from_cache"], want_cache)
        if not prefetch:
            expect(f"stats epoch {e} bytes_from_source", ep["bytes_from_source"], size - want_cache)
    if prefetch:
        expect("prefetched_unused", s["prefetched_unused"], 0)
        once = size + (epochs - 1) * (size - cached_bytes)
        if a.ranks == 1:
            expect("bytes_from_source, every uncached file once an epoch", s["bytes_from_source"], once)
        else:
            # Each rank is a job of its own (a process group), and a block one rank read that
            # the cache did not keep stays for the others, which have still to read the file
            # in their epoch: a rank reads half of them in its next one, from staging, not the
            # source (shared_hits, a block each, at most the largest file). And a file one rank
            # read at the end of an epoch and another at the start of the next may come from
            # the blocks read moments ago (2%). Never more than once.
            largest = max(os.path.getsize(f) for f in files.values())
            floor = 0.98 * once - s["shared_hits"] * largest
            if not floor <= s["bytes_from_source"] <= once:
                failures.append(f"bytes_from_source, every uncached file at most once an epoch: got "
                                f"{s['bytes_from_source']}, want {once}, or down to {floor:.0f} with "
                                f"{s['shared_hits']} shared hits")
    if a.hinted:
        expect("hints_accepted (one an epoch from each rank)", s["hints_accepted"], epochs * a.ranks)
        expect("hints_rejected", s["hints_rejected"], 0)
        if prefetch:
            later = s["epochs"][1:]
            missed = sum(ep["misses"] for ep in later)
            staged = sum(ep["staging_hits"] for ep in later)
            if staged < 0.9 * missed:
                failures.append(f"staging_hits from epoch 2 on: {staged} of {missed} reads the cache missed")
    for total in ("hits", "misses", "bytes_from_cache", "bytes_from_source"):
        expect(f"{total} = sum over epochs", s[total], sum(ep[total] for ep in s["epochs"]))
    if s["cache_capacity"] >= size:
        expect("cached_files with room for everything", cached_files, n)
        expect("cached_bytes with room for everything", cached_bytes, size)

    rates = " ".join(f"{ep['hit_rate']:.3f}" for ep in s["epochs"])
    speeds = lambda run: " ".join(f"{r['samples_per_s']:.0f}" for r in run)
    fw = f"{mount_run[0]['framework']} {mount_run[0]['mode']}" if mount_run else "?"
    if failures:
        print(f"FAIL {fw}, cache {s['cache_capacity']} B:", *failures, sep="\n  ")
        sys.exit(1)
    if prefetch:
        hinted = f", {s['hints_accepted']} order hints" if a.hinted else ""
        fw += f", prefetch on ({s['staging_hits']} staging hits{hinted})"
    else:
        fw += ", prefetch off"
    print(f"ok   {fw}, cache {s['cache_capacity'] / 2**20:.0f} MiB: {epochs} epochs x {n} files, "
          f"checksums {' '.join(m['checksum'] for m in mount_run)} equal the source's"
          f"{' and a plain walk' if reference else ''}; reads {s['reads']}, hit rates {rates}, "
          f"{s['bytes_from_source']} B from the source, {s['bytes_from_cache']} B from the cache; "
          f"samples/s through the mount {speeds(mount_run)}, on the source {speeds(source_run)}")


if __name__ == "__main__":
    main()
