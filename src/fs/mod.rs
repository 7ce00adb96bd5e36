//! The filesystem core: a read-only mirror of a dataset directory with a training-aware
//! cache, independent of FUSE.
//!
//! `fuse.rs` turns kernel requests into calls on [`DatasetFs`] and its plain results
//! ([`Entry`], [`Attr`], [`Opened`]) back into replies; tests drive the core directly.
//!
//! [`DatasetFs`] coordinates; the decisions live in the types it holds:
//! - the node table ([`Namespace`]) and the handle table (`handles.rs`);
//! - the tiers a block comes from ([`crate::tier`]): the read path (`read.rs`) asks them in
//!   order on the FUSE thread, and the fetch behind them;
//! - the jobs ([`crate::jobs`]) and the ledger, where every access and byte is counted
//!   ([`crate::jobs::ledger`]);
//! - the prefetcher ([`crate::prefetch`]), told of every open and fetch;
//! - the order files (`order.rs`), the kernel-cache gauge (`kernel_cache.rs`), the callers'
//!   credentials (`callers.rs`).
//!
//! An open reads as its steps ([`DatasetFs::open`]): refuse writes, open the source file as
//! the caller, count the access (taking the file's staged blocks), tell the prefetcher,
//! choose how the kernel may cache the file, enter the handle.
//!
//! Metadata comes from the source's `lstat` and is kept in the [`Namespace`]. An `open`
//! re-checks the file's version (one `lstat`), so a source file that changed since the
//! kernel cached its attributes is served with its new content, and `Opened::changed` asks
//! the adapter to invalidate what the kernel holds.
//!
//! # The kernel's page cache and ours
//! The kernel's page cache of the FUSE files is LRU: if it held files coorfs does not cache,
//! they would push out the ones it does, and MinIO would degrade to LRU. So with a cache
//! policy, an open decides:
//! - every byte of the file is in coorfs's cache: `keep_cache`. The kernel may keep (and
//!   serve from) its pages of the file, a first level over the cache: when it reclaims
//!   them, the cache still holds every byte. A hot small file then costs one round trip.
//!   That level is free only if the kernel keeps the pages until the file is read again;
//!   when sentinel files show that it does not (memory too tight for a second copy), hits
//!   use `direct_io` as well ([`kernel_cache`]), except small files (up to
//!   [`BUFFERED_MISS_MAX`]): their pages are dropped at open and read again in one READ.
//! - a small file (up to [`BUFFERED_MISS_MAX`]) that the cache will keep whole once it is
//!   read (a policy that never evicts, with room for it), while the kernel keeps pages: the
//!   kernel's page cache, without `keep_cache`. The file is about to be one of the cache's,
//!   so its pages are right; the read at its end needs no round trip, and the next epoch
//!   finds its pages there.
//! - otherwise: `direct_io`. The file's bytes never enter the kernel's page cache; each read
//!   comes to the daemon, which serves cached blocks and fetches the rest.
//!
//! With `--policy none` there is no cache of ours and the kernel's page cache does what it
//! does (`keep_cache` for every unchanged file): the baseline of "FUSE plus page cache".
//!
//! The accounting follows: an open of a wholly cached file is a hit, and its size is counted
//! as bytes from the cache right there (training reads files whole, and the kernel may serve
//! them without asking); reads through a direct-I/O handle count exactly what they serve.
//!
//! Every open of a dataset file is an access of its job's epoch ([`crate::epoch`]). An open
//! that re-reads what the job read moments ago (a check and a decode, two workers sharing a
//! file) is the same access: its reads may take the blocks read then, which the cache did not
//! keep, from [`crate::tier::recent`] instead of the source. The job's lock is held from
//! taking the file's staged blocks to counting the access, so that of two such opens the one
//! counted first takes them.

mod callers;
mod cluster;
mod handles;
mod kernel_cache;
pub mod order;
mod read;

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::cache::BlockCache;
use crate::config::MountConfig;
use crate::epoch::Step;
use crate::jobs::ledger::{Attribution, Ledger, Opening};
use crate::jobs::{Job, JobKey, JobKeyKind, Jobs};
use crate::namespace::{Attr, FileId, Kind, Namespace, NodeId, ROOT, SourceMeta};
use crate::prefetch::{Prefetcher, ReadBy};
use crate::source::beneath::is_moved;
use crate::source::{Creds, DatasetSource, FsStats};
use crate::stats::{self, Counters, Snapshot, Stat, Stats, Value};
use crate::tier::Tiers;
use crate::tier::staging::Claimed;
use handles::{DirHandle, FileHandle, HandleTable, Held};
use order::OrderFiles;

/// Everything that can go wrong in the core. `fuse.rs` maps each variant to an errno in one
/// exhaustive `match`.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("not a symbolic link")]
    NotSymlink,
    #[error("read-only file system")]
    ReadOnly,
    #[error("permission denied")]
    Access,
    #[error("stale file handle")]
    BadHandle,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value larger than the buffer")]
    Range,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("operation not supported")]
    NotSupported,
    #[error("file too large")]
    TooLarge,
    #[error("inappropriate ioctl for device")]
    NotTty,
    #[error("the source entry changed under its name (a component became a symlink or moved)")]
    Stale,
    #[error("source: {0}")]
    Source(#[from] io::Error),
}

impl FsError {
    fn from_errno(errno: i32) -> Self {
        FsError::Source(io::Error::from_raw_os_error(errno))
    }
}

/// Who asks: what a FUSE request says of its process.
#[derive(Clone, Copy, Debug, Default)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Tells the kernel to forget what it cached of a node (attributes and pages). Set by the
/// FUSE adapter; called whenever the core finds that a source entry changed.
pub type Invalidator = Box<dyn Fn(NodeId) + Send + Sync>;

/// The answer to a lookup: the entry's attributes.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub attr: Attr,
}

