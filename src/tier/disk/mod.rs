//! The disk tier: a second MinIO cache on local disk, below memory, that outlives the daemon.
//!
//! Cloud training nodes have fast local NVMe and lose their memory at every restart. With
//! `--cache-dir DIR --disk-cache-size SIZE`, blocks read from the source are written to DIR
//! while there is room, and never evicted (the MinIO policy: under a random order per epoch,
//! keeping the first bytes that fit is the best any cache does). A later fetch finds them here
//! before asking peers or the source, and the memory tier fills from it as from the source. A
//! restarted daemon (unmounted, killed with `kill -9`, or after a reboot) opens the same
//! directory and finds every block it wrote: epoch 1 after a restart hits what the disk holds.
//!
//! # What the disk keeps: first what memory does not
//! Over a memory cache that never evicts (MinIO), a block the memory cache keeps is written
//! here too only while the disk has room for it and for every byte of the dataset that
//! neither tier holds ([`DiskTier::keeps_copy`]); blocks memory does not keep are written
//! while there is room. Both tiers keep the first bytes that fit, so writing every block made
//! the disk a copy of memory plus a little: a dataset of 240 MiB over 122 MiB of memory and
//! 188 MiB of disk read 21% of itself from the source every epoch, where the two together
//! hold it all. A disk as large as the dataset still gets every block, so a restart finds
//! them all; a smaller one trades the copies for blocks memory lacks, and a restarted daemon
//! reads the memory cache's share from the source once. The same rule holds the other way
//! up: memory keeps a block found here only while it has room for it and for every byte
//! neither tier holds ([`DiskTier::memory_keeps_copy`]), so after a restart it fills first
//! with what the disk lacks, not with copies of what the disk serves. Over an evicting cache
//! (LRU) or none, every block is written while there is room.
//!
//! # Layout
//! DIR holds three files, each created `0600`, opened without following symlinks:
//! - `lock`: held with `flock` for the daemon's life, with its pid, so that a second daemon
//!   is refused the directory instead of writing into it too.
//! - `data`: the blocks, appended in large sequential writes: what the writer has queued, up
//!   to 8 MiB, is one `O_DIRECT` write of whole pages from a page boundary, synced (the
//!   last page padded). Within a batch a block of 64 KiB or more starts on a page, so that it
//!   is read with `O_DIRECT` straight into its page-aligned buffer; smaller ones are packed.
//!   Reads use `O_DIRECT` too. Neither touches the page cache, which belongs to the jobs (in
//!   a memory cgroup, dirty pages would also throttle the writer); a filesystem that refuses
//!   `O_DIRECT` gets buffered I/O that drops its pages after each read and write.
//! - `index`: a log of fixed 72-byte records, one per block written (or dropped: a tombstone),
//!   appended and synced after the block's bytes are synced. A record names the block by a hash
//!   of the file's path (xxh3, the same on every machine and build, seeded with the hash of the
//!   source's root so that datasets mounted in turn keep apart) and its number, and carries the
//!   source version it was read from (inode, size, mtime, ctime), where its bytes are, their
//!   CRC32C, and a CRC32C of the record itself.
//!
//! # Never serving what is wrong
//! - A record whose CRC does not match (the tail of a log cut by `kill -9` or a crash) ends
//!   the log: it is cut there. A record pointing past the end of `data` is dropped.
//! - A block is served only for the version it was read from: a file changed in the source
//!   since (another size, mtime or ctime, or another inode at the path) is a miss, and its
//!   blocks are dropped. Two paths whose hashes collide could only be served for each other
//!   if both were the same inode with the same times and size: the same file.
//! - The bytes' CRC32C is checked the first time each block is read after the directory is
//!   opened, and on one read in [`SAMPLE_EVERY`] after that. A torn or corrupted block is
//!   dropped (a tombstone in the log) and fetched again from below, never served.
//! - A write or read error (a full disk: ENOSPC) disables the tier with one log line; reads
//!   go on from the tiers below.
//!
//! Space of dropped blocks is not reused while mounted (the log only grows); a directory
//! found at mount with more than half its budget in dropped blocks (a dataset that changed)
//! starts afresh. One found holding more than its budget (a smaller `--disk-cache-size` at a
//! remount) drops the blocks past the budget, keeping the first written ([`shrink`]). A directory written with another block size is started
//! afresh (its blocks would not line up).
//!
//! # Memory
//! The index: a hash table of 73-byte slots, 83-166 bytes per block on disk as the table
//! grows (stat `disk_index_bytes`): like the node table, it grows with the dataset (one entry
//! per block, at most, of each dataset mounted over the directory), not with the disk's size.
//! ImageNet's 1.28 M files take 106-213 MB. Blocks waiting for the writer: at most
//! [`PENDING_MAX`] bytes (more are not written; the tier is a cache), plus the writer's batch
//! buffer of [`BATCH_MAX`] bytes (or of one block, where blocks are larger), kept from batch to
//! batch. Until they are in the index they are served from the queue (its `transit` map holds
//! the same blocks, not copies).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

