#!/usr/bin/env python3
"""A PyTorch DataLoader's access pattern with the standard library only, for tests/it/frameworks.rs
(CI has python3 but no pip packages; scripts/check-frameworks.sh runs the real libraries).

What torch.utils.data.DataLoader(ImageFolder(DIR), shuffle=True, num_workers=N) does to the
file system, every epoch:
- the parent lists DIR (class folders, sorted file names) without opening a file, once;
- it draws a fresh random permutation of the samples, cuts it into batches of
  --batch-size, and forks N worker processes (os.fork: they share its process group, like
  DataLoader's workers); batch k goes to worker k mod N, over the worker's index pipe, at
  most 2 batches ahead of what the parent has consumed from that worker (prefetch_factor=2),
  and the parent consumes the batches in order, as DataLoader does;
- a worker opens each file of its batch and reads it whole, and sends back what it read:
  here the index, a 64-bit hash of (path relative to DIR, NUL, bytes) and the size,
  over its result pipe;
- the parent checks that every sample came back exactly once and folds the hashes into an
  order-independent checksum (sum mod 2**64), as scripts/trainlib.py does.

Variations that real jobs have, each of which must not confuse a file system that counts a
job's epochs (tests/it/frameworks.rs):
- --double-open: every sample is opened and read twice in a row, as a dataset whose
  __getitem__ checks a file (open(p).read()) and then decodes it (PIL.Image.open(p)) does;
- --shared: every batch is loaded by two workers at about the same time (pairs of workers:
  a file shared by two workers); --workers must be even;
- --shard R/K: the job is rank R of K under DistributedSampler(shuffle=True, seed=--seed):
  every epoch a permutation of all samples seeded with seed + epoch, the same for every rank,
  padded to a multiple of K with its first samples, of which rank R takes every K-th from R;
  the job reads a different 1/K of the dataset every epoch;
- --stop E:F: in epoch E the training loop breaks out after the first fraction F of its
  batches (workers shut down), and the next epoch starts at once with a fresh permutation;
- --hint MOUNT: before each epoch the parent hands its order to the coorfs mount (as
  coorfs.HintedSampler does), so jobs with the same --seed are a coordinated group;
- --delay S: a worker spends S seconds on each sample after reading it (a slower model).

Prints one JSON object per epoch: epoch, samples (distinct samples read), bytes (their
sizes), checksum (16 hex digits), seconds, and with --list the sorted relative paths read.
Exits non-zero if a worker fails or a sample is missing or read more often than it should.

    python3 tests/dataloader_pattern.py --workers 4 --epochs 3 --seed 7 /mnt/train
"""
import argparse
import hashlib
import json
import os
import random
import sys
import time
import traceback

# The coorfs package of this checkout (standard library only), for the order hint's protocol.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from coorfs.order import send_hint  # noqa: E402

MASK = (1 << 64) - 1


def list_samples(root):
    """ImageFolder's listing: class folders, then the files below each, sorted; no opens."""
    samples = []
    for cls in sorted(e.name for e in os.scandir(root) if e.is_dir()):
        for d, _, names in sorted(os.walk(os.path.join(root, cls))):
            samples += [os.path.join(d, n) for n in sorted(names)]
    return samples


def read_whole(path):
    with open(path, "rb") as f:
        return f.read()


def load(root, path, double_open):
    """What a worker does with one sample: read it whole (twice with double_open, which must
    give the same bytes) and hash it with its relative path."""
    data = read_whole(path)
    if double_open and read_whole(path) != data:
        raise RuntimeError(f"{path}: the second open read other bytes")
    h = hashlib.sha1(os.path.relpath(path, root).encode())  # SHA-1: cheap with SHA instructions
    h.update(b"\0")
    h.update(data)
    return int.from_bytes(h.digest()[:8], "little"), len(data)


def worker(root, samples, index_fd, result_fd, double_open, delay):
    """A forked worker: for every batch (a JSON list of indices, one a line) on its index pipe,
    loads it (and sleeps `delay` seconds a sample: a slow model) and writes
    [[index, hash, size], ...] as one line to its result pipe."""
    with os.fdopen(index_fd) as batches, os.fdopen(result_fd, "w") as out:
        for line in batches:
            loaded = []
            for i in json.loads(line):
                loaded.append([i, *load(root, samples[i], double_open)])
                if delay:
                    time.sleep(delay)
            out.write(json.dumps(loaded) + "\n")
            out.flush()


