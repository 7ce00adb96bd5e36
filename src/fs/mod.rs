//! The filesystem core: a read-only mirror of a dataset directory with a training-aware
//! cache, independent of FUSE.
//!
//! The FUSE adapter (`fuse/mod.rs`) turns kernel requests into calls on [`DatasetFs`] and its
//! plain results ([`Entry`], [`Attr`], [`Opened`]) back into replies; tests drive the core
//! directly.
//!
//! [`DatasetFs`] coordinates; the decisions live in the parts it holds, each of one concern:
//! - `Tree`: the source, the node table ([`Namespace`]) over it, the callers' credentials
//!   (`callers.rs`) and the scan;
//! - `Reads`: the tiers a block comes from ([`crate::tier`]; the read path, `read.rs`, asks
//!   them in order on the FUSE thread, the fetch behind them), the prefetcher
//!   ([`crate::prefetch`]), the jobs ([`crate::jobs`]) and the ledger where every access and
//!   byte is counted ([`crate::jobs::ledger`]);
//! - `Opener`: who opens files (`told/`), what the kernel keeps of them
//!   (`kernel_cache.rs`), passthrough (`passthrough.rs`), and what it is told when the source
//!   changes (`watch.rs`);
//! - the handle table (`handles.rs`), the order files (`order.rs`), the cluster membership
//!   (`cluster.rs`) and the mount's share of the elastic budget.
//!
//! Each request's work has its own file:
//! - `scan.rs`: the walk of the source at mount that fills the node table;
//! - `attrs.rs`: lookups, attributes, `access` and directory listings;
//! - `open.rs`: an open, in its steps; `plan.rs`: how the open is read (by the kernel from a
//!   backing file, through its page cache, or by the daemon), decided by a pure function;
//! - `read.rs`: the read path, and the dispatch of a READ (`DatasetFs::read_node`);
//! - `views.rs`: the statistics, as a snapshot and as extended attributes;
//! - `cluster.rs`: the mount as a member of a cluster (its peer server, etcd);
//! - `order.rs`: the order file, a control node that each operation checks for in one way
//!   (`order::control`) and that answers for itself;
//! - `handles.rs`, `kernel_cache.rs`, `callers.rs`: the handle table, the kernel-cache
//!   gauge, the callers' credentials;
//! - `passthrough.rs`: which opens the kernel reads from a backing file by itself;
//! - `takeover.rs`: what the core records for a successor daemon, and a mount taken over
//!   from an earlier one;
//! - `told/`, `watch.rs`, `control.rs`: opens the kernel makes and tells of, the watch of
//!   the source, the mount's control socket.

mod attrs;
mod callers;
mod cluster;
pub mod control;
mod handles;
mod kernel_cache;
mod open;
pub mod order;
mod passthrough;
mod plan;
mod read;
mod scan;
mod takeover;
mod told;
pub use told::told_by;
mod views;
mod watch;
pub use takeover::TakenOver;

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::cache::BlockCache;
use crate::config::{MountConfig, Opens};
use crate::jobs::ledger::Ledger;
use crate::jobs::{JobKeyKind, Jobs};
use crate::namespace::{Attr, Kind, Namespace, NodeId};
use crate::prefetch::Prefetcher;
use crate::source::{Creds, DatasetSource, FsStats, SourceError};
use crate::stats::Stats;
use crate::tier::Tiers;
use handles::{FileHandle, HandleTable};
use order::OrderFiles;
pub use passthrough::BackingFiles;
pub use plan::BUFFERED_MISS_MAX;
use scan::ScanState;

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
    /// A user's share of a bounded resource is taken (EDQUOT).
    #[error("{0}")]
    OverBudget(String),
    /// Too many at once: come back later (EBUSY).
    #[error("busy")]
    Busy,
    #[error("the source entry changed under its name (a component became a symlink or moved)")]
    Stale,
    #[error("source: {0}")]
    Source(#[from] SourceError),
    /// A block of a read could not be had: which, and why ([`crate::tier::error`]).
    #[error("{0}")]
    Read(crate::tier::error::ReadFailed),
}

impl From<io::Error> for FsError {
    fn from(e: io::Error) -> Self {
        FsError::Source(e.into())
    }
}

