"""The start-up hook of `coorfs run`: every PyTorch DataLoader over files of a coorfs mount hands
each epoch's order to the mount before the epoch's first batch, and every WebDataset process its
shards before it opens the first, with no change to the job.

How it gets in. `coorfs run -- CMD` puts a private directory first on PYTHONPATH holding a
`sitecustomize.py` (python/run-hook/) and this package under the name `_coorfs_run`, so that an
installed `coorfs` is neither needed nor shadowed. Every Python process of CMD imports it at
start-up and calls `install()`, which waits for `torch.utils.data` to be imported (an import
hook that runs after the module) and then replaces `DataLoader._index_sampler`, the property
through which every DataLoader iterator reaches its sampler or batch sampler, with one that
wraps it.

What a wrapped sampler does. `iter()` calls the sampler's own `iter()` at once, as the
DataLoader would. At the iterator's first `next()` it draws the whole epoch from it
(`list(it)`), hands the paths of those samples to the mount (`write_order`), and yields the same
indices. So every random draw happens where it would have: RandomSampler and
SubsetRandomSampler draw from torch's global generator at their first `next()`, after the
DataLoader iterator drew its workers' base seed, and draw nothing from it later. The job sees the
same indices, batches and seeds as without coorfs run. (One difference: a sampler given its own
`torch.Generator` with `num_samples` above the dataset's size draws its later permutations from
that generator at the epoch's start rather than along the epoch, which matters only to a program
that draws from the same generator during the epoch.) The order is taken in the main process,
where the sampler runs, whatever `num_workers`.

WebDataset. When the `webdataset` package is imported, its shard openers (WebDataset's
`StreamingOpen`, the pipelines' `url_opener`) are wrapped: at a process's first shard of an epoch
the wrapper draws the rest of that process's shard stream (after its split by node and worker
and its shuffle: a list of URLs, at most MAX_SHARDS), hands the local files among them to their
mount, and yields the same shards. Each DataLoader worker (or rank) hints its own shards; the
mount joins the orders of one job's processes, none of whose files overlap, into the job's
epoch. A resampled shard list (which never ends), URLs that are not local files, or shards on no
coorfs mount get no hint and one line.

Which DataLoaders. Samplers whose `__iter__` is torch's RandomSampler, SequentialSampler,
SubsetRandomSampler, WeightedRandomSampler or DistributedSampler (each process hints what its
own sampler yields: under DistributedSampler, its rank's shard), alone or under a BatchSampler;
an epoch of at most twice the dataset's samples. A sampler that hints by itself
(`coorfs_hints = True`, as coorfs.HintedSampler) is left alone. The samples' files come from
`coorfs.sample_paths` (ImageFolder's `samples`, a `coorfs_paths` list or method, Subset,
ConcatDataset) and must all be on one coorfs mount: `--mount` (COORFS_MOUNT) if given, else the
coorfs mount that /proc/self/mountinfo shows them under.

A group. Under `coorfs run --group NAME` (COORFS_GROUP) the hinted samplers draw their
permutations from a `torch.Generator` seeded with NAME (`coorfs.group_seed`), set as the
sampler's generator when its DataLoader is first planned (DistributedSampler: its `seed`), so
that every job run with the same NAME draws the same order each epoch: a coordinated group, whose
members the mount serves with one read of each file a round. That is the one case where the job
sees other indices than without coorfs run (the group's, by request), and RandomSampler no longer
takes a seed from torch's global generator. SequentialSampler needs nothing.

Opens without a round trip. CPython's `open()` asks whether a file it opens with the default
buffering is a terminal (`isatty()`, an `ioctl(TCGETS)`), and the kernel sends every ioctl of a
FUSE file to the daemon: one round trip a file, which on hot small files took 5 times the rest
of the read (`docs/BENCHMARKS.md`, "What a file and a byte cost"). For a binary read (`"rb"`)
the answer changes nothing (line buffering is a text-mode matter), so `install()` wraps
`open` (`builtins.open`, `io.open`: PIL, pathlib and plain `open` use them) to open a path on a
coorfs mount as `open` itself would, unbuffered, and buffer it with `io.BufferedReader` at the
file's block size (what the default buffering chooses), without the question. Every other
open is passed on as it was.

Harmless. Anything else (another sampler, a dataset without paths, files elsewhere, a hint the
mount refuses, an old torch, an error here) leaves that DataLoader exactly as it was and prints
one line to stderr, `coorfs run: no order hint: WHY`, once per reason for the whole run: the
processes of one run share marker files in COORFS_RUN_DIR, where `coorfs run` also learns at
the end whether any hint was given, and says why not if none was. Nothing here raises into the
program.
"""

