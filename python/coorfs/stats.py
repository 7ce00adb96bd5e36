"""Statistics of a coorfs mount, read from the extended attributes of its files.

The mount's root carries every statistic as a `user.coorfs.NAME` attribute and all of them
as one JSON document in `user.coorfs.stats` (what `coorfs stats --json` prints: hits, misses,
bytes from the cache and from the source, per-epoch and per-job figures). Every file carries
`user.coorfs.cached`, the bytes of it the cache holds. Read with os.getxattr: no getfattr, no
third-party package.
"""

import errno
import json
import os

STATS_ATTRIBUTE = "user.coorfs.stats"
CACHED_ATTRIBUTE = "user.coorfs.cached"

# What getxattr answers for an attribute a file does not have (ENOTSUP: a filesystem without
# user attributes at all).
_MISSING = (errno.ENODATA, errno.ENOTSUP)


def _getxattr(path, attribute, what):
    path = os.fspath(path)
    try:
        return os.getxattr(path, attribute)
    except OSError as e:
        if e.errno in _MISSING:
            message = "not %s (no %s attribute)" % (what, attribute)
            raise OSError(e.errno, message, path) from e
        raise


def read_stats(mount):
    """The statistics of the coorfs mount at `mount`, as a dict.

    Raises OSError if `mount` is not the root of a coorfs mount.
    """
    return json.loads(_getxattr(mount, STATS_ATTRIBUTE, "the root of a coorfs mount"))


def cached_bytes(path):
    """How many bytes of the file at `path` (below a coorfs mount) the cache holds."""
    return int(_getxattr(path, CACHED_ATTRIBUTE, "a file of a coorfs mount"))