impl FsError {
    /// The errno a caller sees for it: the one map from errors to errnos, exhaustive, so
    /// that a new variant forces a decision.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotSymlink => libc::EINVAL,
            FsError::ReadOnly => libc::EROFS,
            FsError::Access => libc::EACCES,
            FsError::BadHandle => libc::EBADF,
            FsError::NoAttr => libc::ENODATA,
            FsError::Range => libc::ERANGE,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::NotSupported => libc::ENOTSUP,
            FsError::TooLarge => libc::EFBIG,
            FsError::NotTty => libc::ENOTTY,
            FsError::OverBudget(_) => libc::EDQUOT,
            FsError::Busy => libc::EBUSY,
            FsError::Stale => libc::ESTALE,
            FsError::Source(e) => e.errno(),
            FsError::Read(failed) => failed.error.errno(),
        }
    }
}

/// Who asks: what a FUSE request says of its process.
#[derive(Clone, Copy, Debug, Default)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// What the kernel is to forget.
#[derive(Clone, Debug)]
pub enum Invalidation {
    /// What it cached of a node: its attributes and pages.
    Inode(NodeId),
    /// Its attributes alone: safe at once from a FUSE thread, since no page lock is taken.
    Attrs(NodeId),
    /// A name in a directory (the directory's node, the name).
    Entry(NodeId, std::ffi::OsString),
    /// Not a forgetting: the whole bytes of a file of this version, for the kernel's page
    /// cache (`told/`); handed over only while the file is still that version
    /// ([`DatasetFs::hand_over`]).
    Store(
        NodeId,
        crate::namespace::FileVersion,
        Arc<crate::block::Block>,
    ),
}

/// Tells the kernel to forget what it cached: at once (from a thread that is no FUSE thread)
/// or soon (from one, which must not wait on the kernel). Set by the FUSE adapter; called
/// whenever the core finds that a source entry changed.
pub type Invalidator = Box<dyn Fn(Invalidation, bool) + Send + Sync>;

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
    /// The kernel reads the file from this backing file by itself (passthrough): neither
    /// `keep_cache` nor `direct_io` is set then.
    pub passthrough: Option<u32>,
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

/// The core of one mount: a coordinator. It answers the kernel's requests from the node
/// table, the handle table and the tiers, and tells the jobs (through the ledger) and the
/// prefetcher what happened; the decisions are theirs. Its state is in the parts below, each
/// of one concern: the tree the mount shows, what reads go through and count in, how opens
/// are answered, the open handles and order files, the cluster, the elastic budget.
pub struct DatasetFs {
    tree: Tree,
    reads: Reads,
    opener: Opener,
    handles: HandleTable,
    orders: OrderFiles,
    /// The mount as a member of a cluster (`cluster.rs`).
    membership: cluster::Membership,
    /// What the elastic budget keeps and sees of this mount.
    elastic: ElasticShare,
    /// The keeper's meta page, under a keeper: the daemons of the mount so far.
    handover: std::sync::OnceLock<Arc<crate::handover::state::Meta>>,
    /// What the stats say of the mount as it was made (source, mount point, policy, budget).
    info: Vec<(&'static str, String)>,
    // Last, so that it is dropped last: dropping the runtime waits for its I/O threads.
    _io: tokio::runtime::Runtime,
}

/// The tree the mount shows: the source, the node table over it, how long the kernel may
/// keep entries and attributes, the credentials of callers, the scan (`scan.rs`).
struct Tree {
    source: Arc<dyn DatasetSource>,
    ns: Arc<Namespace>,
    ttl: Duration,
    callers: callers::CallerCreds,
    scan: ScanState,
}

impl Tree {
    /// The path of node `ino` from the source's root.
    fn rel_path(&self, ino: NodeId) -> Result<PathBuf, FsError> {
        self.ns.path(ino).ok_or(FsError::NotFound)
    }
}

/// What reads go through and count in: the tiers a block comes from, the prefetcher, the
/// jobs and the ledger that tells them what happened.
struct Reads {
    tiers: Tiers,
    prefetcher: Arc<Prefetcher>,
    jobs: Arc<Jobs>,
    ledger: Arc<Ledger>,
}

/// How opens are answered (`open.rs`): by the daemon or the kernel (`told/`), with what the
/// kernel may keep of a file (`kernel_cache.rs`), read by passthrough or not
/// (`passthrough.rs`), and what the kernel must be told when the source changes (`watch.rs`).
struct Opener {
    kernel: kernel_cache::KernelCacheGauge,
    invalidator: std::sync::OnceLock<Invalidator>,
    /// Nodes whose source entry changed while the kernel was not told (see `open`).
    stale_in_kernel: Mutex<std::collections::HashSet<NodeId>>,
    /// Who opens files, and what the daemon is told of the opens it does not see
    /// (`told/`).
    opens: told::KernelOpens,
    /// Opens the kernel reads by itself (`passthrough.rs`).
    passthrough: passthrough::Passthrough,
    /// Neither `--no-passthrough`, `--opens kernel` nor `--read-delay` was given.
    passthrough_wanted: bool,
    /// `--read-delay` was given.
    read_delay: bool,
}

impl Opener {
    /// Why the kernel is not to be offered passthrough, if it is not: the option that turned
    /// it off.
    fn passthrough_refusal(&self) -> Option<&'static str> {
        if self.passthrough_wanted {
            None
        } else if self.opens.mode == Opens::Kernel {
            Some("--opens kernel: there is no open to answer with a backing file")
        } else if self.read_delay {
            Some("--read-delay: the daemon delays every read of the source")
        } else {
            Some("--no-passthrough")
        }
    }
}

