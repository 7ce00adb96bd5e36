#!/usr/bin/env python3
"""The standard PyTorch input pipeline, unchanged, pointed at a directory: per epoch, how
fast it delivers samples and a checksum of everything it read.

    torchvision.datasets.ImageFolder(DIR, loader=..., transform=RandomResizedCrop(224) + ToTensor)
    torch.utils.data.DataLoader(dataset, batch_size=B, shuffle=True, num_workers=N)

The one hook is ImageFolder's documented `loader` argument, which the DataLoader's worker
processes call once per sample: it reads the file's bytes, hashes them with the path
relative to DIR (trainlib.sample_hash), and in --mode decode opens the image from those bytes
the way torchvision's default loader does (PIL, converted to RGB), for the standard
transforms. --mode bytes stops after the hash: no decode and no transforms, so the epoch
measures how fast the files arrive. The hash and the size travel with the sample through
the default collate; trainlib.py explains the checksum.

Prints one line per epoch (--json: one object): samples, bytes, seconds, samples/s, bytes/s,
checksum. Listing the dataset (ImageFolder scans the class folders) opens no file, so every
file open during an epoch is a sample. Run it with .venv/bin/python (scripts/setup-python.sh).

--hinted makes the one-line change of the coorfs package (python/, this checkout's): the
DataLoader samples with coorfs.HintedSampler, which hands each epoch's order to the coorfs
mount DIR before the epoch. Without it, `coorfs run -- .venv/bin/python scripts/train-input.py
DIR` gives the unchanged pipeline the same hints.

--distributed is the pipeline of one rank under torchrun: it joins the process group (gloo),
samples its shard with DistributedSampler(shuffle=True, seed=--seed), calls set_epoch every
epoch, all-reduces after every batch as DDP does after every backward pass (the ranks move in
step, as in training), and reports its own epochs with its rank (the ranks' checksums add up to the dataset's).
--all-files takes every file as a sample, not only images (for datasets such as
make-dataset.py's; --mode bytes only).

    .venv/bin/python scripts/train-input.py --workers 2 --epochs 3 /mnt/train
    .venv/bin/python scripts/train-input.py --mode decode --json /mnt/train
    .venv/bin/python -m torch.distributed.run --nproc-per-node 2 scripts/train-input.py --distributed /mnt/train
"""
import functools
import io
import itertools
import os
import sys

import torch
from PIL import Image
from torchvision import datasets, transforms

import trainlib


def signed64(value):
    """A 64-bit unsigned int as a signed one, which the default collate can put in a tensor."""
    return value - (1 << 64) if value >= 1 << 63 else value


def hashing_loader(root, decode, path):
    """ImageFolder's loader: (hash, size, image or None) of the file at `path`."""
    with open(path, "rb") as f:
        data = f.read()
    digest = trainlib.sample_hash(os.path.relpath(path, root), data)
    image = Image.open(io.BytesIO(data)).convert("RGB") if decode else None
    return signed64(digest), len(data), image


def hash_and_size(sample):
    """The bytes-only transform: keeps the hash and the size, there is no image."""
    return sample[:2]


class OnImage:
    """Applies the standard transforms to the image of a loader's (hash, size, image)."""

    def __init__(self, transform):
        self.transform = transform

    def __call__(self, sample):
        digest, size, image = sample
        return digest, size, self.transform(image)


def synchronized(loader):
    """The batches of one rank, each followed by an all-reduce across the ranks, as DDP's
    gradient all-reduce follows every backward pass: the ranks move in step, a batch apart at
    most, as they do in training (DistributedSampler pads the shards to equal lengths, so every
    rank makes as many calls)."""
    step = torch.zeros(1)
    for sample, _target in loader:
        yield sample[0], sample[1]
        torch.distributed.all_reduce(step)


def main():
    args = trainlib.arguments(__doc__, "DataLoader worker processes (num_workers) [2]", hinted=True, distributed=True)
    torch.manual_seed(args.seed)
    decode = args.mode == "decode"
    root = os.path.abspath(args.dir)
    if decode:
        transform = OnImage(transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()]))
    else:
        transform = hash_and_size
    every_file = (lambda path: True) if args.all_files else None
    dataset = datasets.ImageFolder(root, loader=functools.partial(hashing_loader, root, decode), transform=transform,
                                   is_valid_file=every_file)
    sampler = None
    if args.hinted:
        # This checkout's package, not whatever version the venv may hold: it is what is checked.
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import coorfs

        sampler = coorfs.HintedSampler(dataset, mount=root, strict=True, group=args.group)
    elif args.distributed:
        torch.distributed.init_process_group("gloo")
        args.rank = torch.distributed.get_rank()
        sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=sampler is None,
                                         sampler=sampler, num_workers=args.workers)
    epochs = itertools.count(1)

    def batches():
        if args.distributed:
            sampler.set_epoch(next(epochs))
            return synchronized(loader)
        return ((sample[0], sample[1]) for sample, _target in loader)

    trainlib.run_epochs(args, "pytorch", batches)
    if args.distributed:
        torch.distributed.destroy_process_group()

if __name__ == "__main__":
    main()
