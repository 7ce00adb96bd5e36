#!/usr/bin/env python3
"""A training job's input loop, for the tests of `coorfs run` (python/tests/test_run.py,
tests/it/run.rs): torch.utils.data, the real one or python/tests/faketorch on PYTHONPATH, over a
folder of class folders, with the sampler and the kind of dataset chosen on the command line.

Prints one JSON line per epoch with what the job saw: its samples (paths relative to DIR) in the
order its batches came, a checksum of (path, bytes) of every sample, and the random numbers its dataset drew (in the
workers, or in the main process with --workers 0); then one line with a number drawn from the
main process's generator after the last epoch. The same job with and without `coorfs run` must
print the same lines. --show-order adds what DIR/.coorfs-order holds after each epoch (for a
plain directory standing in for a mount).

    run_job.py --sampler shuffle --dataset samples --workers 2 --epochs 3 --seed 7 DIR
"""
import argparse
import json
import os
import zlib

import torch
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Subset,
    SubsetRandomSampler,
    WeightedRandomSampler,
)


def listing(root, classes=None):
    """ImageFolder's listing: (path, class) of every file of the class folders, sorted."""
    names = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for c, name in enumerate(names):
        if classes is None or c in classes:
            folder = os.path.join(root, name)
            samples += [(os.path.join(folder, f), c) for f in sorted(os.listdir(folder))]
    return samples


class Folder:
    """A map-style dataset of files; `kind` says how it tells its paths (see --dataset)."""

    def __init__(self, root, kind="samples", classes=None):
        self.root = root
        self._samples = listing(root, classes)
        paths = [p for p, _ in self._samples]
        if kind == "samples":
            self.samples = self._samples
        elif kind == "imgs":
            self.imgs = self._samples
        elif kind == "coorfs_paths":
            self.coorfs_paths = paths
        elif kind == "method":
            self.coorfs_paths = lambda: paths

    def __len__(self):
        return len(self._samples)

    def __getitem__(self, i):
        path = self._samples[i][0]
        with open(path, "rb") as f:
            data = f.read()
        relative = os.path.relpath(path, self.root)
        return relative, zlib.crc32(data, zlib.crc32(relative.encode() + b"\0")), torch.rand(1).item()


class Broken(Folder):
    """Its `samples` fails: the hook must not pass that on."""

    @property
    def samples(self):
        raise RuntimeError("samples of a broken dataset")


class Stream(IterableDataset):
    def __init__(self, root):
        self.folder = Folder(root)

    def __iter__(self):
        return (self.folder[i] for i in range(len(self.folder)))


class Reversed:
    """A sampler coorfs run does not know."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n


class OwnHints(RandomSampler):
    """A sampler that hints by itself, as coorfs.HintedSampler: coorfs run leaves it alone."""

    coorfs_hints = True


def keep(batch):
    """The collate function: the samples as they are, in a real and a fake torch alike."""
    return list(batch)


def dataset_of(kind, root):
    if kind == "subset":
        whole = Folder(root)
        return Subset(whole, list(range(len(whole) - 1, -1, -2)))
    if kind == "concat":
        return ConcatDataset([Folder(root, classes={0, 1}), Folder(root, classes={2, 3})])
    if kind == "broken":
        return Broken(root, kind="none")
    if kind == "stream":
        return Stream(root)
    return Folder(root, kind)


def loader_of(a, dataset):
    common = dict(num_workers=a.workers, collate_fn=keep, persistent_workers=a.persistent and a.workers > 0)
    n = len(dataset) if not isinstance(dataset, IterableDataset) else 0
    if a.sampler == "shuffle":
        return DataLoader(dataset, batch_size=a.batch_size, shuffle=not isinstance(dataset, IterableDataset), **common)
    if a.sampler == "sequential":
        return DataLoader(dataset, batch_size=a.batch_size, **common)
    if a.sampler == "subset":
        return DataLoader(dataset, batch_size=a.batch_size, sampler=SubsetRandomSampler(list(range(0, n, 3))), **common)
    if a.sampler == "weighted":
        weights = [1.0 + i % 3 for i in range(n)]
        sampler = WeightedRandomSampler(weights, n)
        return DataLoader(dataset, batch_size=a.batch_size, sampler=sampler, **common)
    if a.sampler == "distributed":
        rank, replicas = (int(x) for x in a.rank.split("/"))
        sampler = DistributedSampler(dataset, num_replicas=replicas, rank=rank, shuffle=True, seed=a.seed)
        return DataLoader(dataset, batch_size=a.batch_size, sampler=sampler, **common)
    if a.sampler == "own":
        return DataLoader(dataset, batch_size=a.batch_size, sampler=OwnHints(dataset), **common)
    if a.sampler == "batch":
        batches = BatchSampler(RandomSampler(dataset), a.batch_size, drop_last=True)
        return DataLoader(dataset, batch_sampler=batches, **common)
    return DataLoader(dataset, batch_size=a.batch_size, sampler=Reversed(n), **common)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--sampler", default="shuffle",
                   choices=["shuffle", "sequential", "subset", "weighted", "distributed", "batch", "own", "custom"])
    p.add_argument("--dataset", default="samples",
                   choices=["samples", "imgs", "coorfs_paths", "method", "subset", "concat", "none", "broken",
                            "stream"])
    p.add_argument("--rank", default="0/2", help="R/K: rank R of K, for --sampler distributed [0/2]")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--persistent", action="store_true", help="persistent_workers=True")
    p.add_argument("--show-order", action="store_true", help="print DIR/.coorfs-order after each epoch")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    root = os.path.abspath(a.dir)
    loader = loader_of(a, dataset_of(a.dataset, root))
    for epoch in range(1, a.epochs + 1):
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        samples, draws, checksum = [], [], 0
        for batch in loader:
            for relative, digest, draw in batch:
                samples.append(relative)
                draws.append(draw)
                checksum = (checksum + int(digest)) % (1 << 64)
        report = {"epoch": epoch, "samples": samples, "checksum": checksum, "draws": draws}
        if a.show_order:
            try:
                with open(os.path.join(root, ".coorfs-order")) as f:
                    report["order"] = f.read().split("\n")[:-1]
            except OSError:  # none, or not a file
                report["order"] = None
        print(json.dumps(report), flush=True)
    print(json.dumps({"after": torch.rand(1).item()}), flush=True)


if __name__ == "__main__":
    main()
