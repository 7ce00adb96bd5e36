//! The FUSE adapter: the one place that knows fuser. Each kernel request becomes a call on
//! [`DatasetFs`]; each result becomes a reply. Errors go through [`fail`], which logs once
//! and replies with the errno from [`errno`], the single exhaustive mapping.
//!
//! Each request is counted and timed per op (`requests` in the stats), and runs in a span of
//! its own (request id, op, node, pid) that the work done for it elsewhere joins ([`Req`]).
//!
//! # What the kernel is told
//! Each choice saves round trips; the measurements behind them are in docs/BENCHMARKS.md,
//! "What the kernel is told".
//! - OPEN replies carry `FOPEN_NOFLUSH` (a read-only file has nothing to flush: `close(2)`
//!   costs no round trip), `FOPEN_KEEP_CACHE` when the core says the kernel's pages of the
//!   file are right, `FOPEN_DIRECT_IO` only when it asks for it (`FUSE_DIRECT_IO_ALLOW_MMAP`
//!   keeps such files mappable), or a backing file for passthrough (`FUSE_PASSTHROUGH`,
//!   stack depth 1; the core registers and unregisters them through [`KernelBacking`]).
//! - OPEN is answered `ENOSYS` once the core lets the kernel open files itself (`--opens`,
//!   the core's `told/`): the kernel sends no OPEN, FLUSH or RELEASE on the connection from
//!   then on; OPENDIR too, and the kernel sends no OPENDIR or RELEASEDIR and keeps each
//!   listing it read until the directory changes (FUSE's no-opendir mode caches listings as
//!   `FOPEN_CACHE_DIR` does); and `FUSE_AUTO_INVAL_DATA` lets it drop a file's pages when its
//!   attributes show a change.
//! - Entries and attributes are cached for `--metadata-ttl` (a day by default); the core tells
//!   the kernel when the source changes. Where the kernel opens files itself, the core also
//!   hands it the bytes of small files it prefetched (`FUSE_NOTIFY_STORE`,
//!   `Invalidation::Store`), which their readers then read with no request.
//! - `FUSE_DO_READDIRPLUS`, without `FUSE_READDIRPLUS_AUTO` but over an object store: every
//!   listing hands out each entry's attributes, and the kernel makes its dentry then, so that
//!   a job that lists the dataset and then opens its files sends no LOOKUP for them (the
//!   core's `attrs.rs`).
//! - Readahead: INIT can only lower the kernel's window (128 KiB); as root the daemon raises
//!   it to `--readahead` through the mount's bdi once INIT is done (`daemon/mod.rs`), with 16
//!   background requests in flight. READs of up to 1 MiB (`FUSE_MAX_PAGES`); `--threads`
//!   workers, each on its own cloned `/dev/fuse` descriptor, or io_uring queues
//!   (`session.rs`).
//! - A read-only superblock (`MS_RDONLY`): the kernel refuses every write itself and keeps a
//!   file's attributes across its reads.
//! - Every operation the kernel may send is answered here, with no log line of its own:
//!   `IOCTL` (Python's `isatty` at every `open()`) with `ENOTTY`, as a file that is no
//!   terminal; `POLL` and `LSEEK` with `ENOSYS`, after which the kernel answers them itself
//!   (correctly for a read-only file); locks stay in the kernel (coorfs does not ask for
//!   `FUSE_POSIX_LOCKS`), and `BMAP` gets a quiet `ENOSYS`.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType,
    Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    Notifier, OpenFlags, PollEvents, PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyBmap,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};
use tracing::{debug, warn};

pub mod session;

use crate::fs::{BackingFiles, Caller, DatasetFs, FsError, Invalidation};
use crate::namespace::{Attr, Kind};
use crate::stats::{Op, Requests};

/// The fuser `Filesystem` of a mount.
#[derive(Debug)]
pub struct FuseAdapter {
    fs: Arc<DatasetFs>,
    /// Ask the kernel to evaluate POSIX ACLs (`--acl`).
    acl: bool,
    /// The session's `/dev/fuse` descriptor (a duplicate), filled in once the session exists:
    /// backing files are registered on it.
    device: Arc<OnceLock<OwnedFd>>,
}