import errno
import hashlib
import importlib.abc
import itertools
import os
import sys
import weakref

from .order import group_seed, sample_paths, write_order

PREFIX = "coorfs run: no order hint: "
# Set by `coorfs run`: the directory of this run's markers (`status/`), and --mount.
RUN_DIR_ENV = "COORFS_RUN_DIR"
MOUNT_ENV = "COORFS_MOUNT"
GROUP_ENV = "COORFS_GROUP"
FS_TYPE = "fuse.coorfs"
WATCHED = "torch.utils.data"
WEBDATASET = "webdataset"
# Samplers whose epochs are finite and drawn as described above, by class name in WATCHED.
KNOWN_SAMPLERS = (
    "RandomSampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
    "DistributedSampler",
)
# An epoch of more samples than this many datasets is not drawn whole: the list would be large,
# and the mount refuses a hint past 64 MiB plus 128 bytes a file anyway.
MAX_DATASETS_PER_EPOCH = 2
# What the mount's errors mean, for the line that says why a hint was refused.
REFUSALS = {
    errno.ENOENT: "a path that is not a file of the mount, or not one this user may read",
    errno.EINVAL: "a path the mount cannot take",
    errno.EFBIG: "larger than any order of the dataset",
    errno.EDQUOT: "past the mount's --hint-memory",
    errno.EACCES: "the mount takes hints only from its owner (--job-key none)",
}

_run_dir = os.environ.get(RUN_DIR_ENV)
_installed = False
_said = set()
_marked = set()
# DataLoader -> its _Plan, or None when it gets no hint.
_plans = weakref.WeakKeyDictionary()
_UNPLANNED = object()


def install():
    """Hooks torch.utils.data now if it is imported, else as soon as it is, and `open` (see the
    module header). Never raises."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        _patch_open()
    except Exception:  # never fail the program: open stays as it was
        pass
    try:
        _mark("loaded")
        waiting = {}
        for name, patch in ((WATCHED, _patch), (WEBDATASET, _patch_webdataset)):
            module = sys.modules.get(name)
            if module is not None:
                patch(module)
            else:
                waiting[name] = patch
        if waiting:
            sys.meta_path.insert(0, _Watcher(waiting))
    except Exception as e:  # never fail the program
        say("the hook did not start: %r" % (e,))


def _patch_open():
    """Replaces `builtins.open` and `io.open` with `open_without_isatty` over the coorfs mounts
    this process sees now (see the module header)."""
    import builtins
    import functools
    import io

    mounts = tuple(m.rstrip("/") + "/" for m in coorfs_mounts())
    if not mounts or getattr(io.open, "_coorfs_run", False):
        return
    original = io.open

    @functools.wraps(original)
    def open_without_isatty(
        file,
        mode="r",
        buffering=-1,
        encoding=None,
        errors=None,
        newline=None,
        closefd=True,
        opener=None,
    ):
        if (
            buffering == -1
            and mode in ("rb", "br")
            and encoding is None
            and errors is None
            and newline is None
            and isinstance(file, (str, bytes, os.PathLike))
            and _absolute(os.fspath(file)).startswith(mounts)
        ):
            raw = original(file, mode, 0, closefd=closefd, opener=opener)
            size = getattr(raw, "_blksize", 0)
            return io.BufferedReader(raw, size if size > 1 else io.DEFAULT_BUFFER_SIZE)
        return original(file, mode, buffering, encoding, errors, newline, closefd, opener)

    open_without_isatty._coorfs_run = True
    builtins.open = io.open = open_without_isatty


def say(why):
    """Prints `coorfs run: no order hint: WHY` unless this run printed it already."""
    if why in _said:
        return
    _said.add(why)
    if not _mark("said-" + hashlib.sha1(why.encode("utf-8", "replace")).hexdigest()[:16], exclusive=True):
        return
    try:
        sys.stderr.write(PREFIX + why + "\n")
        sys.stderr.flush()
    except Exception:
        pass


def _mark(name, exclusive=False):
    """Leaves marker `name` in the run's status directory. With `exclusive`, True only for the
    first process of the run to leave it (without a run directory: the first time here)."""
    if not exclusive and name in _marked:
        return False
    _marked.add(name)
    if not _run_dir:
        return True
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | (os.O_EXCL if exclusive else 0)
    try:
        os.close(os.open(os.path.join(_run_dir, "status", name), flags, 0o600))
    except FileExistsError:
        return False
    except OSError:  # the run is over, or another user: say it here at least
        pass
    return True


class _Watcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when a module it waits for (torch.utils.data, webdataset) is about
    to be imported, it takes the spec the other finders give and has the module patched once
    it has run. It leaves once it has seen them all."""

    def __init__(self, waiting):
        self._waiting = waiting
        self._busy = False

    def find_spec(self, name, path, target=None):
        if self._busy or name not in self._waiting:
            return None
        patch = self._waiting.pop(name)
        if not self._waiting:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        self._busy = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(name, path, target) if find is not None and finder is not self else None
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


