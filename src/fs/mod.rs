//! The filesystem core: a read-only mirror of a dataset directory with a training-aware
//! cache, independent of FUSE.
//!
//! `fuse.rs` turns kernel requests into calls on [`DatasetFs`] and its plain results
//! ([`Entry`], [`Attr`], [`Opened`]) back into replies; tests drive the core directly.
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
//!   use `direct_io` as well ([`kernel_cache`]).
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
mod control;
mod kernel_cache;
mod prefetch;
mod read;

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::block::Block;
use crate::cache::{BlockCache, BlockKey};
use crate::config::MountConfig;
use crate::epoch::Step;
use crate::jobs::{Job, JobKey, Jobs};
use crate::namespace::{Attr, FileVersion, Kind, Namespace, NodeId, ROOT};
use crate::prefetch::PrefetchConfig;
use crate::source::beneath::is_moved;
use crate::source::{Creds, DatasetSource, FsStats, Listing};
use crate::stats::{self, Counters, EpochRecord, Snapshot, Stat, Stats, Value};
use crate::tier::fetch::Fetcher;
use crate::tier::recent::RecentBlocks;
use crate::tier::source::SourceTier;
use crate::tier::staging::Staging;
use crate::tier::{Want, Why};

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
    /// The daemon must see `close(2)` (a FLUSH), where it answers for what was written.
    pub flush: bool,
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
}

/// Called with the bytes of a read (or its error), possibly on another thread.
pub type ReadDone = Box<dyn FnOnce(Result<&[u8], FsError>) + Send>;

/// Blocks an open file holds outside the cache.
#[derive(Debug, Default)]
struct Held {
    /// Blocks the prefetcher staged for this file, claimed by this open, or taken from the
    /// blocks read moments ago; freed at close.
    claimed: Vec<(u64, Arc<Block>)>,
    /// The last block fetched for this handle, so that small reads through a block the
    /// cache did not admit do not fetch it again.
    last: Option<(u64, Arc<Block>)>,
}

impl Held {
    fn get(&self, block: u64) -> Option<Arc<Block>> {
        self.claimed
            .iter()
            .chain(self.last.iter())
            .find(|(b, _)| *b == block)
            .map(|(_, data)| data.clone())
    }
}

/// An open file.
#[derive(Debug)]
struct FileHandle {
    rel: Arc<Path>,
    version: FileVersion,
    /// The source file as opened for the caller (with the caller's credentials). Reads
    /// check it for changes made while the file is open, and read it directly when the path
    /// now names another file (replaced or removed), as a local open descriptor would.
    file: std::fs::File,
    /// The open was a hit and its bytes were counted then; reads count nothing more (unless
    /// the file turns out to need the source after all, see `read.rs`).
    counted_at_open: AtomicBool,
    /// The dataset-wide epoch the open belongs to.
    epoch: u64,
    /// The job that opened the file, and its epoch then.
    job: Arc<Mutex<Job>>,
    job_key: JobKey,
    job_epoch: u64,
    /// This open re-reads what the job read moments ago: it is the same access and may take
    /// the blocks read then (see [`crate::tier::recent`]).
    same_access: bool,
    held: Mutex<Held>,
    /// Set on a sentinel file's `keep_cache` open: is the kernel keeping its pages?
    watch: Option<kernel_cache::Watch>,
    /// The node opened, for invalidation.
    ino: NodeId,
    /// A read found the source file changed since the open.
    changed_while_open: AtomicBool,
    /// Opened for one read under `--fast-open` that is not the file's access (see
    /// [`Access::Silent`]): it counts the bytes it moves, never a hit or a miss.
    silent: bool,
}

/// How an open of a file is accounted. A FUSE OPEN is the job's access of the file. Under
/// `--fast-open` the kernel sends no OPEN and each READ that misses the kernel's page cache
/// opens the file for itself: the READ at offset 0 (where the kernel starts a file) is the
/// access, the others are [`Access::Silent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    Counted,
    Silent,
}

impl FileHandle {
    /// Block `block` of the file, wanted by this open's reader.
    fn want(&self, block: u64) -> Want<'_> {
        Want {
            key: BlockKey {
                version: self.version,
                block,
            },
            rel: &self.rel,
            job: self.job_key,
            epoch: self.job_epoch,
            why: if self.same_access {
                Why::Reread
            } else {
                Why::Read
            },
        }
    }

    /// Applies `change` to the records of the dataset epoch and the job epoch of this open.
    fn update_epochs(&self, stats: &Stats, change: impl Fn(&mut EpochRecord)) {
        stats.epochs.lock().update(self.epoch, &change);
        self.job.lock().log.update(self.job_epoch, &change);
    }
}

