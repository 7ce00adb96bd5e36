"""What the input-pipeline scripts (train-input.py, train-input-tf.py) share: their command
line, the order-independent epoch checksum, and the per-epoch report.

The checksum of an epoch is the sum, modulo 2**64, of a 64-bit hash of every sample read:
hash(path relative to the dataset root, NUL, the file's bytes). A sum does not depend on the
order, so the same dataset read through a mount and from its source gives the same checksum
although each epoch is shuffled, and any changed byte, missing, extra or repeated sample
changes it. Each framework hashes where it reads (PyTorch in its worker processes with
sample_hash, tf.data in its graph with tf.fingerprint).

The hash is built from CRC-32 (zlib), the cheapest checksum in Python's standard library:
the high 32 bits are the CRC of the path, the low 32 bits the CRC of (path, NUL, bytes). A
CRC-32 catches every error burst of up to 32 bits and any other change but one in 2**32,
which is what comparing a mount with its source needs. It takes 25 us for a 110 KiB file
here; SHA-1 (the previous hash, 64 bits of a cryptographic digest) takes 70 us and blake2b
140 us. That is CPU the pipeline's 2 workers spend per sample on this 2-CPU machine, beside
the reading that bytes mode measures: blake2b turned the coorfs side of bench-frameworks.sh
from storage-bound (5.7 s an epoch) into CPU-bound (8 s), and SHA-1 still cost the two workers
1.4 CPU-seconds an epoch of 20,000 files. The checksum is instrumentation: it must not be what
the benchmark measures.
"""
import argparse
import json
import sys
import time
import zlib

MASK = (1 << 64) - 1


def arguments(description, workers_help, hinted=False, distributed=False):
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if hinted:
        p.add_argument("--hinted", action="store_true",
                       help="sample with coorfs.HintedSampler instead of shuffle=True: DIR must "
                            "be a coorfs mount, which gets each epoch's order (a rejected order fails the run)")
        p.add_argument("--group", metavar="NAME",
                       help="with --hinted: the coordinated group of jobs this one reads in step with "
                            "(HintedSampler(group=NAME): the same order every epoch as the group's other jobs)")
    if distributed:
        p.add_argument("--distributed", action="store_true",
                       help="one rank under torchrun: its shard of each epoch (DistributedSampler)")
        p.add_argument("--all-files", action="store_true",
                       help="every file is a sample, not only images (--mode bytes)")
    p.add_argument("dir", help="the dataset root: one folder per class, JPEG files in them")
    p.add_argument("--mode", choices=["bytes", "decode"], default="bytes",
                   help="bytes: read and hash only (fetch-bound); decode: also decode, crop, "
                        "resize to 224x224 (prep-bound) [bytes]")
    p.add_argument("--epochs", type=int, default=3, help="epochs [3]")
    p.add_argument("--workers", type=int, default=2, help=workers_help)
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch [64]")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffles [0]")
    p.add_argument("--json", action="store_true", help="print one JSON object per epoch")
    a = p.parse_args()
    if a.epochs < 1 or a.batch_size < 1 or a.workers < 0:
        p.error("--epochs and --batch-size must be positive, --workers not negative")
    if getattr(a, "group", None) and not a.hinted:
        p.error("--group needs --hinted")
    if getattr(a, "hinted", False) and getattr(a, "distributed", False):
        p.error("--hinted and --distributed do not go together")
    if getattr(a, "all_files", False) and a.mode != "bytes":
        p.error("--all-files needs --mode bytes")
    a.rank = None
    return a


def sample_hash(relative_path, data):
    """The 64-bit hash of one sample: CRC-32 of the path, then CRC-32 of (path, NUL, bytes)."""
    path = relative_path.encode()
    head = zlib.crc32(path)
    return head << 32 | zlib.crc32(data, zlib.crc32(b"\0", head))


def fold(checksum, hashes):
    """Adds 64-bit hashes (signed or unsigned ints) to a running checksum, modulo 2**64."""
    return (checksum + sum(int(h) & MASK for h in hashes)) & MASK


def run_epochs(args, framework, batches):
    """Runs and reports args.epochs epochs. `batches()` starts a fresh pass of the pipeline,
    yielding per batch the samples' hashes and sizes (arrays or tensors); an epoch's time runs
    from that start (for PyTorch, the forking of the workers) to its last batch."""
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        samples = nbytes = checksum = 0
        for digests, sizes in batches():
            samples += len(digests)
            nbytes += int(sizes.sum())
            checksum = fold(checksum, digests.tolist())
        report(args, framework, epoch, samples, nbytes, time.perf_counter() - start, checksum)


def report(args, framework, epoch, samples, nbytes, seconds, checksum):
    """Prints one epoch's line (or JSON object) and flushes, so a caller sees it at once."""
    seconds = max(seconds, 1e-9)
    row = {
        "framework": framework,
        "mode": args.mode,
        "epoch": epoch,
        "samples": samples,
        "bytes": nbytes,
        "seconds": round(seconds, 4),
        "samples_per_s": round(samples / seconds, 1),
        "bytes_per_s": round(nbytes / seconds),
        "checksum": f"{checksum:016x}",
    }
    if args.rank is not None:
        row["rank"] = args.rank
    if args.json:
        print(json.dumps(row))
    else:
        rank = "" if args.rank is None else f" rank {args.rank}"
        print(f"{framework} {args.mode}{rank} epoch {epoch}: {samples} samples, {nbytes / 2**20:.1f} MiB "
              f"in {seconds:.2f} s: {row['samples_per_s']:.0f} samples/s, "
              f"{nbytes / seconds / 2**20:.1f} MiB/s, checksum {row['checksum']}")
    sys.stdout.flush()