class _PatchingLoader:
    """The loader of a watched module, which patches the module after running it and then puts
    the real loader back in the module's attributes."""

    def __init__(self, loader, patch):
        self._loader = loader
        self._patch = patch

    def __getattr__(self, name):
        return getattr(self.__dict__["_loader"], name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        try:
            self.__dict__["_patch"](module)
        except Exception as e:
            say("the hook could not follow this %s: %r" % (module.__name__.split(".")[0], e))


def _patch(data):
    """Wraps torch.utils.data.DataLoader._index_sampler (see the module docstring)."""
    loader_class = getattr(data, "DataLoader", None)
    prop = vars(loader_class).get("_index_sampler") if loader_class is not None else None
    if not isinstance(prop, property) or prop.fget is None:
        version = getattr(sys.modules.get("torch"), "__version__", "?")
        say("torch %s: its DataLoader has no _index_sampler property to follow" % version)
        return
    if getattr(prop.fget, "coorfs_run", False):
        return
    kinds = _SamplerKinds(data)
    original = prop.fget

    def _index_sampler(loader):
        sampler = original(loader)
        if sampler is None:
            return sampler
        return _HintingSampler(loader, sampler, kinds)

    _index_sampler.coorfs_run = True
    loader_class._index_sampler = property(_index_sampler, prop.fset, prop.fdel, prop.__doc__)
    _mark("torch")


class _SamplerKinds:
    """The sampler classes of this torch that the hook follows."""

    def __init__(self, data):
        self.known = {}
        for name in KNOWN_SAMPLERS:
            cls = getattr(data, name, None)
            if cls is not None:
                self.known[getattr(cls, "__iter__", None)] = name
        batch = getattr(data, "BatchSampler", None)
        self.batch_iter = getattr(batch, "__iter__", None) if batch is not None else None
        self.iterable = getattr(data, "IterableDataset", None)

    def is_batch(self, sampler):
        return self.batch_iter is not None and type(sampler).__iter__ is self.batch_iter

    def is_known(self, sampler):
        return type(sampler).__iter__ in self.known


class _HintingSampler:
    """What DataLoader._index_sampler gives under coorfs run: the sampler, whose epochs go to the
    mount first when the DataLoader has a plan (see `_plan_for`)."""

    def __init__(self, loader, sampler, kinds):
        self._loader = loader
        self._sampler = sampler
        self._kinds = kinds

    def __getattr__(self, name):
        try:
            return getattr(self.__dict__["_sampler"], name)
        except KeyError:
            raise AttributeError(name) from None

    def __len__(self):
        return len(self._sampler)

    def __iter__(self):
        it = iter(self._sampler)
        plan = _plan_for(self._loader, self._sampler, self._kinds)
        return it if plan is None else plan.epoch(it)


def _plan_for(loader, sampler, kinds):
    """The DataLoader's plan, made at its first epoch; None, and the line said, if it gets none."""
    try:
        plan = _plans.get(loader, _UNPLANNED)
    except TypeError:  # a DataLoader that cannot be weakly referred to: planned every epoch
        plan = _UNPLANNED
    if plan is _UNPLANNED:
        plan = None
        try:
            plan = _make_plan(loader, sampler, kinds)
        except Exception as e:
            say("%s: the hook failed: %r" % (_describe(loader), e))
        try:
            _plans[loader] = plan
        except TypeError:
            pass
    return plan if plan is not None and plan.live else None


def _describe(loader):
    return "a DataLoader over %s" % type(getattr(loader, "dataset", None)).__name__


def _make_plan(loader, sampler, kinds):
    what = _describe(loader)
    dataset = loader.dataset
    if kinds.iterable is not None and isinstance(dataset, kinds.iterable):
        if not type(dataset).__module__.startswith(WEBDATASET + "."):  # it hints its shards
            say("%s: an IterableDataset has no sampler order to follow" % what)
        return None
    base, batches = sampler, kinds.is_batch(sampler)
    if batches:
        base = getattr(sampler, "sampler", None)
    if getattr(sampler, "coorfs_hints", False) or getattr(base, "coorfs_hints", False):
        _mark("hinted")  # it hints by itself
        return None
    if not kinds.is_known(base):
        say(
            "%s: its sampler %s is not one coorfs run follows (%s, or a BatchSampler over one)"
            % (what, type(base).__name__, ", ".join(KNOWN_SAMPLERS))
        )
        return None
    try:
        paths = sample_paths(dataset)
    except TypeError:
        say("%s: cannot tell the file of each sample (give the dataset a coorfs_paths list)" % what)
        return None
    if len(paths) != len(dataset):
        say("%s: %d paths for %d samples" % (what, len(paths), len(dataset)))
        return None
    if len(base) > MAX_DATASETS_PER_EPOCH * max(len(paths), 1):
        say("%s: its sampler draws %d samples an epoch from %d" % (what, len(base), len(paths)))
        return None
    located = _below_a_mount(paths)
    if isinstance(located, str):
        say("%s: %s" % (what, located))
        return None
    mount, relative = located
    _join_group(base, kinds, what)
    return _Plan(what, mount, relative, batches)


def _join_group(sampler, kinds, what):
    """Under --group, makes `sampler` draw the group's orders (see the module docstring)."""
    group = os.environ.get(GROUP_ENV)
    if not group or getattr(sampler, "_coorfs_group", None) == group:
        return
    name = kinds.known.get(type(sampler).__iter__)
    # Within a torch seed's range, with room for DistributedSampler's seed + epoch.
    seed = group_seed(group) & (2**62 - 1)
    try:
        if name == "DistributedSampler":
            sampler.seed = seed
        elif name != "SequentialSampler":
            sampler.generator = sys.modules["torch"].Generator().manual_seed(seed)
        sampler._coorfs_group = group
    except Exception as e:
        say("%s: cannot draw the orders of group %r: %r" % (what, group, e))


def coorfs_mounts():
    """The mount points of the coorfs mounts this process sees (/proc/self/mountinfo)."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(b" ")
        try:
            fstype = fields[fields.index(b"-") + 1]
        except (ValueError, IndexError):
            continue
        if fstype == FS_TYPE.encode() and len(fields) > 4:
            found.append(os.fsdecode(_unescape(fields[4])))
    return found


def _unescape(field):
    """mountinfo's octal escapes (`\\040` for a space) decoded."""
    out, i = bytearray(), 0
    while i < len(field):
        octal = field[i + 1 : i + 4]
        if field[i : i + 1] == b"\\" and len(octal) == 3 and all(48 <= b <= 55 for b in octal):
            out.append(int(octal, 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return bytes(out)


def _below_a_mount(paths):
    """(mount, paths relative to it) if every path is below one coorfs mount, else why not."""
    if not paths:
        return "the dataset is empty"
    absolute = [_absolute(p) for p in paths]
    given = os.environ.get(MOUNT_ENV)
    if given:
        mount = os.path.abspath(given)
        candidates = [mount]
    else:
        candidates = coorfs_mounts()
    below = [m for m in candidates if _under(absolute[0], m)]
    if not below:
        where = "below --mount %s" % given if given else "on a coorfs mount"
        return "%s is not %s" % (absolute[0], where)
    mount = max(below, key=len)
    prefix = mount.rstrip("/") + "/"
    for p in absolute:
        if not p.startswith(prefix):
            return "its files are not all below the coorfs mount %s (%s is not)" % (mount, p)
    return mount, [p[len(prefix) :] for p in absolute]


def _absolute(path):
    path = os.fsdecode(path)
    # abspath (a normpath) is the slow part for a million paths; the mount skips `.` and empty
    # components itself, so only relative paths and `..` need it.
    if not path.startswith("/") or "/../" in path or path.endswith("/.."):
        path = os.path.abspath(path)
    return path


def _under(path, mount):
    return path == mount or path.startswith(mount.rstrip("/") + "/")


class _Plan:
    """How one DataLoader's epochs become hints: its samples' paths relative to the mount."""

    def __init__(self, what, mount, relative, batches):
        self.what = what
        self.mount = mount
        self.relative = relative
        self.batches = batches
        self.live = True

    def epoch(self, it):
        """The epoch of sampler iterator `it`, drawn whole at the first next() and hinted."""
        order = list(it)
        self.hint(order)
        yield from order

    def hint(self, order):
        try:
            indices = [i for batch in order for i in batch] if self.batches else order
            write_order(self.mount, [self.relative[i] for i in indices])
        except OSError as e:
            self.live = False
            meaning = REFUSALS.get(e.errno)
            say(
                "the coorfs mount %s refused the order of %s: %s%s"
                % (self.mount, self.what, e.strerror or e, " (%s)" % meaning if meaning else "")
            )
        except Exception as e:
            self.live = False
            say("%s: the hook failed: %r" % (self.what, e))
        else:
            _mark("hinted")


# WebDataset: the shards a process opens, in its order, hinted before the first is opened.
# At most this many shards an epoch are drawn ahead (a resampled shard list never ends).
MAX_SHARDS = 1 << 16


def _patch_webdataset(wds):
    """Wraps webdataset's shard openers (WebDataset's `StreamingOpen`, the pipelines'
    `url_opener`) so that each process's stream of shards is hinted first (`_hinted_shards`)."""
    cache = sys.modules.get(WEBDATASET + ".cache")
    opener = getattr(cache, "StreamingOpen", None)
    call = getattr(opener, "__call__", None)
    if call is not None and not getattr(call, "coorfs_run", False):

        def __call__(self, urls):
            return call(self, _hinted_shards(urls))

        __call__.coorfs_run = True
        opener.__call__ = __call__
    tariterators = sys.modules.get(WEBDATASET + ".tariterators")
    url_opener = getattr(tariterators, "url_opener", None)
    if url_opener is not None and not getattr(url_opener, "coorfs_run", False):

        def hinted_url_opener(data, *args, **kw):
            return url_opener(_hinted_shards(data), *args, **kw)

        hinted_url_opener.coorfs_run = True
        tariterators.url_opener = hinted_url_opener
        if getattr(wds, "url_opener", None) is url_opener:
            wds.url_opener = hinted_url_opener
    if call is None and url_opener is None:
        say("webdataset %s: no shard opener to follow" % getattr(wds, "__version__", "?"))
        return
    _mark("webdataset")


def _hinted_shards(urls):
    """The shards of stream `urls` (dicts with a `url`, or URLs), drawn whole first and their
    files hinted to the coorfs mount they are on; then yielded as they came. Every process
    hints its own shards (a DataLoader worker, a rank): the mount joins the orders of one job's
    processes into its epoch."""
    it = iter(urls)
    head = []
    try:
        head = list(itertools.islice(it, MAX_SHARDS + 1))
        _hint_shards(head)
    except Exception as e:
        say("webdataset shards: the hook failed: %r" % (e,))
    yield from head
    yield from it


def _hint_shards(shards):
    what = "webdataset shards"
    if not shards:
        return
    if len(shards) > MAX_SHARDS:
        say("%s: more than %d an epoch (resampled?)" % (what, MAX_SHARDS))
        return
    paths = []
    for shard in shards:
        url = shard.get("url") if isinstance(shard, dict) else shard
        url = os.fsdecode(url) if isinstance(url, (str, bytes, os.PathLike)) else None
        if url is None:
            say("%s: a shard that is no URL: %r" % (what, shard))
            return
        if url.startswith("file://"):
            url = url[len("file://") :]
        elif "://" in url or url.startswith("pipe:"):
            say("%s: %s is not a local file" % (what, url))
            return
        paths.append(url)
    located = _below_a_mount(paths)
    if isinstance(located, str):
        say("%s: %s" % (what, located))
        return
    mount, relative = located
    _Plan(what, mount, relative, False).hint(list(range(len(relative))))
