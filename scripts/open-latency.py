#!/usr/bin/env python3
"""What each call of reading a file whole costs, file by file: open, fstat, ioctl(TCGETS)
(Python's open() asks isatty of every file it opens), read to the end, close. One process,
one file at a time, in a random order of the seed, so each figure is a latency, not a share
of a throughput.

Prints one JSON object: files, and per call its median and mean in microseconds, and "whole"
(the five together). With --trace (root, a kernel with the fuse tracepoints, 6.16+) it also
records every FUSE request sent while it runs (tracefs) and gives, per opcode, the count and
the median and mean microseconds from the request's send to its end.

    python3 scripts/open-latency.py /mnt/train
    python3 scripts/open-latency.py --files 5000 --seed 3 --trace /mnt/train
"""
import argparse
import fcntl
import json
import os
import random
import statistics
import sys
import termios
import time

TRACEFS = "/sys/kernel/tracing"
CALLS = ("open", "fstat", "ioctl", "read", "close")


def files_below(root):
    out = []
    for d, _, names in os.walk(root):
        out.extend(os.path.join(d, n) for n in names if not n.startswith("."))
    return sorted(out)


def read_whole(path, buf):
    """The five calls on `path`, each timed; returns their seconds."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    t1 = time.perf_counter()
    os.fstat(fd)
    t2 = time.perf_counter()
    try:
        fcntl.ioctl(fd, termios.TCGETS, bytes(64))
    except OSError:
        pass  # not a terminal: the answer every file gets
    t3 = time.perf_counter()
    while os.readv(fd, [buf]):
        pass
    t4 = time.perf_counter()
    os.close(fd)
    t5 = time.perf_counter()
    return (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)


class FuseTrace:
    """The kernel's fuse_request_send/end events while it is on, read back per opcode."""

    def __init__(self):
        self.events = os.path.join(TRACEFS, "events", "fuse")
        if not os.path.isdir(self.events):
            raise SystemExit(f"open-latency.py: --trace needs {self.events} (Linux 6.16+, root)")

    def write(self, name, value):
        with open(os.path.join(TRACEFS, name), "w") as f:
            f.write(value)

    def __enter__(self):
        self.write("trace", "")
        self.write("buffer_size_kb", "65536")
        self.write("events/fuse/enable", "1")
        return self

    def __exit__(self, *exc):
        self.write("events/fuse/enable", "0")

    def latencies(self):
        sent, took = {}, {}
        with open(os.path.join(TRACEFS, "trace")) as f:
            for line in f:
                if "fuse_request_" not in line:
                    continue
                head, _, tail = line.partition("fuse_request_")
                at = float(head.split()[-1].rstrip(":"))
                words = tail.split()
                unique = words[words.index("req") + 1]
                if words[0] == "send:":
                    sent[unique] = (at, words[words.index("opcode") + 2].strip("()"))
                elif unique in sent:
                    start, op = sent.pop(unique)
                    took.setdefault(op.removeprefix("FUSE_"), []).append((at - start) * 1e6)
        self.write("trace", "")
        return {
            op: {"count": len(v), "median_us": round(statistics.median(v), 1),
                 "mean_us": round(statistics.fmean(v), 1)}
            for op, v in sorted(took.items())
        }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("--files", type=int, default=4000, help="files to read (default 4000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", action="store_true", help="per-opcode FUSE latencies (root)")
    args = p.parse_args()
    paths = files_below(args.dir)
    if not paths:
        raise SystemExit(f"open-latency.py: no files below {args.dir}")
    random.Random(args.seed).shuffle(paths)
    paths = paths[: args.files]
    buf = bytearray(1 << 20)
    trace = FuseTrace() if args.trace else None
    if trace:
        trace.__enter__()
    try:
        times = [read_whole(path, buf) for path in paths]
    finally:
        if trace:
            trace.__exit__()
    out = {"files": len(paths)}
    for i, call in enumerate(CALLS + ("whole",)):
        v = [sum(t) if call == "whole" else t[i] for t in times]
        out[call] = {"median_us": round(statistics.median(v) * 1e6, 1),
                     "mean_us": round(statistics.fmean(v) * 1e6, 1)}
    if trace:
        out["fuse"] = trace.latencies()
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
