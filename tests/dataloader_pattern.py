#!/usr/bin/env python3
"""A PyTorch DataLoader's access pattern with the standard library only, for tests/frameworks.rs
(CI has python3 but no pip packages; scripts/check-frameworks.sh runs the real libraries).

What torch.utils.data.DataLoader(ImageFolder(DIR), shuffle=True, num_workers=N) does to the
file system, every epoch:
- the parent lists DIR (class folders, sorted file names) without opening a file, once;
- it draws a fresh random permutation of the samples, cuts it into batches of
  --batch-size, and forks N worker processes (os.fork: they share its process group, like
  DataLoader's workers); worker w loads batches w, w + N, w + 2N, ...;
- a worker opens each file of its batches and reads it whole, and sends back what it read:
  here the index, a 64-bit hash of (path relative to DIR, NUL, bytes) and the size,
  over a pipe;
- the parent checks that every sample came back exactly once and folds the hashes into an
  order-independent checksum (sum mod 2**64), as scripts/trainlib.py does.

Prints one JSON object per epoch: epoch, samples, bytes, checksum (16 hex digits), seconds.
Exits non-zero if a worker fails or a sample is missing or repeated.

    python3 tests/dataloader_pattern.py --workers 4 --epochs 3 --seed 7 /mnt/train
"""
import argparse
import hashlib
import json
import os
import random
import sys
import time

MASK = (1 << 64) - 1


def list_samples(root):
    """ImageFolder's listing: class folders, then the files below each, sorted; no opens."""
    samples = []
    for cls in sorted(e.name for e in os.scandir(root) if e.is_dir()):
        for d, _, names in sorted(os.walk(os.path.join(root, cls))):
            samples += [os.path.join(d, n) for n in sorted(names)]
    return samples


def load(root, path):
    """What a worker does with one sample: read it whole and hash it with its relative path."""
    with open(path, "rb") as f:
        data = f.read()
    h = hashlib.sha1(os.path.relpath(path, root).encode())  # SHA-1: cheap with SHA instructions
    h.update(b"\0")
    h.update(data)
    return int.from_bytes(h.digest()[:8], "little"), len(data)


def worker(root, samples, batches, out_fd):
    """A forked worker: loads its batches and writes [[index, hash, size], ...] to out_fd."""
    loaded = [[i, *load(root, samples[i])] for batch in batches for i in batch]
    with os.fdopen(out_fd, "w") as out:
        json.dump(loaded, out)


def epoch(root, samples, order, workers, batch_size):
    """One epoch through `workers` forked processes; returns (samples, bytes, checksum)."""
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    children = []
    for w in range(workers):
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 1
            try:
                worker(root, samples, batches[w::workers], wfd)
                code = 0
            finally:
                os._exit(code)  # never run the parent's cleanup in a child
        os.close(wfd)
        children.append((pid, r))
    seen = [0] * len(samples)
    nbytes = checksum = 0
    for pid, r in children:
        with os.fdopen(r) as pipe:
            text = pipe.read()
        _, status = os.waitpid(pid, 0)
        if status != 0:
            sys.exit(f"dataloader_pattern.py: worker {pid} failed (status {status})")
        for index, digest, size in json.loads(text):
            seen[index] += 1
            nbytes += size
            checksum = (checksum + digest) & MASK
    wrong = [samples[i] for i, n in enumerate(seen) if n != 1]
    if wrong:
        sys.exit(f"dataloader_pattern.py: {len(wrong)} samples not read exactly once, e.g. {wrong[0]}")
    return len(samples), nbytes, checksum


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--workers", type=int, default=2, help="worker processes [2]")
    p.add_argument("--epochs", type=int, default=3, help="epochs [3]")
    p.add_argument("--batch-size", type=int, default=16, help="samples per batch [16]")
    p.add_argument("--seed", type=int, default=0, help="seed of the permutations [0]")
    a = p.parse_args()
    if a.workers < 1 or a.epochs < 1 or a.batch_size < 1:
        p.error("--workers, --epochs and --batch-size must be positive")
    root = os.path.abspath(a.dir)
    samples = list_samples(root)
    rng = random.Random(a.seed)
    for e in range(1, a.epochs + 1):
        order = list(range(len(samples)))
        rng.shuffle(order)
        start = time.perf_counter()
        n, nbytes, checksum = epoch(root, samples, order, a.workers, a.batch_size)
        seconds = time.perf_counter() - start
        print(json.dumps({"epoch": e, "samples": n, "bytes": nbytes, "checksum": f"{checksum:016x}",
                          "seconds": round(seconds, 4)}), flush=True)


if __name__ == "__main__":
    main()