def owners(k, workers, shared):
    """The workers that load batch k: round robin, or with `shared` round robin over pairs of
    workers that both load each batch of their pair (a file shared by two workers)."""
    if not shared:
        return [k % workers]
    pair = k % (workers // 2)
    return [2 * pair, 2 * pair + 1]


PREFETCH_FACTOR = 2  # DataLoader's default: batches a worker may have been given ahead


def epoch(root, samples, order, workers, batch_size, double_open, shared, delay=0.0):
    """One epoch through `workers` forked processes; returns (samples, bytes, checksum)."""
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    children = []
    for _ in range(workers):
        index_r, index_w = os.pipe()
        result_r, result_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            for fd in (index_w, result_r, *(fd for c in children for fd in c[1:])):
                os.close(fd)
            code = 1
            try:
                worker(root, samples, index_r, result_w, double_open, delay)
                code = 0
            except BaseException:
                traceback.print_exc()  # why it died, before the exit below hides it
            finally:
                os._exit(code)  # never run the parent's cleanup in a child
        os.close(index_r)
        os.close(result_w)
        children.append((pid, index_w, result_r))
    to_worker = [os.fdopen(c[1], "w") for c in children]
    from_worker = [os.fdopen(c[2]) for c in children]

    def send(k):
        for w in owners(k, workers, shared):
            to_worker[w].write(json.dumps(batches[k]) + "\n")
            to_worker[w].flush()

    groups = workers // 2 if shared else workers
    sent = min(len(batches), PREFETCH_FACTOR * groups)
    for k in range(sent):
        send(k)
    copies = 2 if shared else 1
    seen = {}
    for k in range(len(batches)):
        for w in owners(k, workers, shared):
            line = from_worker[w].readline()
            if not line:
                sys.exit(f"dataloader_pattern.py: worker {children[w][0]} died")
            for index, digest, size in json.loads(line):
                seen.setdefault(index, []).append((digest, size))
        if sent < len(batches):
            send(sent)
            sent += 1
    for f in to_worker:
        f.close()
    for (pid, _, _), f in zip(children, from_worker):
        f.close()
        _, status = os.waitpid(pid, 0)
        if status != 0:
            sys.exit(f"dataloader_pattern.py: worker {pid} failed (status {status})")
    wrong = [samples[i] for i in order if len(seen.get(i, [])) != copies or len(set(seen[i])) != 1]
    if wrong or len(seen) != len(set(order)):
        what = wrong[0] if wrong else "a sample not in the order"
        sys.exit(f"dataloader_pattern.py: samples not read exactly {copies}x alike, e.g. {what}")
    nbytes = sum(seen[i][0][1] for i in seen)
    checksum = sum(seen[i][0][0] for i in seen) & MASK
    return len(seen), nbytes, checksum


def shard_order(n, epoch, seed, rank, replicas):
    """DistributedSampler(shuffle=True, drop_last=False)'s indices for `rank` in `epoch`."""
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    total = -(-n // replicas) * replicas
    order += order[: total - n]
    return order[rank:total:replicas]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--workers", type=int, default=2, help="worker processes [2]")
    p.add_argument("--epochs", type=int, default=3, help="epochs [3]")
    p.add_argument("--batch-size", type=int, default=16, help="samples per batch [16]")
    p.add_argument("--seed", type=int, default=0, help="seed of the permutations [0]")
    p.add_argument("--double-open", action="store_true", help="open and read every sample twice")
    p.add_argument("--shared", action="store_true", help="two workers load every batch")
    p.add_argument("--shard", metavar="R/K", help="read rank R's shard of K, a new one every epoch")
    p.add_argument("--stop", metavar="E:F", help="break out of epoch E after fraction F of it")
    p.add_argument("--list", action="store_true", help="print the paths each epoch read")
    p.add_argument("--hint", metavar="MOUNT", help="hand each epoch's order to the coorfs mount MOUNT first")
    p.add_argument("--delay", type=float, default=0.0, help="seconds a worker spends on each sample [0]")
    a = p.parse_args()
    if a.workers < 1 or a.epochs < 1 or a.batch_size < 1:
        p.error("--workers, --epochs and --batch-size must be positive")
    if a.shared and a.workers % 2:
        p.error("--shared needs an even number of workers")
    rank = replicas = None
    if a.shard:
        rank, replicas = (int(x) for x in a.shard.split("/"))
        if not 0 <= rank < replicas:
            p.error("--shard R/K needs 0 <= R < K")
    stop_epoch, stop_at = None, 1.0
    if a.stop:
        e, f = a.stop.split(":")
        stop_epoch, stop_at = int(e), float(f)
    root = os.path.abspath(a.dir)
    samples = list_samples(root)
    rng = random.Random(a.seed)
    for e in range(1, a.epochs + 1):
        if a.shard:
            order = shard_order(len(samples), e, a.seed, rank, replicas)
        else:
            order = list(range(len(samples)))
            rng.shuffle(order)
        if e == stop_epoch:
            batches = -(-len(order) // a.batch_size)
            order = order[: round(batches * stop_at) * a.batch_size]
        if a.hint:
            mount = os.path.abspath(a.hint)
            send_hint(mount, "".join(os.path.relpath(samples[i], mount) + "\n" for i in order).encode())
        start = time.perf_counter()
        n, nbytes, checksum = epoch(root, samples, order, a.workers, a.batch_size, a.double_open, a.shared, a.delay)
        seconds = time.perf_counter() - start
        report = {"epoch": e, "samples": n, "bytes": nbytes, "checksum": f"{checksum:016x}",
                  "seconds": round(seconds, 4)}
        if a.list:
            report["files"] = sorted(os.path.relpath(samples[i], root) for i in set(order))
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