mod format;
mod index;
mod writer;

use format::*;
use index::*;
use writer::*;

use super::{DataError, Found, Tier, Want};
use crate::block::{ALIGN, Block, BlockSize, MAP_FROM};
use crate::namespace::FileVersion;
use crate::source::read_at_most;
use crate::stats::{Counters, Stats};

/// The disk tier's configuration: `--cache-dir`, `--disk-cache-size`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    pub dir: PathBuf,
    /// Bytes the data file may grow to.
    pub size: u64,
}

/// Why the cache directory cannot be used. Each is one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cache directory {0}: {1}")]
    Io(PathBuf, io::Error),
    #[error("cache directory {0}: not a directory")]
    NotDir(PathBuf),
    #[error(
        "cache directory {0} is writable by users other than its owner (mode {1:04o}); make it 0700 or 0755"
    )]
    Writable(PathBuf, u32),
    #[error("cache directory {0} belongs to uid {1}; the daemon (uid {2}) needs one of its own")]
    Owner(PathBuf, u32, u32),
    #[error(
        "cache directory {0} holds {1}, which coorfs did not write; give coorfs an empty directory of its own"
    )]
    Foreign(PathBuf, String),
    #[error("cache directory {dir} is in use by another coorfs daemon{}", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    InUse { dir: PathBuf, pid: Option<u32> },
}

/// Blocks waiting for the writer hold at most this many bytes; more are not written.
pub const PENDING_MAX: u64 = 32 << 20;
/// One write of the data file: at most this many bytes.
pub const BATCH_MAX: usize = 8 << 20;
/// After its first read, a block's checksum is checked on one read in this many.
pub const SAMPLE_EVERY: u64 = 16;

/// The disk tier of a mount.
pub struct DiskTier {
    dir: PathBuf,
    capacity: u64,
    blocks: BlockSize,
    /// The hash of the source's root, the seed of every path's hash.
    seed: u64,
    data: File,
    /// `data` opened with `O_DIRECT` to read, and to write, if the filesystem takes it.
    direct: Option<File>,
    direct_writes: Option<File>,
    index_log: Mutex<File>,
    /// Held (flock) while this tier lives.
    _lock: File,
    index: RwLock<Index>,
    queue: Mutex<Queue>,
    wake: Condvar,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    enabled: AtomicBool,
    /// The writer stopped admitting: the next block would pass the capacity.
    full: AtomicBool,
    /// The dataset's bytes, once the scan has counted them (0 before).
    dataset_bytes: AtomicU64,
    /// Bytes of the blocks taken that the memory cache did not keep (at mount: every block
    /// found, the memory cache being empty). See [`DiskTier::keeps_copy`].
    only_bytes: AtomicU64,
    reads: AtomicU64,
    /// Where blocks read from here, and blocks dropped, are counted.
    stats: Arc<Stats>,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.dir)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// Opens `dir/name` for reading and writing, creating it `0600`, without following a
/// symlink.
fn open_rw(dir: &Path, name: &str) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(name))
}

/// The bytes of an `O_DIRECT` read covering `len` bytes at `offset`.
fn aligned_span(offset: u64, len: u64) -> (u64, usize, usize) {
    let start = offset & !(ALIGN as u64 - 1);
    let skip = (offset - start) as usize;
    let span = (skip + len as usize).div_ceil(ALIGN) * ALIGN;
    (start, skip, span)
}

/// Creates `dir` (0700) if missing, checks that it is the daemon's alone, and takes its
/// lock, writing this process's pid into it: the lock file, which holds the lock while open.
pub fn take(dir: &Path) -> Result<File, DiskError> {
    let io_err = |e| DiskError::Io(dir.to_path_buf(), e);
    match std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(io_err)?;
    if !meta.is_dir() {
        return Err(DiskError::NotDir(dir.to_path_buf()));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(DiskError::Owner(dir.to_path_buf(), meta.uid(), me));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(DiskError::Writable(dir.to_path_buf(), meta.mode() & 0o7777));
    }
    // Never write beside files of someone else's (a mistyped /etc, a dataset).
    for entry in std::fs::read_dir(dir).map_err(io_err)? {
        let name = entry.map_err(io_err)?.file_name();
        if !FILES.iter().any(|f| name == *f) {
            return Err(DiskError::Foreign(
                dir.to_path_buf(),
                name.to_string_lossy().into_owned(),
            ));
        }
    }
    let mut lock = open_rw(dir, "lock").map_err(io_err)?;
    if let Err(e) = rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        if e == rustix::io::Errno::WOULDBLOCK {
            let mut text = String::new();
            let _ = lock.read_to_string(&mut text);
            return Err(DiskError::InUse {
                dir: dir.to_path_buf(),
                pid: text.trim().parse().ok(),
            });
        }
        return Err(io_err(e.into()));
    }
    lock.set_len(0).map_err(io_err)?;
    lock.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0)
        .map_err(io_err)?;
    Ok(lock)
}

