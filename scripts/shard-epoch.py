#!/usr/bin/env python3
"""One epoch of a shard reader, for bench-shards.sh: the .tar shards of DIR in a fresh order
(seeded), split across --procs processes, each reading its shards whole and in order.

    shard-epoch.py --procs 2 --seed 7 [--read-size 16K | --wds] DIR

By default each shard is read with --read-size reads (tarfile reads 512 B headers and the
members, TFRecord readers 8-64 KiB at a time); with --wds, by the `webdataset` package itself
(`wds.WebDataset(shards)`, every sample's bytes), as a training job reads them. Prints
{"seconds", "bytes", "samples"} as JSON."""
import argparse
import json
import multiprocessing
import os
import random
import time

from units import size


def read_plain(job):
    paths, read_size = job
    n = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while True:
                chunk = f.read(read_size)
                if not chunk:
                    break
                n += len(chunk)
    return n, 0


def read_wds(job):
    import webdataset as wds

    paths, _ = job
    n = samples = 0
    for sample in wds.WebDataset(paths, shardshuffle=False, empty_check=False):
        samples += 1
        n += sum(len(v) for v in sample.values() if isinstance(v, bytes))
    return n, samples


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--read-size", type=size, default=16 << 10)
    p.add_argument("--wds", action="store_true")
    p.add_argument("dir")
    a = p.parse_args()
    shards = sorted(os.path.join(a.dir, n) for n in os.listdir(a.dir) if n.endswith(".tar"))
    random.Random(a.seed).shuffle(shards)
    jobs = [(shards[i :: a.procs], a.read_size) for i in range(a.procs)]
    start = time.monotonic()
    with multiprocessing.Pool(a.procs) as pool:
        done = pool.map(read_wds if a.wds else read_plain, jobs)
    seconds = time.monotonic() - start
    print(json.dumps({"seconds": seconds, "bytes": sum(d[0] for d in done),
                      "samples": sum(d[1] for d in done)}))


if __name__ == "__main__":
    main()
