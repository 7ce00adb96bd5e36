"""Shard datasets and the real readers users run on them, for tests/it/shards.rs.

    python shard_readers.py make DIR          # 6 WebDataset .tar shards and 3 TFRecord files
    python shard_readers.py read DIR [SEED]   # read them all: JSON of what was read
    python shard_readers.py epochs DIR SEED EPOCHS PROCS  # WebDataset epochs, PROCS at once

`make` writes, with fixed seeds, WebDataset shards (`shard-NNN.tar`: samples of a .jpg of
20-200 KiB of random bytes and a .cls) with Python's tarfile, and TFRecord files
(`records-N.tfrecord`: tf.train.Example records of 40-100 KiB) with the `tfrecord` package's
writer. `read` reads the shards with `webdataset` (`wds.WebDataset(urls, shardshuffle=...)`,
shards in a shuffled order, samples as tarfile reads them, 8-64 KiB at a time) and the
TFRecords with the `tfrecord` package's loader, and prints the number of samples and records
and a digest of every (key, bytes), independent of the order: the same on the source and on a
mount, or the mount served other bytes.
"""
import hashlib
import io
import itertools
import json
import os
import random
import sys
import tarfile

SHARDS = 6
SAMPLES = 50
RECORD_FILES = 3
RECORDS = 80


def make(root):
    os.makedirs(root, exist_ok=True)
    rng = random.Random(7)
    for s in range(SHARDS):
        with tarfile.open(os.path.join(root, f"shard-{s:03d}.tar"), "w") as tar:
            for i in range(SAMPLES):
                key = f"{s:03d}{i:04d}"
                for ext, data in (
                    ("jpg", rng.randbytes(rng.randint(20 << 10, 200 << 10))),
                    ("cls", str(rng.randint(0, 999)).encode()),
                ):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    import tfrecord

    for r in range(RECORD_FILES):
        writer = tfrecord.TFRecordWriter(os.path.join(root, f"records-{r}.tfrecord"))
        for i in range(RECORDS):
            writer.write(
                {
                    "image": (rng.randbytes(rng.randint(40 << 10, 100 << 10)), "byte"),
                    "label": (rng.randint(0, 999), "int"),
                }
            )
        writer.close()


def read(root, seed):
    import tfrecord
    import webdataset as wds

    digest = [0] * 32
    count = {"samples": 0, "records": 0, "bytes": 0}

    def add(name, data):
        h = hashlib.sha256(name.encode() + b"\0" + data).digest()
        for i, b in enumerate(h):
            digest[i] ^= b
        count["bytes"] += len(data)

    urls = sorted(
        os.path.join(root, n) for n in os.listdir(root) if n.endswith(".tar")
    )
    dataset = wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False)
    for sample in dataset:
        count["samples"] += 1
        for k, v in sample.items():
            if isinstance(v, bytes):
                add(sample["__key__"] + "." + k, v)
    for n in sorted(os.listdir(root)):
        if n.endswith(".tfrecord"):
            loader = tfrecord.tfrecord_loader(
                os.path.join(root, n), None, {"image": "byte", "label": "int"}
            )
            for i, rec in enumerate(loader):
                count["records"] += 1
                add(f"{n}/{i}", bytes(rec["image"]) + bytes(rec["label"].tobytes()))
    count["digest"] = bytes(digest).hex()
    print(json.dumps(count))


def epochs(root, seed, epochs, procs):
    """`epochs` epochs of the .tar shards with `wds.WebDataset`, each split across `procs`
    forked processes as DataLoader workers split them (every procs-th shard), shuffled afresh
    each epoch. Prints one JSON line an epoch: the shards each process read, in its order, and
    a digest of every (key, bytes) read."""
    import webdataset as wds

    urls = sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".tar"))
    for epoch in range(epochs):
        pipes = []
        for proc in range(procs):
            r, w = os.pipe()
            if os.fork() == 0:
                os.close(r)
                digest = [0] * 32
                order = []
                dataset = wds.WebDataset(
                    urls,
                    shardshuffle=len(urls),
                    seed=seed * 1000 + epoch * 10 + proc,
                    nodesplitter=None,
                    workersplitter=lambda src, proc=proc: itertools.islice(src, proc, None, procs),
                    empty_check=False,
                )
                for sample in dataset:
                    name = os.path.basename(sample["__url__"])
                    if name not in order:
                        order.append(name)
                    for k, v in sample.items():
                        if isinstance(v, bytes):
                            h = hashlib.sha256((sample["__key__"] + "." + k).encode() + b"\0" + v)
                            for i, b in enumerate(h.digest()):
                                digest[i] ^= b
                os.write(w, json.dumps({"order": order, "digest": digest}).encode())
                os._exit(0)
            os.close(w)
            pipes.append(r)
        report = {"epoch": epoch + 1, "orders": [], "digest": [0] * 32}
        for r in pipes:
            with os.fdopen(r) as f:
                got = json.loads(f.read())
            report["orders"].append(got["order"])
            report["digest"] = [a ^ b for a, b in zip(report["digest"], got["digest"])]
        for _ in pipes:
            _, status = os.wait()
            assert status == 0, status
        report["digest"] = bytes(report["digest"]).hex()
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "epochs":
        epochs(sys.argv[2], *map(int, sys.argv[3:6]))
    else:
        read(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