/// The answer to an open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// The kernel may keep (and serve from) the pages it cached for this file.
    pub keep_cache: bool,
    /// The kernel must send every read to the daemon and cache nothing.
    pub direct_io: bool,
    /// The source file changed since the kernel was last told its attributes.
    pub changed: bool,
}

/// One directory entry, as `readdir` hands it out.
#[derive(Clone, Debug)]
pub struct DirEntryOut<'a> {
    pub ino: NodeId,
    /// The offset of the next entry.
    pub next: u64,
    pub kind: Kind,
    pub name: &'a OsStr,
    /// Present for `readdirplus`.
    pub attr: Option<Attr>,
    /// How long the kernel may keep `attr`, when less than `--metadata-ttl`: attributes from
    /// a kept listing are as old as the listing.
    pub ttl: Option<Duration>,
}

/// Called with the bytes of a read (or its error), possibly on another thread.
pub type ReadDone = Box<dyn FnOnce(Result<&[u8], FsError>) + Send>;

/// How an open of a file is accounted. A FUSE OPEN is the job's access of the file. Under
/// `--fast-open` the kernel sends no OPEN and each READ that misses the kernel's page cache
/// opens the file for itself: the READ at offset 0 (where the kernel starts a file) is the
/// access, the others are [`Access::Silent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    Counted,
    Silent,
}

/// A source file opened for a caller.
#[derive(Debug)]
struct SourceOpen {
    rel: PathBuf,
    file: std::fs::File,
    /// Its metadata, fresh from the open descriptor.
    meta: SourceMeta,
    file_id: Option<FileId>,
    /// It changed since the kernel was last told its attributes.
    changed: bool,
}

/// How an open was counted, for its handle and the prefetcher.
#[derive(Debug)]
struct Counted {
    /// The dataset-wide epoch and the job's epoch the open counts in.
    epoch: u64,
    job_key: JobKey,
    job_epoch: u64,
    /// The digest of the order the job follows this epoch, if it gave one.
    order: Option<u64>,
    /// Files of its epoch the job has opened, this one included.
    position: u64,
    /// What the access did to the job's epoch (None: not an access of its own, or a file
    /// the scan has not seen).
    step: Option<Step>,
    /// Every block of the file was staged, and the open took them (`claimed`).
    staged: bool,
    claimed: Vec<(u64, Arc<crate::block::Block>)>,
}

impl Counted {
    /// The read this access is, as [`Prefetcher::share`] keeps its blocks.
    fn read_by(&self) -> ReadBy {
        ReadBy {
            job: self.job_key,
            round: self.job_epoch,
            order: self.order,
            position: self.position,
        }
    }
}

/// What the scan of the source found, and the room the node table has.
#[derive(Debug, Default)]
struct ScanState {
    files: AtomicU64,
    bytes: AtomicU64,
    complete: AtomicBool,
    /// Bytes the node table may take before the daemon passes its memory limit.
    room: Option<u64>,
    /// The node table outgrew `room`, and the daemon said so.
    over_room: AtomicBool,
}

/// Threads of the scan at most.
pub const SCAN_THREADS: usize = 8;

/// Entries (with `.` and `..`) in the first READDIRPLUS reply of a listing at most. The kernel
/// asks for attributes in the first request of every listing, wanted or not, and makes an
/// inode of each entry: 6-7 us a file that `find` or `os.scandir` never stats. The rest of the
/// listing then comes as plain READDIR unless lookups in between show the attributes are used.
pub const FIRST_PLUS_ENTRIES: usize = 32;

/// Directories the scan has still to read, and how many its threads are reading.
struct ScanQueue {
    dirs: Vec<(NodeId, PathBuf)>,
    busy: usize,
}

/// Misses of files up to this size are read through the kernel's page cache while the cache
/// has room to keep them whole (see [`DatasetFs::kernel_caching`]). Round trips are most of
/// what a small file costs: 128,000 files of 200-600 B, `--cache-size 1G`, `coorfs read
/// --procs 2`, 3 rounds of an A/B on this 2-CPU machine: the cold epoch took 10.2-14.8 s
/// (median 11.6) against 14.1-14.5 s through direct I/O, and the first hot epoch 1.9-2.3 s
/// against 3.2 s (its pages were in the kernel already). A larger file's bytes, not its
/// round trips, are its cost, and the page cache would hold a second copy of them.
pub const BUFFERED_MISS_MAX: u64 = 64 << 10;

/// The core of one mount: a coordinator. It answers the kernel's requests from the node
/// table, the handle table and the tiers, and tells the jobs (through the ledger) and the
/// prefetcher what happened; the decisions are theirs.
pub struct DatasetFs {
    source: Arc<dyn DatasetSource>,
    ns: Arc<Namespace>,
    ttl: Duration,
    tiers: Tiers,
    prefetcher: Arc<Prefetcher>,
    jobs: Arc<Jobs>,
    ledger: Arc<Ledger>,
    handles: HandleTable,
    orders: OrderFiles,
    kernel: kernel_cache::KernelCacheGauge,
    callers: callers::CallerCreds,
    scan: ScanState,
    info: Vec<(&'static str, String)>,
    invalidator: std::sync::OnceLock<Invalidator>,
    /// Nodes whose source entry changed while the kernel was not told (see `open`).
    stale_in_kernel: Mutex<std::collections::HashSet<NodeId>>,
    /// `--fast-open`: the kernel opens files without asking (see [`DatasetFs::fast_open`]).
    fast_open: bool,
    /// The cluster this mount is a member of, if any.
    cluster: Option<crate::cluster::ClusterConfig>,
    /// Its registration in etcd, while it lasts.
    registration: Mutex<Option<crate::cluster::etcd::Registration>>,
    /// The members' shares, for the stats.
    shares: Mutex<cluster::Shares>,
    // Last, so that it is dropped last: dropping the runtime waits for its I/O threads.
    _io: tokio::runtime::Runtime,
}

impl std::fmt::Debug for DatasetFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetFs")
            .field("source", &self.source.root())
            .field("cache", &self.tiers.memory)
            .finish_non_exhaustive()
    }
}