/// The kernel's table of backing files of one FUSE connection (`FUSE_DEV_IOC_BACKING_*`).
struct KernelBacking {
    device: Arc<OnceLock<OwnedFd>>,
}

/// `_IOW(229, 2, uint32_t)`: unregisters a backing file id (linux/fuse.h). fuser closes ids
/// only through its own `BackingId`, which needs a reply to be made.
const FUSE_DEV_IOC_BACKING_CLOSE: u32 = 0x4004_e502;

impl BackingFiles for KernelBacking {
    fn register(&self, fd: BorrowedFd<'_>) -> std::io::Result<u32> {
        let device = self.device.get().ok_or(std::io::ErrorKind::NotConnected)?;
        fuser::BackingId::create_raw(device, fd)
    }

    fn unregister(&self, id: u32) {
        let Some(device) = self.device.get() else {
            return;
        };
        // SAFETY: the request takes a pointer to a u32, which `id` is, for the call's length.
        let rc = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                FUSE_DEV_IOC_BACKING_CLOSE as _,
                &id as *const u32,
            )
        };
        if rc < 0 {
            debug!(
                "unregistering backing file {id}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

impl FuseAdapter {
    /// Starts passthrough as an earlier daemon's INIT negotiated it (`passthrough`), for an
    /// adapter over a connection that is already initialised (no `init` is called).
    pub(crate) fn resume(&self, passthrough: bool) {
        match self.fs.passthrough_refusal() {
            None if passthrough => self.fs.start_passthrough(Box::new(KernelBacking {
                device: self.device.clone(),
            })),
            Some(why) => self.fs.passthrough_unavailable(why),
            None => self
                .fs
                .passthrough_unavailable("the connection's INIT did not enable it"),
        }
    }

    /// An adapter over `fs`. `notifier` and `device` are filled in once the session exists, so
    /// that the adapter can tell the kernel to drop what it cached of a changed file, and
    /// register backing files.
    pub fn new(
        fs: Arc<DatasetFs>,
        notifier: Arc<OnceLock<Notifier>>,
        device: Arc<OnceLock<OwnedFd>>,
        acl: bool,
    ) -> Self {
        // One thread sends the notifications, not the FUSE thread that found the change:
        // the kernel may need that thread to answer a request before a notification
        // completes. One thread, not one per change: a listing after a `chmod -R` of the
        // source finds a million changes.
        // A thread that is no FUSE thread (the source's watcher) tells the kernel itself, at
        // once: a chmod on the source is to reach the kernel before the next open.
        let (tx, rx) = std::sync::mpsc::channel::<Invalidation>();
        let direct = notifier.clone();
        let core = Arc::downgrade(&fs);
        let spawned = std::thread::Builder::new()
            .name("coorfs-inval".into())
            .spawn(move || {
                for what in rx {
                    // A file's bytes: the core says if they may go (`DatasetFs::hand_over`).
                    if let Invalidation::Store(..) = what {
                        if let Some(fs) = core.upgrade() {
                            fs.hand_over(&what, &|what| notify(&notifier, what));
                        }
                    } else {
                        notify(&notifier, &what);
                    }
                }
            });
        match spawned {
            Ok(_) => {
                let tx = std::sync::Mutex::new(tx);
                fs.set_invalidator(Box::new(move |what, at_once| {
                    if at_once {
                        notify(&direct, &what);
                    } else if let Ok(tx) = tx.lock() {
                        let _ = tx.send(what);
                    }
                }));
            }
            Err(e) => warn!("no thread to tell the kernel of changed files: {e}"),
        }
        FuseAdapter { fs, acl, device }
    }
}

/// Tells the kernel to forget `what` (or to keep it); true if the kernel took it.
fn notify(notifier: &OnceLock<Notifier>, what: &Invalidation) -> bool {
    let Some(notifier) = notifier.get() else {
        return false;
    };
    let sent = match what {
        Invalidation::Inode(ino) => notifier.inval_inode(INodeNo(*ino), 0, -1),
        // A negative offset: the attributes, no page.
        Invalidation::Attrs(ino) => notifier.inval_inode(INodeNo(*ino), -1, 0),
        Invalidation::Entry(dir, name) => notifier.inval_entry(INodeNo(*dir), name),
        Invalidation::Store(ino, _, data) => notifier.store(INodeNo(*ino), 0, data),
    };
    // The kernel knows no such node or name: nothing of it to forget (or to keep).
    if let Err(e) = &sent {
        match what {
            Invalidation::Store(ino, ..) => debug!("handing node {ino}'s bytes to the kernel: {e}"),
            _ => debug!("invalidating {what:?}: {e}"),
        }
    }
    sent.is_ok()
}

/// One request being answered: its span, and its count and time in the stats when it ends.
struct Req<'a> {
    requests: &'a Requests,
    op: Op,
    start: std::time::Instant,
    _span: tracing::span::EnteredSpan,
}

impl Drop for Req<'_> {
    fn drop(&mut self) {
        let nanos = self.start.elapsed().as_nanos() as u64;
        self.requests.record(self.op, nanos);
    }
}

