#!/usr/bin/env python3
"""The s3torchconnector reader of bench-s3.sh: every object beneath s3://BUCKET/PREFIX once,
whole, in a random order (seeded: the same order as scripts/s3-read.py's), split across --procs
processes, each with its own s3torchconnector S3Client (the CRT client of mountpoint-s3, which
splits an object into parts fetched at once) reading its share one object after another with
the default (sequential) S3Reader, as S3MapDataset's workers do.
Prints {"seconds": ..., "bytes": ...}; the listing is taken before the clock starts.

    s3torch-read.py --endpoint http://127.0.0.1:9000 --procs 2 --seed 7 [--join PROCS] BUCKET PREFIX

With --join (a cgroup's cgroup.procs file, once for each controller), the script joins that
cgroup after its imports and before anything else, its readers with it. Importing
s3torchconnector imports torch, whose CUDA wheel alone leaves about 290 MiB of anonymous memory
(relocated library data) in the process; a trainer has that whatever reads its data, and a
cgroup's memory stays charged where it was first used, so the pod is charged with the reading
(the CRT client, its buffers, the objects read) and not with torch.

Credentials and region come from the environment (AWS_ACCESS_KEY_ID, ..., AWS_REGION). Run it
with the python of the venv that has s3torchconnector (bench-s3.sh installs one into
target/s3torch)."""
import argparse
import json
import multiprocessing
import os
import random
import time

from s3torchconnector import S3ClientConfig
from s3torchconnector._s3client import S3Client


def client(endpoint):
    # moto answers at http://127.0.0.1:PORT/BUCKET/KEY: path-style, not BUCKET.host.
    return S3Client(
        os.environ.get("AWS_REGION", "us-east-1"),
        endpoint=endpoint,
        s3client_config=S3ClientConfig(force_path_style=True),
    )


def list_keys(args):
    endpoint, bucket, prefix = args
    keys = []
    for page in client(endpoint).list_objects(bucket, prefix):
        keys += [o.key for o in page.object_info]
    return keys


def read_share(args):
    endpoint, bucket, keys = args
    s3 = client(endpoint)
    n = 0
    for key in keys:
        n += len(s3.get_object(bucket, key).read())
    return n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--join", action="append", default=[], metavar="PROCS",
                   help="a cgroup.procs file to write this process's id into after the imports")
    p.add_argument("bucket")
    p.add_argument("prefix")
    a = p.parse_args()
    for procs in a.join:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    # The CRT client is not fork-safe: the listing's client lives and dies in a child of its
    # own, so that the readers are forked from a process that never had one.
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        keys = pool.apply(list_keys, ((a.endpoint, a.bucket, a.prefix.rstrip("/") + "/"),))
    keys.sort()
    random.Random(a.seed).shuffle(keys)
    shares = [(a.endpoint, a.bucket, keys[i :: a.procs]) for i in range(a.procs)]
    start = time.monotonic()
    with ctx.Pool(a.procs) as pool:
        total = sum(pool.map(read_share, shares))
    print(json.dumps({"seconds": time.monotonic() - start, "bytes": total, "files": len(keys)}))


if __name__ == "__main__":
    main()
