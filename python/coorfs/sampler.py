"""HintedSampler: PyTorch's RandomSampler, telling a coorfs mount each epoch's order.

It draws a fresh permutation every epoch (like `RandomSampler`), writes the paths of the
samples in that order to the mount (`coorfs.write_order`), and yields the indices. It runs in
the main process when the DataLoader starts an epoch, and the workers, in the same process
group, are the same coorfs job. A hint that coorfs rejects (a path outside the mount, a file
missing from it) raises nothing by default: training goes on without it, with a warning.
"""

try:
    import torch
    from torch.utils.data import Sampler
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "coorfs.HintedSampler needs torch (pip install torch); coorfs.HintedOrder does not"
    ) from e

from .order import HintedOrder, group_seed, sample_paths


class HintedSampler(Sampler):
    """A RandomSampler that tells coorfs each epoch's order (see the module docstring).

    Arguments: the dataset; `mount`, the coorfs mount point the dataset's files are under;
    `paths`, the file of each sample if `coorfs.sample_paths` cannot tell; `generator`, a
    torch.Generator for the permutations; `strict`, to raise instead of warn when coorfs
    rejects a hint; `group`, a name shared by jobs that should read in one order (a
    hyper-parameter search over one dataset): every job of the group draws the same
    permutation each epoch, so the mount reads each uncached file once for all of them.
    """

    # It hands each epoch's order to the mount itself: `coorfs run` leaves it alone.
    coorfs_hints = True

    def __init__(self, data_source, mount, paths=None, generator=None, strict=False, group=None):
        self.data_source = data_source
        if group is not None:
            if generator is not None:
                raise ValueError("coorfs: give a group or a generator, not both")
            generator = torch.Generator()
            generator.manual_seed(group_seed(group))
        self.generator = generator
        self._order = HintedOrder(paths if paths is not None else sample_paths(data_source), mount, strict=strict)
        if len(self._order.paths) != len(data_source):
            raise ValueError("coorfs: %d paths for %d samples" % (len(self._order.paths), len(data_source)))

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