impl DiskTier {
    /// Opens (creating it if need be) the cache directory of `config` for blocks of `blocks`
    /// of the dataset at `source`, loads its index, and starts the writer. Counts reads in
    /// `stats`.
    pub fn open(
        config: &DiskConfig,
        source: &Path,
        blocks: BlockSize,
        stats: Arc<Stats>,
    ) -> Result<Arc<DiskTier>, DiskError> {
        use std::os::unix::ffi::OsStrExt;
        let dir = config.dir.clone();
        let io_err = |e| DiskError::Io(dir.clone(), e);
        let lock = take(&dir)?;
        let data = open_rw(&dir, "data").map_err(io_err)?;
        let log = open_rw(&dir, "index").map_err(io_err)?;
        let mut index = load(&dir, &log, &data, blocks).map_err(io_err)?;
        shrink(&dir, &log, &data, &mut index, config.size).map_err(io_err)?;
        // Dropped blocks' space is not reused while mounted; once it is most of the budget
        // (a dataset that changed), the directory starts afresh rather than stay full of it.
        let dead = index.tail.saturating_sub(index.bytes);
        if dead > config.size / 2 {
            tracing::warn!(
                "disk cache {}: {} of its {} are dropped blocks (files changed in the source); starting it afresh",
                dir.display(),
                crate::units::format_size(dead),
                crate::units::format_size(index.tail)
            );
            start_afresh(&log, &data, blocks).map_err(io_err)?;
            index = Index::default();
        }
        let direct_open = |o: &mut OpenOptions| {
            o.custom_flags(libc::O_DIRECT | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(dir.join("data"))
                .ok()
        };
        let direct = direct_open(OpenOptions::new().read(true));
        let direct_writes = direct_open(OpenOptions::new().write(true));
        tracing::info!(
            "disk cache {}: {} blocks, {} of {} used{}",
            dir.display(),
            index.entries.len(),
            crate::units::format_size(index.tail),
            crate::units::format_size(config.size),
            if direct.is_some() {
                ""
            } else {
                " (the filesystem refuses O_DIRECT: reads drop their pages instead)"
            }
        );
        if let Ok(st) = rustix::fs::statvfs(&dir)
            && index.tail + st.f_bavail * st.f_frsize < config.size
        {
            tracing::warn!(
                "disk cache {}: {} free on its filesystem, less than --disk-cache-size {}: the tier turns off when the disk is full",
                dir.display(),
                crate::units::format_size(st.f_bavail * st.f_frsize),
                crate::units::format_size(config.size)
            );
        }
        let tier = Arc::new(DiskTier {
            dir,
            capacity: config.size,
            blocks,
            seed: xxhash_rust::xxh3::xxh3_64(source.as_os_str().as_bytes()),
            data,
            direct,
            direct_writes,
            index_log: Mutex::new(log),
            _lock: lock,
            full: AtomicBool::new(index.tail >= config.size),
            dataset_bytes: AtomicU64::new(0),
            only_bytes: AtomicU64::new(index.bytes),
            index: RwLock::new(index),
            queue: Mutex::default(),
            wake: Condvar::new(),
            writer: Mutex::new(None),
            enabled: AtomicBool::new(true),
            reads: AtomicU64::new(0),
            stats,
        });
        let writer = tier.clone();
        let handle = std::thread::Builder::new()
            .name("coorfs-disk".into())
            .spawn(move || writer.write_loop())
            .map_err(|e| DiskError::Io(tier.dir.clone(), e))?;
        *tier.writer.lock() = Some(handle);
        Ok(tier)
    }

    /// Bytes the data file may grow to.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of the data file in use (blocks, alignment, and dropped blocks).
    pub fn used(&self) -> u64 {
        self.index.read().tail
    }

    /// Bytes of the blocks held.
    pub fn cached_bytes(&self) -> u64 {
        self.index.read().bytes
    }

    /// Tells the tier the dataset's size, once the scan has counted it: it decides which
    /// blocks the memory cache also keeps are worth the room ([`DiskTier::keeps_copy`]).
    pub fn set_dataset_bytes(&self, bytes: u64) {
        self.dataset_bytes.store(bytes, Ordering::Relaxed);
    }

    /// True if a block of `len` bytes that the memory cache keeps (holding `memory_bytes`)
    /// should be written here too: only if the disk still has room, after it, for every byte
    /// of the dataset that neither tier holds. What the disk keeps is then first what memory
    /// does not (the tiers together hold memory plus disk, not the larger of the two), and
    /// the copies that let a restarted daemon find everything come with room to spare: a
    /// disk as large as the dataset keeps every block, as before. Until the scan has counted
    /// the dataset, every block is written while there is room.
    fn keeps_copy(&self, len: u64, memory_bytes: u64) -> bool {
        (self.uncovered(memory_bytes)).is_none_or(|rest| self.has_room_for(len + rest))
    }

    /// Bytes of the dataset that neither tier holds, with memory holding `memory_bytes`; none
    /// until the scan has counted the dataset.
    fn uncovered(&self, memory_bytes: u64) -> Option<u64> {
        let dataset = self.dataset_bytes.load(Ordering::Relaxed);
        let held = memory_bytes.saturating_add(self.only_bytes.load(Ordering::Relaxed));
        (dataset > 0).then(|| dataset.saturating_sub(held))
    }

    /// True if the memory cache should also keep a block of `len` bytes found here: only if
    /// it has room, after it, for every byte of the dataset that neither tier holds. After a
    /// restart with a disk smaller than the dataset, memory then keeps first what the disk
    /// lacks, as [`DiskTier::keeps_copy`] has the disk do, instead of filling with copies of
    /// what the disk serves anyway. Until the scan has counted the dataset, it keeps every
    /// block while it has room.
    fn memory_keeps_copy(&self, len: u64, memory: &crate::cache::BlockCache) -> bool {
        (self.uncovered(memory.cached_bytes())).is_none_or(|rest| memory.has_room_for(len + rest))
    }

    /// Blocks held.
    pub fn cached_blocks(&self) -> u64 {
        self.index.read().entries.len() as u64
    }

    /// Bytes of memory the index takes: its hash table's slots (a key, an entry and a control
    /// byte each), of which the table fills at most 7 in 8 (what it reports as capacity).
    pub fn index_bytes(&self) -> u64 {
        let slot = std::mem::size_of::<(Key, Entry)>() + 1;
        (self.index.read().entries.capacity() * slot * 8 / 7) as u64
    }

    /// False once an error disabled the tier.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// True if block `key` of the file at `rel` is on disk, as of its version.
    pub fn holds_block(&self, rel: &Path, key: &crate::cache::BlockKey) -> bool {
        self.enabled()
            && self.index.read().holds(
                &(path_hash(self.seed, rel), key.block),
                Version::from(&key.version),
            )
    }

    /// True if block `key` of the file at `rel` is on disk or on its way there.
    pub fn takes_block(&self, rel: &Path, key: &crate::cache::BlockKey) -> bool {
        let k = (path_hash(self.seed, rel), key.block);
        let v = Version::from(&key.version);
        self.holds_block(rel, key) || self.queue.lock().carried(&k, v).is_some()
    }

    /// True if the disk has room for `bytes` more, beside what is queued.
    pub fn has_room_for(&self, bytes: u64) -> bool {
        let queued = self.queue.lock().bytes;
        self.enabled()
            && !self.full.load(Ordering::Relaxed)
            && self.used() + queued + bytes <= self.capacity
    }

    /// True if every block of the file at `rel`, as of `version`, is on disk or on its way
    /// there. The writer's queue is looked at only if the index lacks a block (the index is
    /// locked before the queue wherever both are).
    pub fn holds_file(&self, rel: &Path, version: &FileVersion) -> bool {
        if !self.enabled() {
            return false;
        }
        let (hash, v) = (path_hash(self.seed, rel), Version::from(version));
        let count = self.blocks.count(version.size);
        let index = self.index.read();
        if (0..count).all(|b| index.holds(&(hash, b), v)) {
            return true;
        }
        let queue = self.queue.lock();
        (0..count).all(|b| {
            let key = (hash, b);
            index.holds(&key, v) || queue.carried(&key, v).is_some()
        })
    }

    /// `block`, served from here: counted as a hit of the disk tier.
    fn served(&self, block: Arc<Block>) -> Found<'static> {
        Counters::add(&self.stats.counters.disk_hits, 1);
        Counters::add(&self.stats.counters.bytes_from_disk, block.len() as u64);
        Found::Block(block)
    }

