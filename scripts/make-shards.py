#!/usr/bin/env python3
"""A shard dataset for the benchmarks: WebDataset .tar shards of samples (a .jpg of random
bytes and a .cls), as `webdataset`'s writers make them.

    make-shards.py --shards 32 --size 24M DIR

Writes DIR/shard-NNNNNN.tar, each about --size bytes (samples of 100-200 KiB, seeded, so the
same arguments give the same bytes), and leaves a complete dataset alone (its shard count
and sizes recorded beside it, in DIR.made: a file in DIR would be one more file of the
dataset, which no shard reader reads, and its epochs would never end)."""
import argparse
import io
import os
import random
import tarfile

from units import size as size_arg


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shards", type=int, required=True)
    p.add_argument("--size", type=size_arg, required=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("dir")
    a = p.parse_args()
    stamp = f"{a.shards} {a.size} {a.seed}\n"
    made = a.dir.rstrip("/") + ".made"
    if os.path.exists(made) and open(made).read() == stamp:
        return
    os.makedirs(a.dir, exist_ok=True)
    rng = random.Random(a.seed)
    for s in range(a.shards):
        path = os.path.join(a.dir, f"shard-{s:06d}.tar")
        with tarfile.open(path + ".part", "w") as tar:
            written, i = 0, 0
            while written < a.size - (200 << 10):
                key = f"{s:06d}{i:05d}"
                jpg = rng.randbytes(rng.randint(100 << 10, 200 << 10))
                for ext, data in (("jpg", jpg), ("cls", str(rng.randint(0, 999)).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                written += len(jpg) + 1536
                i += 1
        os.rename(path + ".part", path)
    with open(made, "w") as f:
        f.write(stamp)


if __name__ == "__main__":
    main()