impl DatasetFs {
    /// A core over `source` with the cache of `config`. Fails if the source root cannot be
    /// read or the cache cannot be set up.
    pub fn new(source: Arc<dyn DatasetSource>, config: &MountConfig) -> io::Result<Self> {
        Self::with_disk(source, config, Arc::new(Stats::default()), None)
    }

    /// [`DatasetFs::new`], with the disk tier `disk` (opened by the caller, counting in
    /// `stats`) between the memory tier and the source.
    pub fn with_disk(
        source: Arc<dyn DatasetSource>,
        config: &MountConfig,
        stats: Arc<Stats>,
        disk: Option<Arc<crate::tier::disk::DiskTier>>,
    ) -> io::Result<Self> {
        let root = source.metadata(Path::new(""), &Creds::DAEMON)?;
        if root.attr.kind != Kind::Dir {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(config.io_threads.max(1))
            .thread_name("coorfs-io")
            // Sockets and timers, for the peer server and etcd client of a cluster member.
            .enable_io()
            .enable_time()
            .build()?;
        let tiers = Tiers::new(
            BlockCache::new(config.cache)?,
            config.prefetch.staging_bytes(),
            disk,
            source.clone(),
            config.cluster.as_ref(),
            stats.clone(),
            io.handle().clone(),
        );
        let ns = Arc::new(Namespace::new(root));
        let jobs = Arc::new(Jobs::new(config.jobs));
        let ledger = Arc::new(Ledger::new(stats));
        let prefetcher = Prefetcher::new(
            config.prefetch,
            tiers.clone(),
            ns.clone(),
            jobs.clone(),
            ledger.clone(),
        );
        let info = vec![
            ("source", config.source.display().to_string()),
            ("mountpoint", config.mountpoint.display().to_string()),
            ("policy", config.cache.policy.name().to_string()),
        ];
        Ok(DatasetFs {
            source,
            ns,
            ttl: config.metadata_ttl,
            tiers,
            prefetcher: Arc::new(prefetcher),
            jobs,
            ledger,
            handles: HandleTable::default(),
            orders: OrderFiles::new(
                config.hint_limits,
                config.jobs.key == JobKeyKind::None,
                config.owner_uid,
            ),
            kernel: Default::default(),
            callers: Default::default(),
            scan: ScanState {
                room: config.metadata_room,
                ..Default::default()
            },
            info,
            invalidator: std::sync::OnceLock::new(),
            stale_in_kernel: Default::default(),
            fast_open: config.fast_open,
            cluster: config.cluster.clone(),
            registration: Default::default(),
            shares: Default::default(),
            _io: io,
        })
    }

    /// The runtime of the mount's sockets and timers (the peer server, etcd, the metrics
    /// server).
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        self._io.handle()
    }

    /// How long the kernel may cache entries and attributes.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// `--fast-open`: OPEN and FLUSH are answered `ENOSYS`, so the kernel stops sending them
    /// (and RELEASE): it checks permissions itself from the attributes it caches
    /// (`default_permissions`) and keeps every file's pages. A hot file then costs no round
    /// trip at all; each READ opens its file for itself ([`DatasetFs::read_unopened`]).
    pub fn fast_open(&self) -> bool {
        self.fast_open
    }

    /// Sets how the core tells the kernel to forget a changed node (once).
    pub fn set_invalidator(&self, invalidate: Invalidator) {
        let _ = self.invalidator.set(invalidate);
    }

    /// Records a fresh `lstat` of node `ino`; if the source entry changed, the kernel
    /// forgets what it cached of it. Returns true if it changed.
    fn refresh(&self, ino: NodeId, meta: crate::namespace::SourceMeta) -> bool {
        let changed = self.ns.refresh(ino, meta);
        if changed && let Some(invalidate) = self.invalidator.get() {
            invalidate(ino);
        }
        changed
    }

    /// The credentials to act with for `caller`.
    fn creds(&self, caller: Caller) -> Creds {
        self.callers.get(caller, self.ledger.now())
    }

    fn rel_path(&self, ino: NodeId) -> Result<PathBuf, FsError> {
        self.ns.path(ino).ok_or(FsError::NotFound)
    }

