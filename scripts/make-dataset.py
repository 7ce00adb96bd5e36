#!/usr/bin/env python3
"""Generate a sample dataset: N files of random bytes in class folders, like ImageFolder.

Deterministic from --seed; file sizes vary around --size (+-10%, like JPEGs) unless
--exact. Standard library only, so it runs on a fresh machine. Existing files of the right
size are kept, so re-running is cheap.

    scripts/make-dataset.py --files 20000 --size 100K --classes 100 /var/tmp/data
"""
import argparse
import os
import random
import sys

from units import size


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="where to write the dataset (created if missing)")
    p.add_argument("--files", type=int, default=2000, help="number of files [2000]")
    p.add_argument("--size", type=size, default=100 << 10, help="mean file size, e.g. 100K [100K]")
    p.add_argument("--classes", type=int, default=10, help="class folders [10]")
    p.add_argument("--exact", action="store_true", help="every file exactly --size bytes")
    p.add_argument("--max-size", type=size, default=None,
                   help="sizes uniform between --size and this, e.g. --size 200 --max-size 600")
    p.add_argument("--seed", type=int, default=0, help="random seed [0]")
    a = p.parse_args()
    if a.files < 1 or a.classes < 1 or a.size < 1:
        sys.exit("make-dataset.py: --files, --classes and --size must be positive")
    rng = random.Random(a.seed)
    pool = rng.randbytes(max(a.size, a.max_size or 0) * 2 + 65536)
    total = 0
    for i in range(a.files):
        if a.max_size:
            n = rng.randint(a.size, a.max_size)
        else:
            n = a.size if a.exact else max(1, int(a.size * rng.uniform(0.9, 1.1)))
        d = os.path.join(a.dir, f"class{i % a.classes:04d}")
        path = os.path.join(d, f"sample{i:07d}.bin")
        total += n
        # Drawn for every file, kept or written: the sizes after it must not depend on which
        # files a former run left (they did, and each run rewrote a different dataset).
        start = rng.randrange(0, len(pool) - n)
        if os.path.exists(path) and os.path.getsize(path) == n:
            continue
        os.makedirs(d, exist_ok=True)
        with open(path, "wb") as f:
            # The first 8 bytes make every file unique even where the pool overlaps.
            f.write(i.to_bytes(8, "little") + pool[start : start + n - 8] if n > 8 else pool[:n])
    print(f"{a.files} files, {total / (1 << 20):.1f} MiB in {a.dir}")


if __name__ == "__main__":
    main()