impl FuseAdapter {
    /// Request `req` of kind `op` on node `ino` begins: its span (request id, op, node, pid),
    /// at debug level, is entered until it is answered; with `--log-level debug` the log has a
    /// line for each as it ends, with its time, so that the log of a daemon that died shows
    /// what it was doing.
    fn begin(&self, req: &Request, op: Op, ino: u64) -> Req<'_> {
        Req {
            requests: self.fs.requests(),
            op,
            start: std::time::Instant::now(),
            _span: tracing::debug_span!(
                "fuse",
                req = req.unique().0,
                op = op.name(),
                ino,
                pid = req.pid()
            )
            .entered(),
        }
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        pid: req.pid(),
        uid: req.uid(),
        gid: req.gid(),
    }
}

/// The errno a caller sees for each core error ([`FsError::errno`]).
pub fn errno(err: &FsError) -> Errno {
    Errno::from_i32(err.errno())
}

/// A reply that can carry an error.
trait ErrorReply {
    fn error(self, err: Errno);
}

macro_rules! error_reply {
    ($($t:ty),*) => {$(
        impl ErrorReply for $t {
            fn error(self, err: Errno) {
                <$t>::error(self, err)
            }
        }
    )*};
}
error_reply!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyEmpty,
    ReplyEntry,
    ReplyOpen,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr
);