    /// Writes what is queued and stops the writer: at unmount.
    pub fn close(&self) {
        self.queue.lock().closing = true;
        self.wake.notify_all();
        if let Some(writer) = self.writer.lock().take() {
            let _ = writer.join();
        }
    }

    /// Turns the tier off after `e`, once, with a log line.
    fn disable(&self, what: &str, e: &io::Error) {
        if self.enabled.swap(false, Ordering::Relaxed) {
            tracing::error!(
                "disk cache {}: {what}: {e}; the disk tier is off until the next mount, reads go on from the source",
                self.dir.display()
            );
        }
        let mut q = self.queue.lock();
        q.blocks.clear();
        q.transit.clear();
        q.bytes = 0;
    }

    /// A write of the tier failed with `e` (a full disk: ENOSPC): counted as the tier's fault
    /// (`tier_errors`, as a failed read of it is by the fetch that asked), and the tier is
    /// turned off. No reader asked for the write, so no one else counts it: the tier went off
    /// with `tier_errors` still 0.
    fn write_failed(&self, what: &str, e: &io::Error) {
        Counters::add(&self.stats.counters.tier_errors, 1);
        self.disable(what, e);
    }

    /// Drops block `key` (its bytes are wrong, or its file changed): from the index now, and
    /// from the log with a tombstone, so that a restart does not load it again.
    fn drop_block(&self, key: Key, why: &str, rel: &Path) {
        if !self.index.write().remove(&key) {
            return;
        }
        Counters::add(&self.stats.counters.disk_dropped, 1);
        tracing::warn!(
            "disk cache: block {} of {} dropped: {why}; reading it again",
            key.1,
            rel.display()
        );
        if let Err(e) = append(&self.index_log.lock(), &[Record::tombstone(key).encode()]) {
            self.write_failed("writing the index", &e);
        }
    }