impl std::fmt::Debug for DatasetFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetFs")
            .field("source", &self.tree.source.root())
            .field("cache", &self.reads.tiers.memory)
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
        Self::with_tiers(source, config, stats, disk, None)
    }

    /// [`DatasetFs::with_disk`], with the cache in `memory` a keeper holds (see
    /// [`BlockCache::kept`]): what a previous daemon's cache held there is taken over.
    pub fn with_tiers(
        source: Arc<dyn DatasetSource>,
        config: &MountConfig,
        stats: Arc<Stats>,
        disk: Option<Arc<crate::tier::disk::DiskTier>>,
        memory: Option<crate::cache::CacheMemory>,
    ) -> io::Result<Self> {
        let root =
            (source.metadata(Path::new(""), &Creds::DAEMON)).map_err(SourceError::into_io)?;
        if root.attr.kind != Kind::Dir {
            return Err(SourceError::NotDir.into_io());
        }
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(config.io_threads.max(1))
            .thread_name("coorfs-io")
            // Sockets and timers, for the peer server and etcd client of a cluster member.
            .enable_io()
            .enable_time()
            .build()?;
        let cache = match memory {
            Some(memory) => BlockCache::kept(config.cache, memory)?,
            None => BlockCache::new(config.cache)?,
        };
        // --read-delay delays the daemon's reads of the source: the kernel must not read it.
        let passthrough_wanted =
            config.passthrough && config.opens != Opens::Kernel && config.read_delay.is_zero();
        if passthrough_wanted && cache.caches() && !cache.evicts() {
            // Cached files the kernel can read itself; without them, passthrough is still
            // used for files the cache will not keep.
            let pages = crate::cache::kernel_files::pages_for(&config.source);
            if let Err(e) = cache.keep_files_for_kernel(pages) {
                tracing::debug!("no private tmpfs for cached files: {e}");
            }
        }
        match cache.restore() {
            Ok(r) if r.blocks + r.dropped > 0 => tracing::info!(
                "cache taken over: {} blocks, {} ({} blocks not kept)",
                r.blocks,
                crate::units::format_size(r.bytes),
                r.dropped
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!("the previous daemon's cache is not taken over: {e}"),
        }
        // Object stores are read in parts; a directory block by block.
        let object_store = crate::source::object::ObjectUrl::is_url(&config.source);
        let tiers = Tiers::new(
            cache,
            config.prefetch.staging_bytes(),
            (
                if object_store { config.part_size } else { 0 },
                config.prefetch.memory,
            ),
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
            ("cache_budget", budget_mode(config).to_string()),
        ];
        let handles = HandleTable::default();
        let raised = rustix::process::geteuid().is_root();
        handles.set_window(if raised { config.readahead } else { 0 });
        Ok(DatasetFs {
            tree: Tree {
                source,
                ns,
                ttl: config.metadata_ttl,
                callers: Default::default(),
                scan: ScanState {
                    room: config.metadata_room,
                    ..Default::default()
                },
            },
            reads: Reads {
                tiers,
                prefetcher: Arc::new(prefetcher),
                jobs,
                ledger,
            },
            opener: Opener {
                kernel: Default::default(),
                invalidator: std::sync::OnceLock::new(),
                stale_in_kernel: Default::default(),
                opens: told::KernelOpens::new(
                    config.opens,
                    config.mountpoint.clone(),
                    config.allow_other && !config.acl,
                ),
                passthrough: Default::default(),
                passthrough_wanted,
                read_delay: !config.read_delay.is_zero(),
            },
            handles,
            orders: OrderFiles::new(
                config.hint_limits,
                config.jobs.key == JobKeyKind::None,
                config.owner_uid,
            ),
            info,
            membership: cluster::Membership::new(config.cluster.clone()),
            elastic: ElasticShare {
                state: Arc::new(crate::elastic::BudgetState {
                    why: Mutex::new(config.cache_size_why.clone()),
                    ..Default::default()
                }),
                staging_peak: Default::default(),
                staging_budget: config.prefetch.staging_bytes(),
            },
            handover: std::sync::OnceLock::new(),
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
        self.tree.ttl
    }

    /// OPEN is answered `ENOSYS`, so that the kernel stops sending it (and FLUSH and RELEASE):
    /// it checks permissions itself from the attributes it caches (`default_permissions`)
    /// and keeps every file's pages. A hot file then costs no round trip at all (`told/`).
    pub fn kernel_opens(&self) -> bool {
        self.opener.opens.refuse_open()
    }

    /// The kernel may come to open files itself (`--opens` other than `daemon`): it should
    /// drop a file's pages when fresh attributes show a change.
    pub fn kernel_may_open(&self) -> bool {
        self.opener.opens.mode != Opens::Daemon
    }

    /// Why the adapter is not to offer the kernel passthrough at INIT, if it is not: the
    /// option that turned it off.
    pub fn passthrough_refusal(&self) -> Option<&'static str> {
        self.opener.passthrough_refusal()
    }

    /// True once INIT (this daemon's, or an earlier one's) started passthrough.
    pub fn passthrough_started(&self) -> bool {
        self.opener.passthrough.started()
    }

    /// The kernel agreed to passthrough at INIT: backing files are registered with `kernel`
    /// from now on. Said once in the log.
    pub fn start_passthrough(&self, kernel: Box<dyn BackingFiles>) {
        self.opener.passthrough.start(kernel);
        tracing::info!(
            "passthrough: on: the kernel reads cached files over 64 KiB, and files the cache \
             will not keep, without the daemon"
        );
    }

    /// Passthrough is not to be had (`why`): every read goes through the daemon, and the
    /// cache keeps new blocks in its arena. Said once in the log.
    pub fn passthrough_unavailable(&self, why: &str) {
        self.reads.tiers.memory.stop_keeping_files_for_kernel();
        tracing::info!("passthrough: off ({why}): reads go through the daemon");
    }

    /// Sets how the core tells the kernel to forget a changed node (once).
    pub fn set_invalidator(&self, invalidate: Invalidator) {
        let _ = self.opener.invalidator.set(invalidate);
    }

    /// Sends `store` (an [`Invalidation::Store`]) to the kernel with `send` (true if the kernel
    /// took it), only while its file is the version its bytes are of: checked before, and
    /// after (a change between the two is forgotten again: the watch's own invalidation may
    /// have reached the kernel before the bytes). Counts what stays (`kernel_stores`).
    pub fn hand_over(&self, store: &Invalidation, send: &dyn Fn(&Invalidation) -> bool) {
        let Invalidation::Store(ino, version, _) = store else {
            return;
        };
        let current = || {
            self.tree
                .ns
                .info(*ino)
                .is_some_and(|i| i.version == *version)
        };
        if !(current() && send(store)) {
            return;
        }
        if current() {
            crate::stats::Counters::add(&self.reads.ledger.stats().counters.kernel_stores, 1);
        } else {
            send(&Invalidation::Inode(*ino));
        }
    }

    /// A fresh `lstat` of `rel` as `who`, with when it began: the number is taken before the
    /// system call, so that a look landing late is known for one ([`crate::namespace::Look`]).
    fn look_at(
        &self,
        rel: &Path,
        who: &Creds,
    ) -> crate::source::SourceResult<(crate::namespace::SourceMeta, crate::namespace::Look)> {
        let look = self.tree.ns.look();
        self.tree.source.metadata(rel, who).map(|meta| (meta, look))
    }

    /// Records a fresh `lstat` of node `ino`; if the source entry changed, the kernel
    /// forgets what it cached of it. Returns true if it changed.
    fn refresh(
        &self,
        ino: NodeId,
        meta: crate::namespace::SourceMeta,
        look: Option<crate::namespace::Look>,
    ) -> bool {
        let changed = self.tree.ns.refresh(ino, meta, look);
        if changed {
            self.invalidate(ino);
        }
        changed
    }

    /// The credentials to act with for `caller`.
    fn creds(&self, caller: Caller) -> Creds {
        self.tree.callers.get(caller, self.reads.ledger.now())
    }

    fn rel_path(&self, ino: NodeId) -> Result<PathBuf, FsError> {
        self.tree.rel_path(ino)
    }

    /// Starts the prefetch thread (see [`crate::prefetch`]).
    pub fn start_prefetcher(&self) -> std::io::Result<()> {
        self.reads.prefetcher.start()
    }

    /// The elastic budget's state, for its watcher to keep and the stats to show.
    pub fn budget_state(&self) -> Arc<crate::elastic::BudgetState> {
        self.elastic.state.clone()
    }

    /// Capacity of the filesystem holding the source.
    pub fn statfs(&self) -> Result<FsStats, FsError> {
        Ok(self.tree.source.statfs()?)
    }

    /// Writes the blocks the disk tier has queued and stops its writer: at unmount.
    pub fn close_disk(&self) {
        if let Some(disk) = &self.reads.tiers.disk {
            disk.close();
        }
    }
}

/// What a caller is told of a source error: a missing entry is ENOENT, the source's
/// permission check EACCES, a path that no longer resolves as the node table recorded it
/// ESTALE (the kernel then looks the path up again and finds what is there now); anything
/// else is a source fault, logged with its cause (a store's refusal in its words).
fn source_error(e: SourceError) -> FsError {
    match e {
        SourceError::NotFound => FsError::NotFound,
        SourceError::Changed => FsError::Stale,
        e if e.is_moved() => FsError::Stale,
        SourceError::Io(e) if e.raw_os_error() == Some(libc::EACCES) => FsError::Access,
        e => FsError::Source(e),
    }
}

/// How the cache budget is set: `auto` (elastic), `fixed` (`--cache-size`), `none`.
fn budget_mode(config: &MountConfig) -> &'static str {
    if !config.cache.policy.caches() {
        "none"
    } else if config.cache.ceiling.is_some() {
        "auto"
    } else {
        "fixed"
    }
}