    /// Walks the whole source, entering every entry into the namespace and counting the
    /// dataset's files and bytes. Epochs can end ("every file read") only once it is done.
    /// Runs on the caller's thread and one more per CPU (up to [`SCAN_THREADS`]), a
    /// directory each at a time: the walk is an `lstat` per entry, and one thread kept one
    /// CPU busy. 128,000 files in 100 directories, 2 CPUs: 0.98 s from mount to complete
    /// on one thread, 0.70 s on two.
    pub fn scan(&self) {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, SCAN_THREADS);
        let queue = Mutex::new(ScanQueue {
            dirs: vec![(ROOT, PathBuf::new())],
            busy: 0,
        });
        let changed = parking_lot::Condvar::new();
        std::thread::scope(|s| {
            for i in 1..threads {
                let spawned = std::thread::Builder::new()
                    .name(format!("coorfs-scan-{i}"))
                    .spawn_scoped(s, || self.scan_from(&queue, &changed));
                if let Err(e) = spawned {
                    tracing::warn!("scan: no thread {i} ({e}); scanning on fewer");
                }
            }
            self.scan_from(&queue, &changed);
        });
        let disk_order = self.ns.files_in_inode_order();
        self.ns.shrink();
        self.scan.complete.store(true, Ordering::Release);
        self.prefetcher.scanned(disk_order);
        tracing::info!(
            "scan complete: {} files, {}",
            self.scan.files.load(Ordering::Relaxed),
            crate::units::format_size(self.scan.bytes.load(Ordering::Relaxed))
        );
    }

    /// One thread of the scan: takes directories from `queue` until it is empty and no other
    /// thread is reading one (which may add more).
    fn scan_from(&self, queue: &Mutex<ScanQueue>, changed: &parking_lot::Condvar) {
        loop {
            let (node, rel) = {
                let mut q = queue.lock();
                loop {
                    if let Some(dir) = q.dirs.pop() {
                        q.busy += 1;
                        break dir;
                    }
                    if q.busy == 0 {
                        changed.notify_all();
                        return;
                    }
                    changed.wait(&mut q);
                }
            };
            let found = self.scan_dir(node, &rel);
            let mut q = queue.lock();
            q.dirs.extend(found);
            q.busy -= 1;
            changed.notify_all();
        }
    }

    /// Enters the entries of directory `rel` (node `node`) into the namespace and returns its
    /// subdirectories.
    fn scan_dir(&self, node: NodeId, rel: &Path) -> Vec<(NodeId, PathBuf)> {
        let read_at = Instant::now();
        let (dir_meta, items) = match self.source.read_dir(rel, &Creds::DAEMON) {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!("scan: {}: {e}", self.source.root().join(rel).display());
                return Vec::new();
            }
        };
        self.check_metadata_room();
        let ids = self
            .ns
            .insert_children(node, items.iter().map(|i| (i.name.as_os_str(), i.meta)));
        if settled(&dir_meta) {
            self.ns.keep_listing(node, dir_meta.version, read_at, &ids);
        }
        let mut dirs = Vec::new();
        for (item, id) in items.iter().zip(ids) {
            match item.meta.attr.kind {
                Kind::Dir => dirs.push((id, rel.join(&item.name))),
                Kind::File => {
                    self.scan.files.fetch_add(1, Ordering::Relaxed);
                    self.scan
                        .bytes
                        .fetch_add(item.meta.attr.size, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        dirs
    }

    /// Warns (once) when the node table grows past the room the budget left it: the daemon
    /// is then on its way past its memory (cgroup) limit, and the kernel would kill it.
    fn check_metadata_room(&self) {
        let Some(room) = self.scan.room else {
            return;
        };
        let used = self.ns.memory() as u64;
        if used > room && !self.scan.over_room.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "the node table of {} entries holds {}, more than the {} that --cache-size and \
                 --prefetch-memory leave of the daemon's memory; the kernel may kill the \
                 daemon: mount with a smaller --cache-size",
                self.ns.file_count(),
                crate::units::format_size(used),
                crate::units::format_size(room)
            );
        }
    }

    /// True once the node table outgrew the room the budget left it (and the daemon said so).
    pub fn metadata_over_room(&self) -> bool {
        self.scan.over_room.load(Ordering::Relaxed)
    }

    /// The dataset's file count, once the scan is complete.
    fn dataset_files(&self) -> Option<usize> {
        self.scan
            .complete
            .load(Ordering::Acquire)
            .then(|| self.ns.file_count())
    }

    /// Finds `name` in directory `parent` for `caller`: a fresh `lstat` of the source,
    /// reached with the caller's search permission on every directory on the way.
    pub fn lookup(&self, parent: NodeId, name: &OsStr, caller: Caller) -> Result<Entry, FsError> {
        if parent == ROOT && name == order::ORDER_FILE {
            return Ok(Entry {
                attr: self.control_attr(),
            });
        }
        let dir = self.ns.info(parent).ok_or(FsError::NotFound)?;
        if dir.attr.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let rel = self.rel_path(parent)?.join(name);
        let meta = self
            .source
            .metadata(&rel, &self.creds(caller))
            .map_err(source_error)?;
        let id = match self.ns.child(parent, name) {
            Some(id) => {
                self.refresh(id, meta);
                id
            }
            None => self.ns.insert_child(parent, name, meta),
        };
        self.attr(id).map(|attr| Entry { attr })
    }

    /// The attributes of node `ino`, from a fresh `lstat` of the source: the kernel asks
    /// when those it cached are older than `--metadata-ttl`.
    pub fn getattr(&self, ino: NodeId) -> Result<Attr, FsError> {
        if ino == order::ORDER_INO {
            return Ok(self.control_attr());
        }
        let rel = self.rel_path(ino)?;
        let meta = self
            .source
            .metadata(&rel, &Creds::DAEMON)
            .map_err(source_error)?;
        self.refresh(ino, meta);
        self.attr(ino)
    }

    /// The attributes the node table holds for node `ino`.
    fn attr(&self, ino: NodeId) -> Result<Attr, FsError> {
        if ino == order::ORDER_INO {
            return Ok(self.control_attr());
        }
        self.ns.info(ino).map(|i| i.attr).ok_or(FsError::NotFound)
    }

    /// The target of symbolic link `ino`.
    pub fn readlink(&self, ino: NodeId) -> Result<PathBuf, FsError> {
        let info = self.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind != Kind::Symlink {
            return Err(FsError::NotSymlink);
        }
        self.source
            .read_link(&self.rel_path(ino)?)
            .map_err(source_error)
    }

    /// Opens file `ino` (or the order file) for reading. `flags` are the
    /// `open(2)` flags.
    pub fn open(&self, ino: NodeId, flags: i32, caller: Caller) -> Result<Opened, FsError> {
        self.open_file(ino, flags, caller, Access::Counted)
    }

    /// [`DatasetFs::open`], accounted as `access` says. The steps: refuse writes, open the
    /// source file as the caller, count the access (taking the blocks the prefetcher staged),
    /// tell the prefetcher, choose how the kernel may cache the file, enter the handle.
    pub(crate) fn open_file(
        &self,
        ino: NodeId,
        flags: i32,
        caller: Caller,
        access: Access,
    ) -> Result<Opened, FsError> {
        if ino == order::ORDER_INO {
            return self.open_order(flags, caller);
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY
            || flags & (libc::O_TRUNC | libc::O_APPEND) != 0
        {
            return Err(FsError::ReadOnly);
        }
        let (handle, opened) = self.open_handle(ino, caller, access)?;
        self.handles.insert_file(opened.fh, handle);
        Ok(opened)
    }

    /// The steps of [`DatasetFs::open_file`] for a data file, up to entering the handle: the
    /// handle, and what the kernel is told. A read under `--fast-open` uses the handle alone.
    fn open_handle(
        &self,
        ino: NodeId,
        caller: Caller,
        access: Access,
    ) -> Result<(FileHandle, Opened), FsError> {
        let opened = self.open_source(ino, caller)?;
        let now = self.ledger.now();
        let version = &opened.meta.version;
        let in_memory = self.tiers.memory.holds_file(version);
        // A file the disk tier holds whole is a hit too: no byte of it is read from below.
        let hit = in_memory
            || (self.tiers.disk.as_ref()).is_some_and(|d| d.holds_file(&opened.rel, version));
        let job = self.jobs.get(caller.pid, caller.uid, now);
        let counted = match access {
            Access::Counted => self.count_access(&job, &opened, hit, caller, now),
            Access::Silent => self.silent_access(&job),
        };
        let SourceOpen {
            rel,
            file,
            meta,
            file_id,
            changed,
        } = opened;
        if access == Access::Counted {
            self.prefetcher
                .on_open(&job, counted.step, counted.staged, hit);
            // What it took from the staging area stays there for the jobs that still need it.
            if let Some(f) = file_id {
                self.prefetcher
                    .share(f, counted.read_by(), &meta.version, &counted.claimed);
            }
        }
        let (keep_cache, direct_io, watch) = match access {
            Access::Counted => self.kernel_caching(file_id, meta.version.size, in_memory, changed),
            Access::Silent => (true, false, None),
        };
        let fh = self.handles.next_fh();
        tracing::debug!(
            "open {} fh {fh} by {} (pid {}): {} (epoch {}, job epoch {}, {:?})",
            rel.display(),
            counted.job_key,
            caller.pid,
            if hit {
                "hit"
            } else if counted.staged {
                "staged"
            } else {
                "miss"
            },
            counted.epoch,
            counted.job_epoch,
            counted.step
        );
        let handle = FileHandle {
            rel: Arc::from(rel),
            version: meta.version,
            file,
            counted_at_open: AtomicBool::new(hit),
            att: Attribution {
                epoch: counted.epoch,
                job,
                job_epoch: counted.job_epoch,
            },
            job_key: counted.job_key,
            order: counted.order,
            position: counted.position,
            // A re-read within the epoch, or a second look right after it ended; not a read
            // that may be the new epoch's first of the file.
            same_access: access == Access::Silent
                || matches!(counted.step, Some(Step::Repeat | Step::Trailing)),
            held: Mutex::new(Held {
                claimed: counted.claimed,
                last: None,
            }),
            watch,
            ino,
            pid: caller.pid,
            file_id,
            changed_while_open: AtomicBool::new(false),
            silent: access == Access::Silent,
        };
        let opened = Opened {
            fh,
            keep_cache,
            direct_io,
            changed: changed && access == Access::Counted,
        };
        Ok((handle, opened))
    }

    /// Opens the source file of node `ino` as `caller`: the source checks modes, ACLs and
    /// every directory's search permission now, whatever the kernel's cached attributes said.
    /// If the file changed since the kernel was told, the kernel is told to forget what it
    /// cached.
    fn open_source(&self, ino: NodeId, caller: Caller) -> Result<SourceOpen, FsError> {
        let info = self.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let rel = self.rel_path(ino)?;
        let (file, meta) = match self.source.open_file(&rel, &self.creds(caller)) {
            Ok(opened) => opened,
            Err(e) => {
                // A refused open may be the first sign of a chmod. The node learns it (so
                // `stat` shows it once the kernel's attributes expire), but the kernel is
                // not told to forget its attributes: it would cache the refusing mode for
                // --metadata-ttl and refuse the next open itself, even after a chmod back.
                // What it cached of the file's pages is dropped at the next open that works.
                if let Ok(meta) = self.source.metadata(&rel, &Creds::DAEMON)
                    && self.ns.refresh(ino, meta)
                {
                    self.stale_in_kernel.lock().insert(ino);
                }
                return Err(source_error(e));
            }
        };
        let pending = self.stale_in_kernel.lock().remove(&ino);
        let changed = (meta.version != info.version && self.ns.refresh(ino, meta)) || pending;
        if changed && let Some(invalidate) = self.invalidator.get() {
            invalidate(ino);
        }
        Ok(SourceOpen {
            rel,
            file,
            meta,
            file_id: info.file_id,
            changed,
        })
    }

    /// Counts an open of a source file as `job`'s access at `now`. The job's lock is held
    /// from taking the file's staged blocks to counting the access: of two opens of a file
    /// by one job (a check and a decode, two workers sharing it), the one its epoch counts
    /// first takes them, and the other finds them among the recent blocks.
    fn count_access(
        &self,
        job: &Arc<Mutex<Job>>,
        opened: &SourceOpen,
        hit: bool,
        caller: Caller,
        now: f64,
    ) -> Counted {
        let version = opened.meta.version;
        let mut j = job.lock();
        let job_key = j.key;
        // The prefetcher's blocks of this file are now this open's.
        let claimed = if hit {
            Claimed::default()
        } else {
            self.prefetcher.claim(&opened.rel, &version, job_key)
        };
        let blocks = self.tiers.memory.blocks().count(version.size);
        let staged = !claimed.blocks.is_empty() && claimed.blocks.len() as u64 == blocks;
        let opening = Opening {
            file: opened.file_id,
            pid: caller.pid,
            hit,
            staged,
            shared: staged && claimed.shared,
            size: version.size,
            total: self.dataset_files(),
            now,
        };
        let (job_epoch, step) = self.ledger.open_in_job(&mut j, &opening);
        if step.is_some_and(Step::began_epoch) {
            j.epoch_changed();
        }
        let order = j.following();
        let position = j.log.tracker().read_in_epoch() as u64;
        drop(j);
        Counted {
            epoch: self.ledger.open_in_dataset(&opening),
            job_key,
            job_epoch,
            order,
            position,
            step,
            staged: opening.staged,
            claimed: claimed.blocks,
        }
    }

    /// An open of no access of its own (see [`Access::Silent`]): its reads count in the
    /// epochs current now.
    fn silent_access(&self, job: &Arc<Mutex<Job>>) -> Counted {
        let (job_key, job_epoch, order, position) = {
            let j = job.lock();
            let position = j.log.tracker().read_in_epoch() as u64;
            (j.key, j.epoch(), j.following(), position)
        };
        Counted {
            epoch: self.ledger.epoch(),
            job_key,
            job_epoch,
            order,
            position,
            step: None,
            staged: false,
            claimed: Vec::new(),
        }
    }

    /// How the kernel may cache an open of `file`: `(keep_cache, direct_io, watch)` (see the
    /// module header).
    fn kernel_caching(
        &self,
        file: Option<FileId>,
        size: u64,
        hit: bool,
        changed: bool,
    ) -> (bool, bool, Option<kernel_cache::Watch>) {
        if !self.tiers.memory.caches() {
            return (!changed, false, None);
        }
        let (keep, watch) = match file {
            Some(file) if hit && !changed => self.kernel.open(file),
            _ => (false, None),
        };
        // A small miss the cache will keep whole may enter the kernel's page cache: it is
        // about to be a file of the cache, and its pages are then right. Read through the
        // page cache it costs one READ instead of two (the kernel knows the size, so the
        // read at the end of the file needs no round trip), and the next epoch finds its
        // pages already there.
        // A sentinel read this way is watched: its pages are given to the kernel now.
        if let Some(file) = file
            && !keep
            && !changed
            && size <= BUFFERED_MISS_MAX
            && self.kernel.keeps()
            && self.tiers.memory.has_room_for(size)
        {
            return (false, false, self.kernel.open(file).1);
        }
        // Direct I/O costs a small hit more than the page cache it saves: two READs (the
        // kernel asks again at the end of the file) and the reader's whole buffer pinned and
        // dirtied for each. 128,000 hits of 200-600 B, reader buffers of 1 MiB, the kernel's
        // pages dropped, `--fast-open` off: 15.0-15.7 s an epoch through direct I/O, 8.2-9.5 s
        // through the page cache.
        let small_hit = hit && !changed && size <= BUFFERED_MISS_MAX;
        (keep, !keep && !small_hit, watch)
    }

    /// Starts the prefetch thread (see [`crate::prefetch`]).
    pub fn start_prefetcher(&self) -> std::io::Result<()> {
        self.prefetcher.start()
    }

    /// Closes open file `fh`.
    pub fn release(&self, fh: u64) {
        let handle = self.handles.remove_file(fh);
        match handle.as_ref().map(|h| &h.watch) {
            Some(Some(watch)) => self.kernel.closed(watch),
            Some(None) => {}
            None => self.orders.release(fh),
        }
    }

    /// Opens directory `ino` for `caller` (who must be allowed to read it now) and takes a
    /// snapshot of its listing.
    pub fn opendir(&self, ino: NodeId, caller: Caller) -> Result<u64, FsError> {
        let info = self.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let mut listing = self
            .source
            .open_dir(&self.rel_path(ino)?, &self.creds(caller))
            .map_err(source_error)?;
        // The scan's listing while the directory is unchanged and younger than
        // --metadata-ttl; else the source's.
        let kept_until = match self.ns.kept_listing(ino, &listing.meta.version, self.ttl) {
            Some((names, at)) => {
                listing.names = names;
                Some(at + self.ttl)
            }
            None => {
                listing.read_names().map_err(source_error)?;
                None
            }
        };
        let parent = self.ns.parent(ino).ok_or(FsError::NotFound)?;
        Ok(self.handles.add_dir(DirHandle {
            node: ino,
            parent,
            listing,
            kept_until,
        }))
    }

    /// Lists directory `fh` from `offset`, handing entries to `add` until it returns true
    /// (the reply is full). With `plus`, every entry carries its attributes, and a listing's
    /// first reply (offset 0) ends after [`FIRST_PLUS_ENTRIES`].
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(DirEntryOut<'_>) -> bool,
    ) -> Result<(), FsError> {
        let mut room = if plus && offset == 0 {
            FIRST_PLUS_ENTRIES
        } else {
            usize::MAX
        };
        let mut add = |entry| {
            room -= 1;
            add(entry) || room == 0
        };
        let dir = self.handles.dir(fh).ok_or(FsError::BadHandle)?;
        // Offsets 1 and 2 follow "." and ".."; entry i of the snapshot ends at offset i + 3.
        let dots: [(&OsStr, NodeId); 2] =
            [(OsStr::new("."), dir.node), (OsStr::new(".."), dir.parent)];
        for (i, (name, ino)) in dots.iter().enumerate().skip(offset as usize) {
            let attr = if plus {
                Some(self.getattr(*ino)?)
            } else {
                None
            };
            let entry = DirEntryOut {
                ino: *ino,
                next: i as u64 + 1,
                kind: Kind::Dir,
                name,
                attr,
                ttl: None,
            };
            if add(entry) {
                return Ok(());
            }
        }
        let start = offset.saturating_sub(2) as usize;
        // Entries of a kept listing carry the attributes the scan read, for what is left of
        // --metadata-ttl since: no lstat each.
        let kept_ttl = dir
            .kept_until
            .and_then(|until| until.checked_duration_since(Instant::now()))
            .filter(|left| !left.is_zero());
        let mut guess = 0;
        for (i, (name, listed_kind)) in dir.listing.names.iter().enumerate().skip(start) {
            // An entry's lstat only when the kernel asks for its attributes or coorfs does
            // not know it yet; one gone since the listing is left out.
            let known = self.ns.child_near(dir.node, name, guess);
            let (ino, kind, attr) = match (known, plus) {
                (Some(id), true) if kept_ttl.is_some() => {
                    let attr = self.attr(id)?;
                    (id, attr.kind, Some(attr))
                }
                (Some(id), false) => {
                    let kind = listed_kind
                        .or_else(|| self.ns.info(id).map(|i| i.attr.kind))
                        .unwrap_or(Kind::File);
                    (id, kind, None)
                }
                (Some(id), true) => {
                    let Ok(meta) = dir.listing.stat(name) else {
                        continue;
                    };
                    self.refresh(id, meta);
                    (id, meta.attr.kind, Some(self.attr(id)?))
                }
                (None, _) => {
                    let Ok(meta) = dir.listing.stat(name) else {
                        continue;
                    };
                    let id = self.ns.insert_child(dir.node, name, meta);
                    (id, meta.attr.kind, plus.then(|| self.attr(id)).transpose()?)
                }
            };
            guess = ino + 1;
            let entry = DirEntryOut {
                ino,
                next: i as u64 + 3,
                kind,
                name,
                attr,
                ttl: kept_ttl,
            };
            if add(entry) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Closes directory `fh`.
    pub fn releasedir(&self, fh: u64) {
        self.handles.remove_dir(fh);
    }

    /// Capacity of the filesystem holding the source.
    pub fn statfs(&self) -> Result<FsStats, FsError> {
        Ok(self.source.statfs()?)
    }

    /// `access(2)`: the read-only mount refuses W_OK; the rest follows the source's modes.
    pub fn access(&self, ino: NodeId, mask: i32, caller: Caller) -> Result<(), FsError> {
        let attr = self.getattr(ino)?;
        if mask & libc::W_OK != 0 {
            return Err(FsError::ReadOnly);
        }
        let want = ((mask & (libc::R_OK | libc::X_OK)) & 0o7) as u16;
        if want == 0 {
            return Ok(());
        }
        let granted = if caller.uid == 0 {
            // root reads anything, and executes anything that anyone may execute.
            let x = if attr.perm & 0o111 != 0 || attr.kind == Kind::Dir {
                1
            } else {
                0
            };
            4 | x
        } else if caller.uid == attr.uid {
            (attr.perm >> 6) & 7
        } else if caller.gid == attr.gid {
            (attr.perm >> 3) & 7
        } else {
            attr.perm & 7
        };
        if granted & want == want {
            Ok(())
        } else {
            Err(FsError::Access)
        }
    }

    /// Writes the blocks the disk tier has queued and stops its writer: at unmount.
    pub fn close_disk(&self) {
        if let Some(disk) = &self.tiers.disk {
            disk.close();
        }
    }

    /// Every stat, now.
    pub fn snapshot(&self) -> Snapshot {
        let stats = self.ledger.stats();
        let c = &stats.counters;
        let cache = &self.tiers.memory;
        let cc = &cache.counters;
        let disk = self.tiers.disk.as_deref();
        let reads = Counters::get(&c.reads);
        let hits = Counters::get(&c.hits);
        let mut jobs = self.jobs.summaries(stats.now());
        for j in jobs.iter_mut().filter(|j| j.active) {
            j.kept_blocks = self.tiers.staging.needed_by(j.key);
            j.staged_bytes = self.tiers.staging.held_by(j.key);
        }
        let from_source = self.ledger.file_rounds_from_source();
        let epochs = stats.epochs.lock();
        let value = |stat: Stat| -> Value {
            match stat {
                Stat::Reads => Value::Count(reads),
                Stat::Hits => Value::Count(hits),
                Stat::Misses => Value::Count(Counters::get(&c.misses)),
                Stat::HitRate => Value::Ratio(if reads == 0 {
                    0.0
                } else {
                    hits as f64 / reads as f64
                }),
                Stat::BytesFromCache => Value::Count(Counters::get(&c.bytes_from_cache)),
                Stat::BytesFromSource => Value::Count(Counters::get(&c.bytes_from_source)),
                Stat::CachedBytes => Value::Count(cache.cached_bytes()),
                Stat::CachedFiles => Value::Count(cache.cached_files()),
                Stat::CachedBlocks => Value::Count(cache.cached_blocks()),
                Stat::CacheUsed => Value::Count(cache.used()),
                Stat::CacheCapacity => Value::Count(cache.config().capacity),
                Stat::MetadataBytes => Value::Count(self.ns.memory() as u64),
                Stat::AdmissionsRefused => Value::Count(cc.refused.load(Ordering::Relaxed)),
                Stat::Evictions => Value::Count(cc.evicted.load(Ordering::Relaxed)),
                Stat::SourceErrors => Value::Count(Counters::get(&c.source_errors)),
                Stat::TierErrors => Value::Count(Counters::get(&c.tier_errors)),
                Stat::DiskHits => Value::Count(Counters::get(&c.disk_hits)),
                Stat::BytesFromDisk => Value::Count(Counters::get(&c.bytes_from_disk)),
                Stat::DiskCachedBytes => Value::Count(disk.map_or(0, |d| d.cached_bytes())),
                Stat::DiskCachedBlocks => Value::Count(disk.map_or(0, |d| d.cached_blocks())),
                Stat::DiskIndexBytes => Value::Count(disk.map_or(0, |d| d.index_bytes())),
                Stat::DiskUsed => Value::Count(disk.map_or(0, |d| d.used())),
                Stat::DiskCapacity => Value::Count(disk.map_or(0, |d| d.capacity())),
                Stat::DiskDropped => Value::Count(Counters::get(&c.disk_dropped)),
                Stat::DiskEnabled => Value::Count(u64::from(disk.is_some_and(|d| d.enabled()))),
                Stat::PeerHits => Value::Count(Counters::get(&c.peer_hits)),
                Stat::BytesFromPeers => Value::Count(Counters::get(&c.bytes_from_peers)),
                Stat::PeerErrors => Value::Count(Counters::get(&c.peer_errors)),
                Stat::PeerServed => Value::Count(Counters::get(&c.peer_served)),
                Stat::BytesToPeers => Value::Count(Counters::get(&c.bytes_to_peers)),
                Stat::PeerRefused => Value::Count(Counters::get(&c.peer_refused)),
                Stat::FetchStallSeconds => {
                    Value::Ratio(Counters::get(&c.fetch_stall_us) as f64 / 1e6)
                }
                Stat::DataWaitSeconds => Value::Ratio(Counters::get(&c.data_wait_us) as f64 / 1e6),
                Stat::StagingHits => Value::Count(Counters::get(&c.staging_hits)),
                Stat::SharedHits => Value::Count(Counters::get(&c.shared_hits)),
                Stat::SourceReadsPerFile => Value::Ratio(if from_source == 0 {
                    0.0
                } else {
                    Counters::get(&c.source_file_reads) as f64 / from_source as f64
                }),
                Stat::PrefetchedBlocks => Value::Count(Counters::get(&c.prefetched_blocks)),
                Stat::PrefetchedUnused => Value::Count(Counters::get(&c.prefetched_unused)),
                Stat::StagingBytes => Value::Count(self.prefetcher.staging_bytes()),
                Stat::PrefetchMemory => Value::Count(self.prefetcher.staging_capacity()),
                Stat::KernelCache => Value::Count(u64::from(self.kernel.keeps())),
                Stat::KernelRefills => Value::Count(self.kernel.refills()),
                Stat::HintsAccepted => Value::Count(Counters::get(&c.hints_accepted)),
                Stat::HintsRejected => Value::Count(Counters::get(&c.hints_rejected)),
                Stat::ActiveJobs => Value::Count(self.jobs.live().len() as u64),
                Stat::DatasetFiles => Value::Count(self.scan.files.load(Ordering::Relaxed)),
                Stat::DatasetBytes => Value::Count(self.scan.bytes.load(Ordering::Relaxed)),
                Stat::ScanComplete => {
                    Value::Count(self.scan.complete.load(Ordering::Acquire) as u64)
                }
                Stat::Epoch => Value::Count(epochs.tracker().epoch()),
                Stat::UptimeSeconds => Value::Count(stats.now() as u64),
                Stat::Pid => Value::Count(std::process::id() as u64),
            }
        };
        let values = Stat::ALL.iter().map(|s| (*s, value(*s))).collect();
        let records = epochs.records().to_vec();
        drop(epochs);
        Snapshot {
            values,
            info: self
                .info
                .iter()
                .cloned()
                .chain(self.cluster_info())
                .collect(),
            epochs: records,
            jobs: serde_json::to_value(jobs).unwrap_or_default(),
        }
    }

    /// The value of extended attribute `name` of node `ino`.
    pub fn getxattr(&self, ino: NodeId, name: &OsStr) -> Result<Vec<u8>, FsError> {
        if ino == order::ORDER_INO {
            return Err(FsError::NoAttr);
        }
        let info = self.ns.info(ino).ok_or(FsError::NotFound)?;
        let name = name.to_str().ok_or(FsError::NoAttr)?;
        if ino == ROOT {
            if name == stats::STATS_XATTR {
                return Ok(self.snapshot().to_json(stats::XATTR_SIZE_MAX).into_bytes());
            }
            if let Some(stat) = stats::stat_of_xattr(name) {
                let value = self.snapshot().get(stat).ok_or(FsError::NoAttr)?;
                return Ok(value.text().into_bytes());
            }
        }
        if let Some(acl) = stats::ACL_XATTRS.iter().find(|a| **a == name) {
            // The kernel evaluates POSIX ACLs itself (FUSE_POSIX_ACL) from these.
            let rel = self.rel_path(ino)?;
            return match self.source.acl(&rel, acl).map_err(source_error)? {
                Some(value) => Ok(value),
                None => Err(FsError::NoAttr),
            };
        }
        if info.attr.kind == Kind::File && name == stats::CACHED_XATTR {
            return Ok(self
                .tiers
                .memory
                .cached_bytes_of(&info.version)
                .to_string()
                .into_bytes());
        }
        Err(FsError::NoAttr)
    }

    /// The names of the extended attributes of node `ino`, each followed by a NUL.
    pub fn listxattr(&self, ino: NodeId) -> Result<Vec<u8>, FsError> {
        if ino == order::ORDER_INO {
            return Ok(Vec::new());
        }
        let info = self.ns.info(ino).ok_or(FsError::NotFound)?;
        let mut names: Vec<String> = Vec::new();
        if ino == ROOT {
            names.push(stats::STATS_XATTR.to_string());
            names.extend(Stat::ALL.iter().map(|s| stats::xattr_name(*s)));
        }
        if info.attr.kind == Kind::File {
            names.push(stats::CACHED_XATTR.to_string());
        }
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(n.as_bytes());
            out.push(0);
        }
        Ok(out)
    }
}

/// True if directory `meta` last changed more than a second ago. Only then does its change
/// time tell a kept listing from a changed directory: on a filesystem with coarse timestamps
/// (a jiffy, a second), an entry added right after the listing was read could leave the
/// directory with the very time the listing saw.
fn settled(meta: &SourceMeta) -> bool {
    SystemTime::now()
        .duration_since(meta.attr.ctime)
        .is_ok_and(|age| age > Duration::from_secs(1))
}

/// What a caller is told of a source error: a missing entry is ENOENT, a refusal EACCES,
/// a path that no longer resolves as the node table recorded it ESTALE (the kernel then
/// looks the path up again and finds what is there now); anything else is a source fault.
fn source_error(e: io::Error) -> FsError {
    if e.kind() == io::ErrorKind::NotFound {
        FsError::NotFound
    } else if e.raw_os_error() == Some(libc::EACCES) {
        FsError::Access
    } else if is_moved(&e) || e.raw_os_error() == Some(libc::ESTALE) {
        FsError::Stale
    } else {
        FsError::Source(e)
    }
}