    /// Reads `extent` from the data file.
    fn read_extent(&self, extent: Extent) -> io::Result<Option<Block>> {
        let len = u64::from(extent.len);
        if let Some(direct) = &self.direct {
            let (start, skip, span) = aligned_span(extent.offset, len);
            let mut buf = Block::zeroed(span)?;
            let n = read_at_most(direct, start, &mut buf.whole_mut()[..span], true)?;
            if n < skip + len as usize {
                return Ok(None);
            }
            if skip == 0 && len as usize >= MAP_FROM {
                buf.truncate(len as usize);
                return Ok(Some(buf));
            }
            let bytes = &buf.whole_mut()[skip..skip + len as usize];
            return Ok(Some(if bytes.len() < MAP_FROM {
                Block::exact(bytes)
            } else {
                Block::copy_of(bytes)?
            }));
        }
        let mut buf = Block::zeroed(len as usize)?;
        let n = read_at_most(&self.data, extent.offset, buf.whole_mut(), false)?;
        // Only advice to the kernel's page cache: a failure changes nothing.
        let _ = rustix::fs::fadvise(
            &self.data,
            extent.offset,
            std::num::NonZeroU64::new(len),
            rustix::fs::Advice::DontNeed,
        );
        if n < len as usize {
            return Ok(None);
        }
        buf.truncate(len as usize);
        Ok(Some(if buf.len() < MAP_FROM {
            Block::exact(&buf)
        } else {
            buf
        }))
    }
}