/// Logs a failed request once, at a level that fits how ordinary the failure is, and
/// replies with its errno. A block that could not be read is logged with its cause, at most
/// so many a minute ([`crate::tier::error::FAILED_READS`]).
fn fail(op: &str, err: FsError, reply: impl ErrorReply) {
    match &err {
        FsError::Read(_) => {
            let now = std::time::Instant::now();
            if let Some(line) = crate::tier::error::FAILED_READS.line(now, &err) {
                warn!("{line}")
            }
        }
        // Probes for missing names and attributes are part of normal operation.
        FsError::NotFound | FsError::NoAttr | FsError::Range => debug!("{op}: {err}"),
        FsError::ReadOnly | FsError::Access | FsError::NotDir | FsError::IsDir | FsError::Stale => {
            debug!("{op}: {err}")
        }
        _ => warn!("{op}: {err}"),
    }
    reply.error(errno(&err));
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: SystemTime::UNIX_EPOCH,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// Answers an extended-attribute request: the size for a size-0 probe, ERANGE for a buffer
/// that is too small, the value otherwise. A `live` value (the daemon's own, rebuilt at each
/// request) may have grown between a caller's probe and its read, so the probe answers its
/// size with room to spare ([`probe_size`]).
fn reply_xattr(value: Vec<u8>, size: u32, live: bool, reply: ReplyXattr) {
    if size == 0 {
        reply.size(probe_size(value.len(), live));
    } else if (size as usize) < value.len() {
        fail("xattr", FsError::Range, reply);
    } else {
        reply.data(&value);
    }
}

/// The size a size-0 probe answers for a value of `len` bytes: a live one's, with room for a
/// quarter more and 256 bytes. `getfattr` probes, then reads with a buffer of that size and
/// gives up on ERANGE: `user.coorfs.stats`, whose free memory and counters change between
/// the two, failed about one read in ten at the end of a run in a pod ("Numerical result
/// out of range"). The read answers the value's own length.
fn probe_size(len: usize, live: bool) -> u32 {
    let len = if live { len + len / 4 + 256 } else { len };
    u32::try_from(len).unwrap_or(u32::MAX)
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let mut wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        if !self.fs.lists_with_attributes() {
            wanted |= InitFlags::FUSE_READDIRPLUS_AUTO;
        }
        // With --acl the kernel evaluates the source's ACLs (read through getxattr of
        // system.posix_acl_*) on top of the mode bits, as for a local filesystem. It caches
        // none for FUSE: measured, 100 reads of one file by a non-owner sent 100 GETXATTRs.
        if self.acl {
            wanted |= InitFlags::FUSE_POSIX_ACL;
        }
        // Where the kernel may open files itself, no open finds a file changed, so a change on
        // the source shows in the attributes: the kernel drops a file's pages itself when a
        // fresh GETATTR or LOOKUP brings a new mtime or size (a change the notifier thread
        // would report only after the open that races it).
        if self.fs.kernel_may_open() {
            wanted |= InitFlags::FUSE_AUTO_INVAL_DATA;
        }
        let passthrough = match self.fs.passthrough_refusal() {
            Some(why) => Err(why),
            None if !config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH) => {
                Err("the kernel does not offer FUSE passthrough (Linux 6.9 or later)")
            }
            None if config.set_max_stack_depth(1).is_err() => {
                Err("the kernel refused a stack depth of 1")
            }
            None => Ok(()),
        };
        if passthrough.is_ok() {
            wanted |= InitFlags::FUSE_PASSTHROUGH;
        }
        let supported = wanted & config.capabilities();
        if let Err(missing) = config.add_capabilities(supported) {
            debug!("kernel lacks {missing:?}");
        }
        match passthrough {
            Ok(()) => self.fs.start_passthrough(Box::new(KernelBacking {
                device: self.device.clone(),
            })),
            Err(why) => self.fs.passthrough_unavailable(why),
        }
        // Readahead as large as the kernel allows: 1 MiB requests for sequential reads.
        if let Err(max) = config.set_max_readahead(1 << 20) {
            let _ = config.set_max_readahead(max);
        }
        // Readahead's READs are background requests: up to 16 in flight (the kernel's default
        // is 12), so that a reader's window of 16 MiB (`--readahead`) is 16 READs of 1 MiB
        // at once. Each holds a block in the daemon while it is fetched, so that more would be
        // memory a small pod lacks: 64 in flight (64 MiB) got a daemon OOM-killed in a pod of
        // 64 MiB.
        let _ = config.set_max_background(16);
        // Nothing is written to a read-only mount: writes of 1 MiB at most (fuser's default is
        // 16 MiB) keep each io_uring entry's payload buffer at the 1 MiB of the largest READ
        // (the kernel sizes it by max_write and max_pages).
        let _ = config.set_max_write(1 << 20);
        // "Congested" only past two readers' windows (32 READs of 1 MiB): at the kernel's
        // 3/4 of the 16 in flight, two readers of 16 MiB windows (32 READs asked) kept the
        // connection congested, and the kernel dropped each async window it had just
        // allocated and put in the page cache, to read those pages again later. From S3
        // (8 x 64 MiB, 2 readers) the readers added 1.78 pages to the page cache for each page
        // read; at a threshold of 12, 1.7-2.8 CPU-s a GiB, at 32, 1.2-1.9. Past 32 the kernel
        // still sheds readahead: that keeps readers' windows within what a pod's elastic
        // budget leaves them (with no threshold at all, a 320 MiB pod's epoch 2 read up to
        // 1.11x what the cache lacked, against 1.00-1.01x at 12 and at 32).
        let _ = config.set_congestion_threshold(32);
        debug!("FUSE capabilities {:?}", config.capabilities());
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _req = self.begin(req, Op::Lookup, parent.0);
        match self.fs.lookup(parent.0, name, caller(req)) {
            Ok(e) => reply.entry(&self.fs.ttl(), &file_attr(&e.attr), Generation(0)),
            Err(e) => fail("lookup", e, reply),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _req = self.begin(req, Op::Getattr, ino.0);
        let attr = match fh {
            Some(fh) => self.fs.getattr_open(ino.0, fh.0),
            None => self.fs.getattr(ino.0),
        };
        match attr {
            Ok(a) => reply.attr(&self.fs.ttl(), &file_attr(&a)),
            Err(e) => fail("getattr", e, reply),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _req = self.begin(req, Op::Readlink, ino.0);
        match self.fs.readlink(ino.0) {
            Ok(target) => reply.data(target.as_os_str().as_encoded_bytes()),
            Err(e) => fail("readlink", e, reply),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _req = self.begin(req, Op::Open, ino.0);
        if self.fs.kernel_opens() {
            // The kernel stops sending OPEN (and RELEASE) on this connection (fs/told/).
            return reply.error(Errno::ENOSYS);
        }
        match self.fs.open(ino.0, flags.0, caller(req)) {
            Ok(o) if o.passthrough.is_some() => {
                let id = o.passthrough.unwrap_or_default();
                // SAFETY: `id` was registered on this session by the core, which unregisters
                // it only after the RELEASE of every open it was given to (fs/passthrough.rs).
                let backing = unsafe { reply.wrap_backing(id) };
                // Passthrough takes neither KEEP_CACHE (EIO) nor DIRECT_IO (which turns it
                // off); NOFLUSH still saves the FLUSH at close.
                reply.opened_passthrough(FileHandle(o.fh), FopenFlags::FOPEN_NOFLUSH, &backing);
                // The id stays registered: the core owns it.
                let _ = backing.into_raw();
            }
            Ok(o) => {
                let mut fopen = FopenFlags::FOPEN_NOFLUSH;
                if o.keep_cache {
                    fopen |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                if o.direct_io {
                    fopen |= FopenFlags::FOPEN_DIRECT_IO;
                }
                reply.opened(FileHandle(o.fh), fopen);
            }
            Err(e) => fail("open", e, reply),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _req = self.begin(req, Op::Read, ino.0);
        let done = Box::new(move |result: Result<&[u8], FsError>| match result {
            Ok(bytes) => reply.data(bytes),
            Err(e) => fail("read", e, reply),
        });
        (self.fs).read_node(ino.0, fh.0, offset, size, caller(req), done);
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _req = self.begin(req, Op::Release, ino.0);
        self.fs.release(fh.0);
        reply.ok();
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _req = self.begin(req, Op::Flush, ino.0);
        // Every file is opened with NOFLUSH, so a FLUSH comes only from a kernel that ignores
        // it; ENOSYS and the kernel stops sending it.
        reply.error(Errno::ENOSYS);
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _req = self.begin(req, Op::Opendir, ino.0);
        // Where the kernel opens files itself it opens directories too: ENOSYS, and it sends
        // no OPENDIR or RELEASEDIR again, and keeps the listings it reads (the core's
        // `attrs.rs`).
        if self.fs.kernel_opens() {
            return reply.error(Errno::ENOSYS);
        }
        match self.fs.opendir(ino.0, caller(req)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => fail("opendir", e, reply),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _req = self.begin(req, Op::Readdir, ino.0);
        let dir = (fh.0, ino.0, caller(req));
        let result = self.fs.readdir(dir, offset, false, |e| {
            reply.add(INodeNo(e.ino), e.next, file_type(e.kind), e.name)
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => fail("readdir", e, reply),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _req = self.begin(req, Op::Readdirplus, ino.0);
        let ttl = self.fs.ttl();
        let dir = (fh.0, ino.0, caller(req));
        let result = self.fs.readdir(dir, offset, true, |e| match e.attr {
            Some(attr) => reply.add(
                INodeNo(e.ino),
                e.next,
                e.name,
                &e.ttl.unwrap_or(ttl),
                &file_attr(&attr),
                Generation(0),
            ),
            None => false,
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => fail("readdirplus", e, reply),
        }
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _req = self.begin(req, Op::Releasedir, ino.0);
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _d: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _req = self.begin(req, Op::Statfs, 1);
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => fail("statfs", e, reply),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _req = self.begin(req, Op::Access, ino.0);
        match self.fs.access(ino.0, mask.bits(), caller(req)) {
            Ok(()) => reply.ok(),
            Err(e) => fail("access", e, reply),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _req = self.begin(req, Op::Getxattr, ino.0);
        match self.fs.getxattr(ino.0, name) {
            Ok(value) => {
                let live = name
                    .as_encoded_bytes()
                    .starts_with(crate::stats::XATTR_PREFIX.as_bytes());
                reply_xattr(value, size, live, reply)
            }
            Err(e) => fail("getxattr", e, reply),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _req = self.begin(req, Op::Listxattr, ino.0);
        match self.fs.listxattr(ino.0) {
            Ok(names) => reply_xattr(names, size, false, reply),
            Err(e) => fail("listxattr", e, reply),
        }
    }

    // Requests that have nothing to do with the data: answered at once and quietly, since a
    // training job may send them for every file (see the header).

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _req = self.begin(req, Op::Ioctl, ino.0);
        // The order file takes hints (fs/order.rs). No other ioctl applies to a dataset
        // file: TCGETS (isatty) and the rest get "not a terminal", quietly. The kernel
        // answers FIONREAD, FIGETBSZ and the like for regular files itself, without asking.
        match self.fs.ioctl(ino.0, fh.0, cmd, in_data, caller(req)) {
            Ok(()) => reply.ioctl(0, &[]),
            Err(FsError::NotTty) => reply.error(Errno::ENOTTY),
            Err(e) => {
                debug!("ioctl {cmd:#x}: {e}");
                reply.error(errno(&e));
            }
        }
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        // ENOSYS: the kernel stops asking and reports every file ready, as for a local one.
        reply.error(Errno::ENOSYS);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        // Only SEEK_DATA and SEEK_HOLE come here. ENOSYS: the kernel stops asking and answers
        // from the file's size (data up to the end, one hole after it), which is true of
        // every file the mount serves as far as a reader can tell.
        reply.error(Errno::ENOSYS);
    }

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn setlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn bmap(&self, _req: &Request, _ino: INodeNo, _blocksize: u32, _idx: u64, reply: ReplyBmap) {
        reply.error(Errno::ENOSYS);
    }

    // Everything below would change the dataset: the mount is read-only.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        fail("setattr", FsError::ReadOnly, reply);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        fail("mknod", FsError::ReadOnly, reply);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        fail("mkdir", FsError::ReadOnly, reply);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        fail("unlink", FsError::ReadOnly, reply);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        fail("rmdir", FsError::ReadOnly, reply);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        fail("symlink", FsError::ReadOnly, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        fail("rename", FsError::ReadOnly, reply);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        fail("link", FsError::ReadOnly, reply);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        fail("write", FsError::ReadOnly, reply);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        fail("create", FsError::ReadOnly, reply);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        fail("fallocate", FsError::ReadOnly, reply);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        fail("copy_file_range", FsError::ReadOnly, reply);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        fail("setxattr", FsError::ReadOnly, reply);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        fail("removexattr", FsError::ReadOnly, reply);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::DataError;
    use crate::tier::error::ReadFailed;
    use std::sync::Arc;

    #[test]
    fn a_probe_of_a_live_value_leaves_room_for_it_to_grow_and_a_source_value_is_exact() {
        // A stats value of 4,000 bytes that gains a few digits before the read still fits.
        assert_eq!(probe_size(4000, true), 5256);
        assert!(probe_size(4000, true) as usize >= 4000 + 64);
        assert_eq!(probe_size(0, true), 256);
        // The source file's own attributes answer their size exactly.
        assert_eq!(probe_size(4000, false), 4000);
        assert_eq!(probe_size(usize::MAX / 2, true), u32::MAX);
    }

    #[test]
    fn a_failed_read_gets_the_errno_of_its_cause() {
        let failed = |error: DataError| {
            FsError::Read(ReadFailed {
                rel: Arc::from(std::path::Path::new("a")),
                block: 0,
                error,
            })
        };
        let refused = crate::source::SourceError::Refused {
            errno: libc::EACCES,
            why: "GET: 403".into(),
        };
        for (e, want) in [
            (DataError::of_source(refused), Errno::EACCES),
            (DataError::Changed, Errno::ESTALE),
            (DataError::Panicked, Errno::EIO),
        ] {
            assert_eq!(errno(&failed(e)), want);
        }
    }
}
