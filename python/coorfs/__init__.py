"""coorfs: the Python side of a coorfs mount (a FUSE view of a training dataset).

Two things a training job may want from the mount, with the standard library only:

- **Order hints.** Each epoch's sample order handed to the mount before the epoch, so that its
  prefetcher fetches exactly the files the job reads next, in that order. For PyTorch, a
  one-line change:

      import coorfs
      sampler = coorfs.HintedSampler(dataset, mount="/mnt/train")   # instead of shuffle=True
      loader = DataLoader(dataset, batch_size=256, sampler=sampler, num_workers=8)

  Without torch, `HintedOrder` and `write_order` do the same on plain lists of paths, and
  `send_hint` hands over a hint already written out (bytes, one path per line).
- **Statistics.** `coorfs.read_stats("/mnt/train")` returns the mount's statistics as a dict
  (the `user.coorfs.stats` attribute, the document `coorfs stats --json` prints), and
  `coorfs.cached_bytes(path)` how many bytes of one file the cache holds.

`HintedSampler` is imported on first use, so `import coorfs` does not load torch. `coorfs.run`
is the start-up hook of the `coorfs run` command, which gives unchanged jobs the same hints; the
command loads it by itself (a copy compiled into it), so jobs need not import it.
"""

from .order import ORDER_FILE, HintedOrder, sample_paths, send_hint, write_order
from .stats import STATS_ATTRIBUTE, cached_bytes, read_stats

__all__ = [
    "ORDER_FILE",
    "STATS_ATTRIBUTE",
    "HintedOrder",
    "HintedSampler",
    "cached_bytes",
    "read_stats",
    "sample_paths",
    "send_hint",
    "write_order",
]


def __getattr__(name):
    # PEP 562: torch (a second or more to import) only when the sampler is asked for.
    if name == "HintedSampler":
        from .sampler import HintedSampler

        return HintedSampler
    raise AttributeError("module 'coorfs' has no attribute %r" % name)
