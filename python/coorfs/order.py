"""Order hints: tell a coorfs mount the order in which a job reads its files next.

A job hands the coming epoch's order, one path per line relative to the mount root, to the
mount's control socket (an abstract unix socket named after the mount's device number, owned by
the mount's daemon: the text, then one line back with the verdict), or where it cannot reach
it, to the order file MOUNT/.coorfs-order: it opens the file read-only (the mount is read-only),
sends the text in fixed-size chunks with one ioctl each and ends it with a commit ioctl, whose
result is the daemon's verdict: a hint it rejects raises OSError with its errno (ENOENT: a path that is
no file of the mount, or not one the writer may read; EINVAL: garbage or nothing; EFBIG: too
large; EDQUOT: past the mount's hint memory). With the order known, the prefetcher follows it
exactly, as far ahead as its staging area allows. Standard library only: torch's sampler is in
`coorfs.sampler`.
"""

import fcntl
import hashlib
import os
import random
import socket
import struct
import warnings

ORDER_FILE = ".coorfs-order"

# The order file's ioctls (the daemon's fs/order.rs): a chunk is a buffer of CHUNK_BYTES, a
# little-endian u32 count and that many bytes of the hint; the commit applies the hint.
CHUNK_BYTES = 16380
HINT_CHUNK = (1 << 30) | (CHUNK_BYTES << 16) | (ord("C") << 8) | 1
HINT_COMMIT = (ord("C") << 8) | 2


def _send_over_socket(mount, data):
    """The verdict of the mount's control socket on hint `data` (None: no socket to reach)."""
    try:
        pid = int(os.getxattr(mount, "user.coorfs.pid").decode())
        dev = os.stat(mount).st_dev
    except (OSError, ValueError):
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        try:
            s.connect(("\0coorfs-control-%x" % dev).encode())
        except OSError:
            return None
        # Only the mount's daemon may take the hint: another user could hold the name.
        cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", cred)[0] != pid:
            return None
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            # A hint refused part way (too large): its verdict is still there to read.
            pass
        answer = b""
        while True:
            part = s.recv(4096)
            if not part:
                break
            answer += part
    finally:
        s.close()
    errno, _, message = answer.decode(errors="replace").strip().partition(" ")
    try:
        errno = int(errno)
    except ValueError:
        raise OSError("the mount's control socket answered %r" % answer) from None
    return (errno, message)


def send_hint(mount, data):
    """Hands hint `data` (bytes: relative paths, one per line) to the coorfs mount at `mount`.

    Raises OSError with the mount's errno if it rejects the hint.
    """
    mount = os.fspath(mount)
    verdict = _send_over_socket(mount, data)
    if verdict is not None:
        errno, message = verdict
        if errno:
            raise OSError(errno, message or os.strerror(errno))
        return
    fd = os.open(os.path.join(os.fspath(mount), ORDER_FILE), os.O_RDONLY | os.O_CLOEXEC)
    try:
        room = CHUNK_BYTES - 4
        for at in range(0, len(data), room):
            part = data[at : at + room]
            chunk = bytearray(CHUNK_BYTES)
            chunk[:4] = len(part).to_bytes(4, "little")
            chunk[4 : 4 + len(part)] = part
            # A mutable buffer of more than 1 KiB goes to the kernel as it is.
            fcntl.ioctl(fd, HINT_CHUNK, chunk, True)
        fcntl.ioctl(fd, HINT_COMMIT, 0)
    finally:
        os.close(fd)


def sample_paths(dataset):
    """The file path of every sample of `dataset`, by index.

    Asks, in this order: the dataset's own `coorfs_paths` (a list, or a method returning one:
    the protocol for custom datasets); torchvision's ImageFolder/DatasetFolder (`samples`,
    `imgs`); torch's `Subset` (its dataset's paths at its indices) and `ConcatDataset` (its
    datasets' paths, one after the other); datasets with `paths` or `files`; plain sequences
    of paths. Raises TypeError when none of them tells.
    """
    own = getattr(dataset, "coorfs_paths", None)
    if own is not None:
        return list(own() if callable(own) else own)
    for attr in ("samples", "imgs"):
        items = getattr(dataset, attr, None)
        if items is not None:
            return [item[0] if isinstance(item, (tuple, list)) else item for item in items]
    # Duck-typed, so that this module needs no torch: Subset has `dataset` and `indices`,
    # ConcatDataset `datasets` and `cumulative_sizes`.
    inner, indices = getattr(dataset, "dataset", None), getattr(dataset, "indices", None)
    if inner is not None and indices is not None:
        paths = sample_paths(inner)
        return [paths[i] for i in indices]
    parts = getattr(dataset, "datasets", None)
    if parts is not None and hasattr(dataset, "cumulative_sizes"):
        return [p for part in parts for p in sample_paths(part)]
    for attr in ("paths", "files"):
        items = getattr(dataset, attr, None)
        if items is not None:
            return list(items)
    if isinstance(dataset, (list, tuple)) and all(isinstance(p, (str, os.PathLike)) for p in dataset):
        return list(dataset)
    raise TypeError(
        "coorfs: cannot tell the file of each sample of %r; pass paths=[...] or give it a "
        "coorfs_paths list" % type(dataset).__name__
    )


def write_order(mount, paths):
    """Tells the coorfs mount at `mount` that this job reads `paths` next, in this order.

    Paths may be absolute (below `mount`) or relative to it. Raises OSError with coorfs's
    errno if it rejects the hint (see the module docstring), ValueError for a path outside the
    mount.
    """
    mount = os.fspath(mount)
    lines = []
    for p in paths:
        p = os.fspath(p)
        rel = os.path.relpath(p, mount) if os.path.isabs(p) else p
        if rel == ".." or rel.startswith(".." + os.sep):
            raise ValueError("coorfs: %s is not below the mount %s" % (p, mount))
        lines.append(rel)
    send_hint(mount, ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))


def group_seed(group):
    """The seed of a coordinated group's orders: the same for every job that names the group.

    Jobs that read in one order move in step through the mount, which then reads each file
    the cache does not hold from the source once for all of them (each member's read of a
    file finds the copy the first member's read left in the staging area).
    """
    if not isinstance(group, str) or not group:
        raise ValueError("coorfs: a group is a non-empty string, not %r" % (group,))
    return int.from_bytes(hashlib.sha256(group.encode("utf-8")).digest()[:8], "little")


class HintedOrder:
    """Per-epoch random orders over `paths`, each handed to the mount before it is used.

    The torch-free core of HintedSampler: `next_epoch()` returns the indices of the coming
    epoch after writing their paths to the mount. Jobs with the same `seed`, or the same
    `group` name, draw the same orders: a coordinated group. A hint the mount rejects warns and training
    goes on without it, unless `strict`, which raises.
    """

    def __init__(self, paths, mount, seed=None, strict=False, group=None):
        self.paths = list(paths)
        self.mount = os.fspath(mount)
        self.strict = strict
        if group is not None:
            if seed is not None:
                raise ValueError("coorfs: give a group or a seed, not both")
            seed = group_seed(group)
        self._rng = random.Random(seed)

    def hint(self, order):
        """Hands the paths of `order` (indices) to the mount; True if it took them."""
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