/// What the elastic budget (`crate::elastic`) keeps and sees of a mount.
#[derive(Debug)]
struct ElasticShare {
    /// The cache budget's moves, if it is elastic, for the stats.
    state: Arc<crate::elastic::BudgetState>,
    /// The most the staging area has held, as the elastic budget saw it.
    staging_peak: std::sync::atomic::AtomicU64,
    /// The staging area's budget as set at mount (an elastic budget lowers it beside a small
    /// cache, `crate::elastic::staging_beside`).
    staging_budget: u64,
}

impl crate::elastic::Elastic for DatasetFs {
    fn capacity(&self) -> u64 {
        self.reads.tiers.memory.capacity()
    }

    fn used(&self) -> u64 {
        self.reads.tiers.memory.used()
    }

    /// What the staging area held at its fullest, less what it holds: on bandwidth-bound
    /// storage the prefetcher keeps a block or two in flight and its budget stays unused, so
    /// the cache may have it; on latency-bound storage it fills at once, and keeps it. And
    /// likewise the object store's parts in flight: the memory they took at their most.
    fn staging_unfilled(&self) -> u64 {
        let staging = &self.reads.tiers.staging;
        let now = staging.bytes();
        let peak = (self.elastic.staging_peak)
            .fetch_max(now, std::sync::atomic::Ordering::Relaxed)
            .max(now);
        let parts = self.reads.tiers.fetcher.parts_unfilled();
        peak.min(staging.capacity()).saturating_sub(now) + parts
    }

    fn kernel_windows(&self) -> u64 {
        self.handles.windows_peak()
    }

    fn resize(&self, capacity: u64) -> u64 {
        let done = self.reads.tiers.memory.resize(capacity);
        self.resized(done)
    }

    fn hold(&self, capacity: u64) -> u64 {
        let done = self.reads.tiers.memory.hold(capacity);
        self.resized(done)
    }
}

impl DatasetFs {
    /// After the cache was resized: the kernel's registrations of the files it dropped go
    /// too, so that their memory really returns, and the staging area follows the cache's
    /// new capacity. Returns the bytes given back.
    fn resized(&self, done: crate::cache::Resized) -> u64 {
        self.opener.passthrough.forget(&done.dropped);
        let capacity = self.reads.tiers.memory.capacity();
        let staging = crate::elastic::staging_beside(capacity, self.elastic.staging_budget);
        let shed = self.reads.tiers.staging.resize(staging);
        done.freed + shed
    }
}
