#!/usr/bin/env python3
"""Generate an ImageFolder-style dataset of real JPEG files, like ImageNet's training set.

    DIR/n00000000/n00000000_0000000.JPEG ... DIR/n00000099/n00000099_0019999.JPEG

File i goes to class i % --classes. Each image is a real, decodable RGB JPEG (quality 90,
4:2:0, what Pillow writes by default) whose size is drawn around --size from a log-normal
spread (ImageNet's training JPEGs average about 110 KiB with a long tail): its content is
smooth colour fields plus fine noise, its dimensions are chosen so that the encoded file
comes out near its drawn size (around 500x400 for 110 KiB). Everything derives from
--seed and the file's index, so a dataset is the same byte for byte on every machine with
the same Pillow (scripts/setup-python.sh pins it), however many --jobs generate it.

Needs Pillow: run it with .venv/bin/python (scripts/setup-python.sh). Files that exist are
kept, so re-running is cheap; a few of them are regenerated and compared first, and a DIR
made with other parameters is refused rather than mixed.

    .venv/bin/python scripts/make-imagefolder.py --files 20000 --classes 100 /var/tmp/imagenet-like
"""
import argparse
import io
import math
import multiprocessing
import os
import random
import sys

from PIL import Image

from units import size

QUALITY = 90  # a common quality for photo datasets; ImageNet's JPEGs are mostly 75-95
# Encoded bytes per pixel at QUALITY ~ BPP_BASE + BPP_NOISE * noise weight, fitted on this
# generator's images (the smooth fields cost BPP_BASE, the noise the rest); the first guess
# of the dimensions uses it, and one rescale corrects what it misses.
BPP_BASE, BPP_NOISE = 0.176, 1.32
SPREAD = 0.3  # sigma of the log-normal size spread: most files within 0.55x-1.8x of --size
TOLERANCE = 0.05  # an image this close to its drawn size is kept, else rescaled once


def rel_path(i, classes):
    c = f"n{i % classes:08d}"
    return os.path.join(c, f"{c}_{i:07d}.JPEG")


def encode(rng_seed, w, h, noise):
    """The JPEG bytes of one image: two layers of smooth colour fields and pixel noise."""
    rng = random.Random(rng_seed)
    coarse = Image.frombytes("RGB", (4, 3), rng.randbytes(4 * 3 * 3))
    fine = Image.frombytes("RGB", (32, 24), rng.randbytes(32 * 24 * 3))
    img = Image.blend(coarse.resize((w, h), Image.BICUBIC), fine.resize((w, h), Image.BICUBIC), 0.35)
    img = Image.blend(img, Image.frombytes("RGB", (w, h), rng.randbytes(w * h * 3)), noise)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=QUALITY)
    return out.getvalue()


def image(seed, i, mean_size):
    """The bytes of file i: deterministic from (seed, i)."""
    rng = random.Random(f"{seed}:{i}")
    # Log-normal around the mean (divided by its own mean factor so that the average stays
    # at mean_size), clipped so that no file is absurdly small or large.
    target = mean_size * math.exp(rng.gauss(0, SPREAD) - SPREAD**2 / 2)
    target = min(max(target, mean_size * 0.25), mean_size * 4)
    aspect = rng.choice([4 / 3, 4 / 3, 3 / 2, 1.0, 3 / 4])  # landscape mostly, like photos
    noise = rng.uniform(0.15, 0.35)
    content = rng.getrandbits(64)
    area = target / (BPP_BASE + BPP_NOISE * noise)
    scale = 1.0
    for _ in range(2):
        w = max(16, round(math.sqrt(area * aspect) * scale))
        h = max(16, round(w / aspect))
        data = encode(content, w, h, noise)
        if abs(len(data) / target - 1) <= TOLERANCE:
            break
        scale *= math.sqrt(target / len(data))  # bytes scale with the area
    return data


def write(args):
    """Writes files [start, stop) that are missing; returns their total size."""
    root, seed, mean_size, classes, start, stop = args
    total = 0
    for i in range(start, stop):
        path = os.path.join(root, rel_path(i, classes))
        try:
            total += os.path.getsize(path)
            continue
        except FileNotFoundError:
            pass
        data = image(seed, i, mean_size)
        tmp = f"{path}.tmp{os.getpid()}"  # never a half-written file under the final name
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, path)
        total += len(data)
    return total


def existing_files(root):
    found = []
    if os.path.isdir(root):
        for d, _, files in os.walk(root):
            found += [os.path.relpath(os.path.join(d, f), root) for f in files]
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="where to write the dataset (created if missing)")
    p.add_argument("--files", type=int, default=2000, help="number of images [2000]")
    p.add_argument("--size", type=size, default=110 << 10, help="mean file size, e.g. 110K [110K]")
    p.add_argument("--classes", type=int, default=10, help="class folders [10]")
    p.add_argument("--seed", type=int, default=0, help="random seed [0]")
    p.add_argument("--jobs", type=int, default=os.cpu_count(), help="worker processes [one per CPU]")
    a = p.parse_args()
    if a.files < 1 or a.classes < 1 or a.size < 1024 or a.jobs < 1:
        sys.exit("make-imagefolder.py: --files, --classes and --jobs must be positive, --size at least 1K")

    want = {rel_path(i, a.classes) for i in range(a.files)}
    have = existing_files(a.dir)
    stray = [f for f in have if f not in want]
    if stray:
        sys.exit(f"make-imagefolder.py: {a.dir} holds {len(stray)} files this dataset does not "
                 f"(e.g. {stray[0]}): remove it or choose another directory")
    # Files that exist must be what these parameters make: check the first and the last.
    for i in sorted({0, a.files - 1}):
        path = os.path.join(a.dir, rel_path(i, a.classes))
        if os.path.exists(path):
            with open(path, "rb") as f:
                if f.read() != image(a.seed, i, a.size):
                    sys.exit(f"make-imagefolder.py: {path} was made with other parameters "
                             "(--seed, --size, or another Pillow): remove the directory or choose another")

    for c in range(min(a.classes, a.files)):
        os.makedirs(os.path.join(a.dir, f"n{c:08d}"), exist_ok=True)
    chunk = 100  # files per task: small enough to balance the workers, big enough to be cheap
    tasks = [(a.dir, a.seed, a.size, a.classes, s, min(s + chunk, a.files)) for s in range(0, a.files, chunk)]
    with multiprocessing.Pool(a.jobs) as pool:
        total = sum(pool.imap_unordered(write, tasks))
    made = a.files - len(have)
    print(f"{a.files} JPEG files ({made} new), {total / (1 << 20):.1f} MiB, mean "
          f"{total / a.files / 1024:.1f} KiB, in {a.classes} classes in {a.dir}")


if __name__ == "__main__":
    main()