/// An open directory: a snapshot of its listing taken at `opendir`.
#[derive(Debug)]
struct DirHandle {
    node: NodeId,
    parent: NodeId,
    listing: Listing,
}

/// What the scan of the source found.
#[derive(Debug, Default)]
struct ScanState {
    files: AtomicU64,
    bytes: AtomicU64,
    complete: AtomicBool,
}

/// The core of one mount.
pub struct DatasetFs {
    source: Arc<dyn DatasetSource>,
    ns: Namespace,
    ttl: Duration,
    cache: Arc<BlockCache>,
    stats: Arc<Stats>,
    fetcher: Arc<Fetcher>,
    jobs: Jobs,
    /// The uid that mounted: under `--job-key none`, the only user (with root) who may hint.
    owner: u32,
    staging: Arc<Staging>,
    /// Blocks read moments ago that the cache did not keep, for re-reads (a double open).
    recent: Arc<RecentBlocks>,
    kernel: kernel_cache::KernelCacheGauge,
    prefetch: PrefetchConfig,
    prefetcher: prefetch::PrefetchState,
    scan: ScanState,
    info: Vec<(&'static str, String)>,
    next_fh: AtomicU64,
    files: Mutex<std::collections::HashMap<u64, Arc<FileHandle>>>,
    dirs: Mutex<std::collections::HashMap<u64, Arc<DirHandle>>>,
    orders: Mutex<std::collections::HashMap<u64, control::OrderWriter>>,
    hints: crate::jobs::HintBudget,
    callers: callers::CallerCreds,
    invalidator: std::sync::OnceLock<Invalidator>,
    metadata_room: Option<u64>,
    metadata_warned: AtomicBool,
    /// `--fast-open`: the kernel opens files without asking (see [`DatasetFs::fast_open`]).
    fast_open: bool,
    /// Nodes whose source entry changed while the kernel was not told (see `open`).
    stale_in_kernel: Mutex<std::collections::HashSet<NodeId>>,
    // Last, so that it is dropped last: dropping the runtime waits for its I/O threads.
    _io: tokio::runtime::Runtime,
}

impl std::fmt::Debug for DatasetFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetFs")
            .field("source", &self.source.root())
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl DatasetFs {
    /// A core over `source` with the cache of `config`. Fails if the source root cannot be
    /// read or the cache cannot be set up.
    pub fn new(source: Arc<dyn DatasetSource>, config: &MountConfig) -> io::Result<Self> {
        let root = source.metadata(Path::new(""), &Creds::DAEMON)?;
        if root.attr.kind != Kind::Dir {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(config.io_threads.max(1))
            .thread_name("coorfs-io")
            .build()?;
        let cache = Arc::new(BlockCache::new(config.cache)?);
        let blocks = cache.blocks();
        let recent = Arc::new(RecentBlocks::new(cache.caches()));
        let stats = Arc::new(Stats::default());
        let source_tier = SourceTier::new(source.clone(), cache.blocks(), stats.clone());
        let fetcher = Arc::new(Fetcher::new(
            vec![Arc::new(source_tier)],
            cache.clone(),
            recent.clone(),
            stats.clone(),
            io.handle().clone(),
        ));
        let info = vec![
            ("source", config.source.display().to_string()),
            ("mountpoint", config.mountpoint.display().to_string()),
            ("policy", config.cache.policy.name().to_string()),
        ];
        Ok(DatasetFs {
            source,
            ns: Namespace::new(root),
            ttl: config.metadata_ttl,
            cache,
            stats,
            fetcher,
            jobs: Jobs::new(config.jobs),
            staging: Arc::new(Staging::new(
                if config.prefetch.enabled {
                    config.prefetch.memory
                } else {
                    0
                },
                blocks,
            )),
            recent,
            kernel: Default::default(),
            prefetch: config.prefetch,
            prefetcher: prefetch::PrefetchState::new(config.prefetch),
            scan: ScanState::default(),
            info,
            next_fh: AtomicU64::new(1),
            files: Mutex::new(Default::default()),
            dirs: Mutex::new(Default::default()),
            orders: Mutex::new(Default::default()),
            hints: crate::jobs::HintBudget::new(config.hint_limits),
            callers: Default::default(),
            invalidator: std::sync::OnceLock::new(),
            stale_in_kernel: Default::default(),
            metadata_room: config.metadata_room,
            metadata_warned: AtomicBool::new(false),
            fast_open: config.fast_open,
            owner: config.owner_uid,
            _io: io,
        })
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
        self.callers.get(caller, self.stats.now())
    }

    fn rel_path(&self, ino: NodeId) -> Result<PathBuf, FsError> {
        self.ns.path(ino).ok_or(FsError::NotFound)
    }

    /// Walks the whole source, entering every entry into the namespace and counting the
    /// dataset's files and bytes. Epochs can end ("every file read") only once it is done.
    /// Runs on the caller's thread; the daemon gives it one of its own.
    pub fn scan(&self) {
        let mut dirs = vec![(ROOT, PathBuf::new())];
        while let Some((node, rel)) = dirs.pop() {
            let items = match self.source.read_dir(&rel, &Creds::DAEMON) {
                Ok(items) => items,
                Err(e) => {
                    tracing::warn!("scan: {}: {e}", self.source.root().join(&rel).display());
                    continue;
                }
            };
            self.check_metadata_room();
            for item in items {
                let meta = item.meta;
                let id = self.ns.insert_child(node, &item.name, meta);
                match meta.attr.kind {
                    Kind::Dir => dirs.push((id, rel.join(&item.name))),
                    Kind::File => {
                        self.scan.files.fetch_add(1, Ordering::Relaxed);
                        self.scan.bytes.fetch_add(meta.attr.size, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        }
        let _ = self
            .prefetcher
            .disk_order
            .set(self.ns.files_in_inode_order());
        self.ns.shrink();
        self.scan.complete.store(true, Ordering::Release);
        self.wake_prefetcher();
        tracing::info!(
            "scan complete: {} files, {}",
            self.scan.files.load(Ordering::Relaxed),
            crate::units::format_size(self.scan.bytes.load(Ordering::Relaxed))
        );
    }

    /// Warns (once) when the node table grows past the room the budget left it: the daemon
    /// is then on its way past its memory (cgroup) limit, and the kernel would kill it.
    fn check_metadata_room(&self) {
        let Some(room) = self.metadata_room else {
            return;
        };
        let used = self.ns.memory() as u64;
        if used > room && !self.metadata_warned.swap(true, Ordering::Relaxed) {
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
        self.metadata_warned.load(Ordering::Relaxed)
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
        if parent == ROOT && name == control::ORDER_FILE {
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
        if ino == control::ORDER_INO {
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
        if ino == control::ORDER_INO {
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

    /// Opens file `ino` for reading (or the order file for writing). `flags` are the
    /// `open(2)` flags.
    pub fn open(&self, ino: NodeId, flags: i32, caller: Caller) -> Result<Opened, FsError> {
        self.open_file(ino, flags, caller, Access::Counted)
    }

    /// [`DatasetFs::open`], accounted as `access` says.
    pub(crate) fn open_file(
        &self,
        ino: NodeId,
        flags: i32,
        caller: Caller,
        access: Access,
    ) -> Result<Opened, FsError> {
        if ino == control::ORDER_INO {
            return self.open_order(flags, caller);
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY
            || flags & (libc::O_TRUNC | libc::O_APPEND) != 0
        {
            return Err(FsError::ReadOnly);
        }
        let info = self.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let rel = self.rel_path(ino)?;
        // Opened as the caller: the source checks modes, ACLs and every directory's search
        // permission now, whatever the kernel's cached attributes said.
        let creds = self.creds(caller);
        let (file, meta) = match self.source.open_file(&rel, &creds) {
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
        let version = meta.version;
        let size = version.size;
        let now = self.stats.now();

        let hit = self.cache.holds_file(&version);
        let total = self.dataset_files();
        let job = self.jobs.get(caller.pid, caller.uid, now);
        if access == Access::Silent {
            let (job_key, job_epoch) = {
                let j = job.lock();
                (j.key, j.epoch())
            };
            let epoch = self.stats.epochs.lock().tracker().epoch();
            return Ok(self.new_handle(FileHandle {
                rel: Arc::from(rel),
                version,
                file,
                counted_at_open: AtomicBool::new(hit),
                epoch,
                job,
                job_key,
                job_epoch,
                same_access: true,
                held: Mutex::default(),
                watch: None,
                ino,
                changed_while_open: AtomicBool::new(false),
                silent: true,
            }));
        }
        // The job's lock is held from taking the staged blocks to counting the access: of two
        // opens of a file by one job (a check and a decode, two workers sharing it), the one
        // its epoch counts first takes them, and the other finds them among the recent blocks.
        let mut j = job.lock();
        let job_key = j.key;
        // The prefetcher's blocks of this file are now this open's.
        let claimed = if hit {
            Vec::new()
        } else {
            self.claim_staged(&version, job_key)
        };
        let staged = !claimed.is_empty() && claimed.len() as u64 == self.cache.blocks().count(size);
        let (job_epoch, step) = match info.file_id {
            Some(file) => {
                j.last_access = now;
                let (job_epoch, step) = j.log.open(file, caller.pid, hit, size, total, now);
                if staged {
                    j.log.update(job_epoch, |r| r.staging_hits += 1);
                }
                (job_epoch, Some(step))
            }
            None => (j.epoch(), None),
        };
        let turned = matches!(step, Some(Step::Completed | Step::Restarted { .. }));
        if turned {
            j.epoch_changed();
        }
        let current = j.epoch();
        drop(j);
        if turned {
            self.staging_after_epoch(&job, job_key, current);
            self.wake_prefetcher();
        }

        let counters = &self.stats.counters;
        Counters::add(&counters.reads, 1);
        if hit {
            Counters::add(&counters.hits, 1);
            Counters::add(&counters.bytes_from_cache, size);
        } else {
            Counters::add(&counters.misses, 1);
        }
        if staged {
            Counters::add(&counters.staging_hits, 1);
        }
        let mut log = self.stats.epochs.lock();
        let epoch = match info.file_id {
            Some(file) => log.open(file, caller.pid, hit, size, total, now).0,
            None => log.tracker().epoch(),
        };
        if staged {
            log.update(epoch, |r| r.staging_hits += 1);
        }
        drop(log);
        // A re-read within the epoch, or a second look right after it ended; not a read that
        // may be the new epoch's first of the file.
        let same_access = matches!(step, Some(Step::Repeat | Step::Trailing));
        // A staged hit freed room: refill it now. A miss may leave the prefetcher work (and
        // it should see a job become active). A hit changes nothing it plans from, and
        // waking a thread per open costs CPU that a hot epoch needs.
        if staged {
            self.refill_staging(&job);
        } else if !hit {
            self.wake_prefetcher();
        }

        let (keep_cache, direct_io, watch) = if self.cache.caches() {
            let (keep, watch) = match info.file_id {
                Some(file) if hit && !changed => self.kernel.open(file),
                _ => (false, None),
            };
            (keep, !keep, watch)
        } else {
            (!changed, false, None)
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            "open {} fh {fh} by {job_key} (pid {}): {} (epoch {epoch}, job epoch {job_epoch}, {step:?})",
            rel.display(),
            caller.pid,
            if hit {
                "hit"
            } else if staged {
                "staged"
            } else {
                "miss"
            }
        );
        let handle = FileHandle {
            rel: Arc::from(rel),
            version,
            file,
            counted_at_open: AtomicBool::new(hit),
            epoch,
            job,
            job_key,
            job_epoch,
            same_access,
            held: Mutex::new(Held {
                claimed,
                last: None,
            }),
            watch,
            ino,
            changed_while_open: AtomicBool::new(false),
            silent: false,
        };
        self.files.lock().insert(fh, Arc::new(handle));
        Ok(Opened {
            fh,
            keep_cache,
            direct_io,
            changed,
            flush: false,
        })
    }

    /// Enters an open file of no kernel open (see [`Access::Silent`]) in the handle table.
    fn new_handle(&self, handle: FileHandle) -> Opened {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(fh, Arc::new(handle));
        Opened {
            fh,
            keep_cache: true,
            direct_io: false,
            changed: false,
            flush: false,
        }
    }

    /// Closes open file `fh`.
    pub fn release(&self, fh: u64) {
        let handle = self.files.lock().remove(&fh);
        match handle.as_ref().map(|h| &h.watch) {
            Some(Some(watch)) => self.kernel.closed(watch),
            Some(None) => {}
            None => self.release_order(fh),
        }
    }

    /// Opens directory `ino` for `caller` (who must be allowed to read it now) and takes a
    /// snapshot of its listing.
    pub fn opendir(&self, ino: NodeId, caller: Caller) -> Result<u64, FsError> {
        let info = self.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let listing = self
            .source
            .list_dir(&self.rel_path(ino)?, &self.creds(caller))
            .map_err(source_error)?;
        let parent = self.ns.parent(ino).ok_or(FsError::NotFound)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let handle = DirHandle {
            node: ino,
            parent,
            listing,
        };
        self.dirs.lock().insert(fh, Arc::new(handle));
        Ok(fh)
    }

    /// Lists directory `fh` from `offset`, handing entries to `add` until it returns true
    /// (the reply is full). With `plus`, every entry carries its attributes.
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(DirEntryOut<'_>) -> bool,
    ) -> Result<(), FsError> {
        let dir = self
            .dirs
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)?;
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
            };
            if add(entry) {
                return Ok(());
            }
        }
        let start = offset.saturating_sub(2) as usize;
        for (i, (name, listed_kind)) in dir.listing.names.iter().enumerate().skip(start) {
            // An entry's lstat only when the kernel asks for its attributes or coorfs does
            // not know it yet; one gone since the listing is left out.
            let known = self.ns.child(dir.node, name);
            let (ino, kind, attr) = match (known, plus) {
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
            let entry = DirEntryOut {
                ino,
                next: i as u64 + 3,
                kind,
                name,
                attr,
            };
            if add(entry) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Closes directory `fh`.
    pub fn releasedir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
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

    /// Every stat, now.
    pub fn snapshot(&self) -> Snapshot {
        let c = &self.stats.counters;
        let cc = &self.cache.counters;
        let reads = Counters::get(&c.reads);
        let hits = Counters::get(&c.hits);
        let epochs = self.stats.epochs.lock();
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
                Stat::CachedBytes => Value::Count(self.cache.cached_bytes()),
                Stat::CachedFiles => Value::Count(self.cache.cached_files()),
                Stat::CachedBlocks => Value::Count(self.cache.cached_blocks()),
                Stat::CacheUsed => Value::Count(self.cache.used()),
                Stat::CacheCapacity => Value::Count(self.cache.config().capacity),
                Stat::MetadataBytes => Value::Count(self.ns.memory() as u64),
                Stat::AdmissionsRefused => Value::Count(cc.refused.load(Ordering::Relaxed)),
                Stat::Evictions => Value::Count(cc.evicted.load(Ordering::Relaxed)),
                Stat::SourceErrors => Value::Count(Counters::get(&c.source_errors)),
                Stat::TierErrors => Value::Count(Counters::get(&c.tier_errors)),
                Stat::FetchStallSeconds => {
                    Value::Ratio(Counters::get(&c.fetch_stall_us) as f64 / 1e6)
                }
                Stat::StagingHits => Value::Count(Counters::get(&c.staging_hits)),
                Stat::PrefetchedBlocks => Value::Count(Counters::get(&c.prefetched_blocks)),
                Stat::PrefetchedUnused => Value::Count(Counters::get(&c.prefetched_unused)),
                Stat::StagingBytes => Value::Count(self.staging.bytes()),
                Stat::PrefetchMemory => Value::Count(self.staging.capacity()),
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
                Stat::UptimeSeconds => Value::Count(self.stats.now() as u64),
                Stat::Pid => Value::Count(std::process::id() as u64),
            }
        };
        let values = Stat::ALL.iter().map(|s| (*s, value(*s))).collect();
        let records = epochs.records().to_vec();
        drop(epochs);
        Snapshot {
            values,
            info: self.info.clone(),
            epochs: records,
            jobs: serde_json::to_value(self.jobs.summaries(self.stats.now())).unwrap_or_default(),
        }
    }

    /// The value of extended attribute `name` of node `ino`.
    pub fn getxattr(&self, ino: NodeId, name: &OsStr) -> Result<Vec<u8>, FsError> {
        if ino == control::ORDER_INO {
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
                .cache
                .cached_bytes_of(&info.version)
                .to_string()
                .into_bytes());
        }
        Err(FsError::NoAttr)
    }

    /// The names of the extended attributes of node `ino`, each followed by a NUL.
    pub fn listxattr(&self, ino: NodeId) -> Result<Vec<u8>, FsError> {
        if ino == control::ORDER_INO {
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
