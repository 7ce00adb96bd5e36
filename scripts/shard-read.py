#!/usr/bin/env python3
"""One node's share of a distributed epoch: reads the files DistributedSampler gives rank RANK
of WORLD in epoch EPOCH, with PROCS processes, and prints {"seconds", "files", "bytes"} as JSON.

The order is DistributedSampler's: the dataset's indices shuffled with the seed SEED + EPOCH
(Python's generator, the same on every rank), of which rank r takes every WORLD-th from r. The
files are the lines of LIST (paths relative to DIR). With --hint, the order goes to the coorfs
mount at DIR first (MOUNT/.coorfs-order, with this checkout's coorfs.order.send_hint), as
coorfs.HintedSampler would hand it over.
"""
import argparse
import json
import multiprocessing
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from coorfs.order import send_hint  # noqa: E402


def read(path):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return n
            n += len(chunk)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--list", required=True, help="file of paths relative to DIR, one a line")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--epoch", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--hint", action="store_true")
    p.add_argument("dir")
    a = p.parse_args()
    with open(a.list) as f:
        files = [line.rstrip("\n") for line in f if line.strip()]
    order = list(range(len(files)))
    random.Random(a.seed + a.epoch).shuffle(order)
    mine = [files[i] for i in order[a.rank :: a.world]]
    if a.hint:
        send_hint(a.dir, ("\n".join(mine) + "\n").encode())
    paths = [os.path.join(a.dir, rel) for rel in mine]
    start = time.monotonic()
    with multiprocessing.Pool(a.procs) as pool:
        total = sum(pool.imap(read, paths, chunksize=8))
    print(json.dumps({"seconds": time.monotonic() - start, "files": len(paths), "bytes": total}))


if __name__ == "__main__":
    main()
