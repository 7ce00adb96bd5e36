"""coorfs_torch: hand each epoch's sample order to a coorfs mount, so that its prefetcher
fetches exactly the files the job will read next, in that order.

A one-line change in a PyTorch training script:

    import coorfs_torch
    sampler = coorfs_torch.HintedSampler(dataset, mount="/mnt/train")
    loader = DataLoader(dataset, batch_size=256, sampler=sampler, num_workers=8)

`HintedSampler` draws a fresh permutation every epoch (like `RandomSampler`), writes the paths
of the samples in that order to MOUNT/.coorfs-order, and yields the indices. It runs in the
main process when the DataLoader starts an epoch, and the workers, in the same process group,
are the same coorfs job. A hint that coorfs rejects (a path outside the mount, a file missing
from it) raises nothing by default: training goes on without it, with a warning.

Without torch installed the module still imports; `write_order`, `sample_paths` and
`HintedOrder` work on plain Python sequences (and are what the tests exercise).
"""

import os
import random
import warnings

ORDER_FILE = ".coorfs-order"

try:  # torch is optional: the hint protocol itself needs only the standard library.
    import torch
    from torch.utils.data import Sampler as _Sampler
except ImportError:  # pragma: no cover - depends on the environment
    torch = None
    _Sampler = object


def sample_paths(dataset):
    """The file path of every sample of `dataset`, by index.

    Knows torchvision's ImageFolder/DatasetFolder (`samples`), datasets with `imgs`, `paths`
    or `files`, and plain sequences of paths.
    """
    for attr in ("samples", "imgs"):
        items = getattr(dataset, attr, None)
        if items is not None:
            return [item[0] if isinstance(item, (tuple, list)) else item for item in items]
    for attr in ("paths", "files"):
        items = getattr(dataset, attr, None)
        if items is not None:
            return list(items)
    if isinstance(dataset, (list, tuple)) and all(isinstance(p, (str, os.PathLike)) for p in dataset):
        return list(dataset)
    raise TypeError(
        "coorfs_torch: cannot tell the file of each sample of %r; pass paths=[...]" % type(dataset).__name__
    )


def write_order(mount, paths):
    """Tells the coorfs mount at `mount` that this job reads `paths` next, in this order.

    Paths may be absolute (below `mount`) or relative to it. Raises OSError with coorfs's
    errno if it rejects the hint (ENOENT: a path that is no file of the mount; EINVAL: garbage
    or nothing; EFBIG: too large), ValueError for a path outside the mount.
    """
    mount = os.fspath(mount)
    lines = []
    for p in paths:
        p = os.fspath(p)
        rel = os.path.relpath(p, mount) if os.path.isabs(p) else p
        if rel == ".." or rel.startswith(".." + os.sep):
            raise ValueError("coorfs_torch: %s is not below the mount %s" % (p, mount))
        lines.append(rel)
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")
    # The verdict comes at close(): a rejected hint raises OSError here.
    with open(os.path.join(mount, ORDER_FILE), "wb") as f:
        f.write(data)


class HintedOrder:
    """Per-epoch random orders over `paths`, each handed to the mount before it is used.

    The torch-free core of HintedSampler: `next_epoch()` returns the indices of the coming
    epoch after writing their paths to the mount.
    """

    def __init__(self, paths, mount, seed=None, strict=False):
        self.paths = list(paths)
        self.mount = os.fspath(mount)
        self.strict = strict
        self._rng = random.Random(seed)

    def hint(self, order):
        try:
            write_order(self.mount, [self.paths[i] for i in order])
            return True
        except (OSError, ValueError) as e:
            if self.strict:
                raise
            warnings.warn("coorfs: the order hint was not taken (%s); reading without it" % e)
            return False

    def next_epoch(self):
        order = list(range(len(self.paths)))
        self._rng.shuffle(order)
        self.hint(order)
        return order


class HintedSampler(_Sampler):
    """A RandomSampler that tells coorfs each epoch's order (see the module docstring).

    Arguments: the dataset; `mount`, the coorfs mount point the dataset's files are under;
    `paths`, the file of each sample if `sample_paths` cannot tell; `generator`, a
    torch.Generator for the permutations; `strict`, to raise instead of warn when coorfs
    rejects a hint.
    """

    def __init__(self, data_source, mount, paths=None, generator=None, strict=False):
        if torch is None:
            raise ImportError("coorfs_torch.HintedSampler needs torch; HintedOrder does not")
        self.data_source = data_source
        self.generator = generator
        self._order = HintedOrder(paths if paths is not None else sample_paths(data_source), mount, strict=strict)
        if len(self._order.paths) != len(data_source):
            raise ValueError(
                "coorfs_torch: %d paths for %d samples" % (len(self._order.paths), len(data_source))
            )

    def __len__(self):
        return len(self.data_source)

    def __iter__(self):
        generator = self.generator
        if generator is None:
            generator = torch.Generator()
            generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        order = torch.randperm(len(self.data_source), generator=generator).tolist()
        self._order.hint(order)
        yield from order
