#!/usr/bin/env python3
"""The plain reader of bench-s3.sh: every object beneath s3://BUCKET/PREFIX once, whole, in a
random order (seeded), split across --procs processes, each with its own boto3 client that
reads its share one object after another (a DataLoader's workers reading S3 directly), each
streamed in 1 MiB chunks, as a shard reader streams a shard (a 1 GiB shard read whole into
memory would not fit the benchmark's pod).
Prints {"seconds": ..., "bytes": ...}; the listing is taken before the clock starts.

    s3-read.py --endpoint http://127.0.0.1:9000 --procs 2 --seed 7 BUCKET PREFIX

Credentials and region come from the environment (AWS_ACCESS_KEY_ID, ...)."""
import argparse
import json
import multiprocessing
import random
import time

import boto3


def client(endpoint):
    return boto3.client("s3", endpoint_url=endpoint)


def read_share(args):
    endpoint, bucket, keys = args
    s3 = client(endpoint)
    n = 0
    for key in keys:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        for chunk in body.iter_chunks(1 << 20):
            n += len(chunk)
    return n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("bucket")
    p.add_argument("prefix")
    a = p.parse_args()
    keys = []
    pages = client(a.endpoint).get_paginator("list_objects_v2")
    for page in pages.paginate(Bucket=a.bucket, Prefix=a.prefix.rstrip("/") + "/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    random.Random(a.seed).shuffle(keys)
    shares = [(a.endpoint, a.bucket, keys[i :: a.procs]) for i in range(a.procs)]
    start = time.monotonic()
    with multiprocessing.Pool(a.procs) as pool:
        total = sum(pool.map(read_share, shares))
    print(json.dumps({"seconds": time.monotonic() - start, "bytes": total, "files": len(keys)}))


if __name__ == "__main__":
    main()