impl Tier for DiskTier {
    fn name(&self) -> &'static str {
        "disk"
    }

    fn origin(&self) -> super::fetch::Origin {
        super::fetch::Origin::Disk
    }

    fn holds(&self, want: &Want<'_>) -> bool {
        self.takes_block(want.rel, &want.key)
    }

    fn get(&self, want: &Want<'_>) -> Result<Option<Found<'_>>, DataError> {
        if !self.enabled() {
            return Ok(None);
        }
        let key = (path_hash(self.seed, want.rel), want.key.block);
        let Some(entry) = self.index.read().entries.get(&key).copied() else {
            let version = Version::from(&want.key.version);
            let carried = self.queue.lock().carried(&key, version).cloned();
            return Ok(carried.map(|block| self.served(block)));
        };
        if entry.version != Version::from(&want.key.version) {
            self.drop_block(key, "its file changed in the source", want.rel);
            return Ok(None);
        }
        let block = match self.read_extent(entry.extent) {
            Ok(Some(block)) => block,
            Ok(None) => {
                self.drop_block(key, "the cache file ends before it (torn)", want.rel);
                return Ok(None);
            }
            Err(e) => {
                self.disable("reading", &e);
                return Err(DataError::Disk {
                    path: self.dir.join("data"),
                    error: Arc::new(e),
                });
            }
        };
        let n = self.reads.fetch_add(1, Ordering::Relaxed);
        if !entry.checked || n.is_multiple_of(SAMPLE_EVERY) {
            if crc32c::crc32c(&block) != entry.extent.crc {
                self.drop_block(key, "its checksum does not match (corrupt)", want.rel);
                return Ok(None);
            }
            if !entry.checked
                && let Some(e) = self.index.write().entries.get_mut(&key)
            {
                e.checked = true;
            }
        }
        Ok(Some(self.served(Arc::new(block))))
    }

    fn admit(&self, want: &Want<'_>, data: &Arc<Block>) -> bool {
        if !self.enabled() || self.full.load(Ordering::Relaxed) {
            return false;
        }
        let key = (path_hash(self.seed, want.rel), want.key.block);
        let version = Version::from(&want.key.version);
        if self.index.read().holds(&key, version) {
            return false;
        }
        let mut q = self.queue.lock();
        let len = data.len() as u64;
        if q.closing || q.bytes + len > PENDING_MAX || q.transit.contains_key(&key) {
            return false;
        }
        q.bytes += len;
        q.transit.insert(key, (version, data.clone()));
        q.blocks.push(Pending {
            key,
            version,
            data: data.clone(),
        });
        drop(q);
        self.wake.notify_one();
        true
    }

    /// With a cache that never evicts (MinIO), a block it kept is written only if
    /// [`DiskTier::keeps_copy`]; one it did not keep is written while there is room. With an
    /// evicting cache (or none) every block is offered alike.
    fn admit_behind(
        &self,
        want: &Want<'_>,
        data: &Arc<Block>,
        memory: &crate::cache::BlockCache,
        kept: bool,
    ) -> bool {
        let len = data.len() as u64;
        let exclusive = memory.caches() && !memory.evicts();
        if exclusive && kept && !self.keeps_copy(len, memory.cached_bytes()) {
            return false;
        }
        let taken = self.admit(want, data);
        if taken && !kept {
            self.only_bytes.fetch_add(len, Ordering::Relaxed);
        }
        taken
    }

    /// With a cache that never evicts (MinIO), memory keeps a block found here only if
    /// [`DiskTier::memory_keeps_copy`]; a block it keeps is no longer one only the disk holds.
    fn offer_to_memory(
        &self,
        want: &Want<'_>,
        data: &Arc<Block>,
        memory: &crate::cache::BlockCache,
    ) -> bool {
        let len = data.len() as u64;
        let exclusive = memory.caches() && !memory.evicts();
        if exclusive && !self.memory_keeps_copy(len, memory) {
            return false;
        }
        let kept = memory.admit(want, data);
        if kept {
            let _ = (self.only_bytes).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(len))
            });
        }
        kept
    }

    fn remove(&self, _want: &Want<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::Why;
    use std::num::NonZeroU64;

    fn blocks() -> BlockSize {
        BlockSize::new(NonZeroU64::new(1 << 20).unwrap())
    }

    /// A want for block `block` of file `rel` of `size` bytes.
    fn want(rel: &'static str, size: u64, block: u64) -> Want<'static> {
        let mut w = crate::tier::tests::want(7, size, block, Why::Read);
        w.rel = Path::new(rel);
        w
    }

    fn open(dir: &Path, size: u64) -> Arc<DiskTier> {
        let config = DiskConfig {
            dir: dir.to_path_buf(),
            size,
        };
        DiskTier::open(
            &config,
            Path::new("/src"),
            blocks(),
            Arc::new(Stats::default()),
        )
        .unwrap()
    }

    fn bytes(found: Option<Found<'_>>) -> Option<Vec<u8>> {
        match found? {
            Found::Block(b) => Some(b.to_vec()),
            other => panic!("{other:?}"),
        }
    }

    /// Admits `data` as `w` and waits for the writer to publish it.
    fn put(t: &DiskTier, w: &Want<'_>, data: &[u8]) {
        assert!(t.admit(w, &Arc::new(Block::copy_of(data).unwrap())));
        for _ in 0..500 {
            if t.index
                .read()
                .entries
                .contains_key(&(path_hash(t.seed, w.rel), w.key.block))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("never written");
    }

    #[test]
    fn records_round_trip_and_a_torn_one_is_refused() {
        let r = Record {
            key: (u64::MAX, 3),
            version: Version {
                ino: 9,
                size: 1 << 40,
                mtime_ns: -5,
                ctime_ns: 1_700_000_000_000_000_000,
            },
            extent: Extent {
                offset: 123 << 20,
                len: 1 << 20,
                crc: 0xdead_beef,
            },
        };
        let mut e = r.encode();
        assert_eq!(Record::decode(&e), Some(r));
        e[70] ^= 1; // the padding is not covered, a field is
        assert_eq!(Record::decode(&e), Some(r));
        e[3] ^= 1;
        assert_eq!(Record::decode(&e), None);
    }

    #[test]
    fn aligned_spans_cover_the_extent_in_whole_pages() {
        // (offset, len) -> (start, skip, span)
        for (off, len, want) in [
            (0, 10, (0, 0, 4096)),
            (4096, 4096, (4096, 0, 4096)),
            (5000, 100, (4096, 904, 4096)),
            (4000, 200, (0, 4000, 8192)),
            (8192, 1 << 20, (8192, 0, 1 << 20)),
        ] {
            assert_eq!(aligned_span(off, len), want, "{off} {len}");
        }
    }

    #[test]
    fn blocks_survive_a_reopen_and_their_versions_and_checksums_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let small: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let big: Vec<u8> = (0..(200u32 << 10)).map(|i| (i % 241) as u8).collect();
        let (a, b, c) = (
            want("a", small.len() as u64, 0),
            want("b/big", big.len() as u64, 0),
            want("c", small.len() as u64, 0),
        );
        {
            let t = open(dir.path(), 1 << 30);
            put(&t, &a, &small);
            put(&t, &b, &big);
            put(&t, &c, &small);
            assert_eq!(bytes(t.get(&a).unwrap()), Some(small.clone()));
            assert!(t.holds_file(a.rel, &a.key.version));
            assert!(
                !t.admit(&a, &Arc::new(Block::exact(&small))),
                "held already"
            );
            // A second daemon is refused the directory while this one holds it.
            let again = DiskConfig {
                dir: dir.path().to_path_buf(),
                size: 1 << 30,
            };
            let err = DiskTier::open(
                &again,
                Path::new("/src"),
                blocks(),
                Arc::new(Stats::default()),
            )
            .unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "cache directory {} is in use by another coorfs daemon (pid {})",
                    dir.path().display(),
                    std::process::id()
                )
            );
            t.close();
        }
        // Flip a byte of c's block in the data file.
        let data = dir.path().join("data");
        let off = {
            let t = open(dir.path(), 1 << 30);
            let e = t.index.read().entries[&(path_hash(t.seed, c.rel), 0)];
            t.close();
            e.extent.offset
        };
        let f = OpenOptions::new().write(true).open(&data).unwrap();
        f.write_all_at(&[small[7] ^ 0xff], off + 7).unwrap();
        let t = open(dir.path(), 1 << 30);
        assert_eq!(t.cached_blocks(), 3);
        assert_eq!(
            std::mem::size_of::<(Key, Entry)>() + 1,
            73,
            "the slot the docs state"
        );
        assert!(t.index_bytes() >= 3 * 73);
        assert_eq!(bytes(t.get(&a).unwrap()), Some(small.clone()));
        assert_eq!(bytes(t.get(&b).unwrap()), Some(big.clone()));
        assert_eq!(
            bytes(t.get(&c).unwrap()),
            None,
            "corrupt: dropped, not served"
        );
        assert_eq!(Counters::get(&t.stats.counters.disk_dropped), 1);
        // A changed source file (another mtime) is a miss, and its block is dropped.
        let mut changed = a;
        changed.key.version.mtime_ns += 1;
        assert!(!t.holds_file(a.rel, &changed.key.version));
        assert_eq!(bytes(t.get(&changed).unwrap()), None);
        assert_eq!(bytes(t.get(&a).unwrap()), None, "dropped for good");
        t.close();
        drop(t);
        // The tombstones hold across a restart.
        let t = open(dir.path(), 1 << 30);
        assert_eq!(t.cached_blocks(), 1);
        assert_eq!(bytes(t.get(&b).unwrap()), Some(big));
        t.close();
    }

    #[test]
    fn blocks_memory_keeps_are_written_only_with_room_for_the_rest_of_the_dataset() {
        use crate::cache::{BlockCache, CacheConfig, PolicyKind};
        const PAGE: u64 = 4096;
        let memory = |policy| {
            BlockCache::new(CacheConfig {
                policy,
                capacity: 3 * PAGE,
                ceiling: None,
                block_size: NonZeroU64::new(PAGE).unwrap(),
            })
            .unwrap()
        };
        let block = Arc::new(Block::exact(&[3u8; PAGE as usize]));
        // Offers block 0 of `rel`; once taken, waits until it is written.
        let offer = |t: &DiskTier, m: &BlockCache, rel: &'static str, kept: bool| {
            let w = want(rel, PAGE, 0);
            let taken = t.admit_behind(&w, &block, m, kept);
            if taken {
                let key = (path_hash(t.seed, w.rel), w.key.block);
                let written = || t.index.read().entries.contains_key(&key);
                for _ in 0..500 {
                    if written() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                assert!(written(), "{rel} never written");
            }
            taken
        };
        let dir = tempfile::tempdir().unwrap();
        // Memory (MinIO) holds 3 blocks of a dataset of 8; the disk has room for 7.
        let minio = memory(PolicyKind::MinIo);
        for b in 0..3 {
            assert!(minio.insert(crate::tier::tests::key(9, 3 * PAGE, b), &block));
        }
        let t = open(dir.path(), 7 * PAGE);
        // Before the scan has counted the dataset, every block is written.
        assert!(offer(&t, &minio, "m0", true));
        t.set_dataset_bytes(8 * PAGE);
        // Neither tier holds 5 blocks of the dataset: with this copy, 1 + 1 + 5 <= 7.
        assert!(offer(&t, &minio, "m1", true));
        // A third copy would leave too little room for them.
        assert!(!offer(&t, &minio, "m2", true));
        // What memory does not keep is written, to the end of the room...
        for rel in ["d0", "d1", "d2", "d3", "d4"] {
            assert!(offer(&t, &minio, rel, false), "{rel}");
        }
        assert_eq!(t.used(), 7 * PAGE);
        t.close();
        assert_eq!(t.cached_blocks(), 7);
        drop(t);
        // With an evicting cache, a block memory keeps is written alike.
        let dir = tempfile::tempdir().unwrap();
        let t = open(dir.path(), 7 * PAGE);
        t.set_dataset_bytes(1 << 30);
        assert!(offer(&t, &memory(PolicyKind::Lru), "l0", true));
        assert!(!offer(&t, &minio, "m3", true));
        t.close();
    }

    #[test]
    fn a_torn_index_tail_is_cut_and_the_disk_fills_only_to_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![5u8; 3000];
        {
            // Each block is a batch of its own here, padded to a page.
            let t = open(dir.path(), 10_000);
            put(&t, &want("a", 3000, 0), &data);
            put(&t, &want("b", 3000, 0), &data);
            // A third would pass 10,000 bytes: not written.
            assert!(t.admit(&want("c", 3000, 0), &Arc::new(Block::exact(&data))));
            t.close();
            assert_eq!(t.cached_blocks(), 2);
            assert_eq!(t.used(), 8192);
            assert!(!t.admit(&want("d", 10, 0), &Arc::new(Block::exact(&[1; 10]))));
        }
        // Half a record at the end of the log, as a kill -9 mid-append leaves it.
        let log = OpenOptions::new()
            .append(true)
            .open(dir.path().join("index"))
            .unwrap();
        std::io::Write::write_all(&mut &log, &[1u8; RECORD / 2]).unwrap();
        let t = open(dir.path(), 10_000);
        assert_eq!(t.cached_blocks(), 2);
        assert_eq!(
            std::fs::metadata(dir.path().join("index")).unwrap().len(),
            HEADER + 2 * RECORD as u64
        );
        assert_eq!(bytes(t.get(&want("b", 3000, 0)).unwrap()), Some(data));
        t.close();
    }

    #[test]
    fn a_directory_others_may_write_to_or_holding_other_files_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let config = DiskConfig {
            dir: dir.path().to_path_buf(),
            size: 1 << 20,
        };
        let open = || {
            DiskTier::open(
                &config,
                Path::new("/src"),
                blocks(),
                Arc::new(Stats::default()),
            )
        };
        assert_eq!(
            open().unwrap_err().to_string(),
            format!(
                "cache directory {} is writable by users other than its owner (mode 0777); make it 0700 or 0755",
                dir.path().display()
            )
        );
        // A directory of other files (a mistyped /etc) is not written to.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("passwd"), "root:x:0:0").unwrap();
        assert_eq!(
            open().unwrap_err().to_string(),
            format!(
                "cache directory {} holds passwd, which coorfs did not write; give coorfs an empty directory of its own",
                dir.path().display()
            )
        );
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["passwd"]);
    }

    #[test]
    fn datasets_mounted_in_turn_over_one_directory_keep_apart() {
        let dir = tempfile::tempdir().unwrap();
        let config = DiskConfig {
            dir: dir.path().to_path_buf(),
            size: 1 << 20,
        };
        let open = |source: &str| {
            DiskTier::open(
                &config,
                Path::new(source),
                blocks(),
                Arc::new(Stats::default()),
            )
            .unwrap()
        };
        // The same relative path, with the same version: another dataset's file.
        let w = want("train/x.jpg", 100, 0);
        let t = open("/data/a");
        put(&t, &w, &[1; 100]);
        t.close();
        drop(t);
        let t = open("/data/b");
        assert_eq!(bytes(t.get(&w).unwrap()), None);
        assert!(!t.holds_file(w.rel, &w.key.version));
        put(&t, &w, &[2; 100]);
        t.close();
        drop(t);
        let t = open("/data/a");
        assert_eq!(bytes(t.get(&w).unwrap()), Some(vec![1; 100]));
        t.close();
    }

    #[test]
    fn a_directory_mostly_of_dropped_blocks_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (want("a", 3000, 0), want("b", 3000, 0));
        {
            let t = open(dir.path(), 20_000);
            put(&t, &a, &[1; 3000]);
            put(&t, &b, &[2; 3000]);
            // a changes in the source: 4 KiB of 8 dead, not yet half of 20,000.
            let mut changed = a;
            changed.key.version.size += 1;
            assert_eq!(bytes(t.get(&changed).unwrap()), None);
            t.close();
        }
        {
            let t = open(dir.path(), 20_000);
            assert_eq!((t.cached_blocks(), t.used()), (1, 8192));
            let mut changed = b;
            changed.key.version.ctime_ns += 1;
            assert_eq!(bytes(t.get(&changed).unwrap()), None);
            t.close();
        }
        // Now 8 KiB of 8 are dead: more than half of a budget of 12,000 bytes, afresh.
        let t = open(dir.path(), 12_000);
        assert_eq!((t.cached_blocks(), t.used()), (0, 0));
        put(&t, &b, &[3; 3000]);
        assert_eq!(bytes(t.get(&b).unwrap()), Some(vec![3; 3000]));
        t.close();
    }
}
