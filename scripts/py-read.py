"""Reads every file under DIR for EPOCHS epochs as a Python dataset does, each with
`open(path, "rb").read()`, split across PROCS forked processes (file i to process i mod PROCS,
in a fresh shuffled order each epoch); prints the seconds of all the epochs. For
scripts/bench-ops.sh's `py` part: CPython's open() asks every file whether it is a terminal (an
ioctl, which a FUSE mount answers in a round trip), which `coorfs read` never does.

    python3 scripts/py-read.py --procs 2 --epochs 5 --seed 1 /mnt/train
"""
import argparse
import os
import random
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("dir")
    a = p.parse_args()
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(a.dir) for f in fs)
    if not files:
        sys.exit("py-read.py: no file under %s" % a.dir)
    rng = random.Random(a.seed)
    start = time.monotonic()
    for _ in range(a.epochs):
        order = files[:]
        rng.shuffle(order)
        children = []
        for k in range(a.procs):
            pid = os.fork()
            if pid == 0:
                for path in order[k :: a.procs]:
                    with open(path, "rb") as f:
                        f.read()
                os._exit(0)
            children.append(pid)
        for pid in children:
            _, status = os.waitpid(pid, 0)
            if status != 0:
                sys.exit("py-read.py: a reader failed (status %d)" % status)
    print(round(time.monotonic() - start, 3))


if __name__ == "__main__":
    main()
