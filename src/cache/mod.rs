//! The block cache: file bytes in coorfs's own memory, under a hard budget.
//!
//! Small files are cached whole (one block of the file's size); larger files in fixed blocks
//! (`--block-size`, 1 MiB by default; [`BlockSize`]), so that random access into a TFRecord,
//! a tar shard or an HDF5 file caches just what is read. A [`BlockKey`] carries the file's version (device,
//! inode, size, mtime): a changed source file is a different key, so it is a miss, never
//! stale bytes.
//!
//! The policy ([`policy`]) decides; this module stores, in the store the policy needs
//! (`Store`). A policy that never evicts (MinIO) gets an append-only [`arena::Arena`]
//! (nothing is ever freed, so no allocator is needed). One that evicts (LRU) gets one
//! anonymous mapping per block, returned to the kernel the moment the block is evicted: heap
//! buffers would do, but freed 100 KiB chunks stay in malloc's arenas (measured: an LRU
//! daemon with a 1 GiB budget passed 1.1 GB of anonymous memory and was OOM-killed in a
//! 1 GiB + 64 MiB cgroup). Both count every block at the memory it really takes (64-byte
//! slots in the arena, whole pages for a mapping) against the same budget, so the memory
//! the cache holds never exceeds `--cache-size`.
//!
//! Where the kernel reads cached files itself (FUSE passthrough), a MinIO cache keeps the
//! blocks of files over 64 KiB in files of their own instead of the arena
//! ([`kernel_files`]), so that the kernel can be handed a file's bytes as a file.
//!
//! The cache is the first tier of the read path ([`crate::tier::memory`]).
//!
//! # An elastic budget
//!
//! A budget sized from the memory the daemon may use (`--cache-size auto`, [`crate::budget`])
//! grows and shrinks while the mount runs ([`BlockCache::resize`]). Growing only lets the
//! policy admit more. Shrinking keeps MinIO's promise as far as memory allows: it drops the
//! newest blocks, so that what stays is what was cached first and the blocks every later
//! epoch hits are the same; it admits nothing until there is room again. It takes no more
//! than it must: a shard of 1 GiB asked for 32 MiB gives its last 32 MiB, not its every block
//! (whole files went once, and the next epoch read 262 MiB again to free 32). The memory
//! really goes back: the arena gives the pages past its last kept slot to the kernel; a file
//! the kernel reads itself has its last blocks punched out of it
//! ([`kernel_files::KernelFiles::cut`]), unless a passthrough open took it whole: that one
//! is unlinked from the private tmpfs whole (its pages go when the last descriptor of it
//! closes; the caller drops the kernel's registration). LRU evicts its least recently used
//! blocks instead. Only an elastic cache keeps the order it needs for this ([`Admitted`]); a
//! lender of cached bytes (an arena slice, a view of a file's block), and an insert from
//! allocation to publication, hold the cache's shrink lock shared, and a shrink takes it
//! alone.
//!
//! Locks: the policy's mutex is held only for the decision, the index's lock only to look
//! up or publish; copying bytes happens outside both.

pub mod arena;
mod index;
pub mod kernel_files;
pub mod policy;
mod resize;
mod restore;

use std::collections::HashSet;

// hashbrown's default hasher (foldhash): the index is looked up at every read and filled at
// every block a successor takes over (400,000 in 0.4 s with SipHash).
use hashbrown::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::block::{Block, BlockSize};
use crate::handover::state::{CacheJournal, CacheRecord, CachedAt};
use crate::namespace::FileVersion;
use arena::{Arena, Slot};
use index::{Admitted, Index, Newest, Store, Stored};
pub use index::{CachedBytes, MappedBlock};
use kernel_files::KernelFiles;
use policy::{Admission, CachePolicy, LruPolicy, MinIoPolicy, NoCachePolicy};

/// Which policy a cache follows: the one name of a mount's policy. `--policy` takes these by
/// [`PolicyKind::name`] (`crate::cli` hands clap the names), and the stats report it so.
/// `coorfs analyze` models its own set ([`crate::analyze::simulate::Policy`]): LRU and MinIO,
/// no `none`, and MinIO with a prefetcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PolicyKind {
    /// Admit while there is room, never evict.
    #[default]
    MinIo,
    /// Least recently used.
    Lru,
    /// No cache: every read goes to the source, and the kernel's page cache does what it does.
    None,
}

impl PolicyKind {
    /// Every kind, in the order `--help` lists them.
    pub const ALL: [PolicyKind; 3] = [PolicyKind::MinIo, PolicyKind::Lru, PolicyKind::None];

    /// The kind of this [`name`](PolicyKind::name), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// A policy of this kind over `capacity` bytes.
    fn policy(self, capacity: u64) -> Box<dyn CachePolicy<BlockKey>> {
        match self {
            PolicyKind::MinIo => Box::new(MinIoPolicy::new(capacity)),
            PolicyKind::Lru => Box::new(LruPolicy::new(capacity)),
            PolicyKind::None => Box::new(NoCachePolicy),
        }
    }

    /// False for `--policy none`: no cache of coorfs's own, so no memory budget to set, and
    /// the source's and the kernel's page caches do what they do.
    pub fn caches(self) -> bool {
        self.policy(0).keeps_anything()
    }

    /// The name users type and read.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::MinIo => "minio",
            PolicyKind::Lru => "lru",
            PolicyKind::None => "none",
        }
    }
}

/// How a cache is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    pub policy: PolicyKind,
    /// Bytes the cache may hold (at first, if elastic).
    pub capacity: u64,
    /// The most bytes an elastic budget may grow to ([`BlockCache::resize`]): the arena and
    /// the tmpfs reserve this much. None for a fixed budget (`--cache-size`).
    pub ceiling: Option<u64>,
    /// Bytes per block of a large file; files up to this size are cached whole. Never zero:
    /// every block count and offset divides or multiplies by it.
    pub block_size: NonZeroU64,
}

impl CacheConfig {
    /// The most the cache may ever hold: the ceiling of an elastic budget, the capacity of a
    /// fixed one.
    fn most(&self) -> u64 {
        self.ceiling.unwrap_or(self.capacity).max(self.capacity)
    }
}

/// One block of one version of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub version: FileVersion,
    pub block: u64,
}

/// Counters the cache keeps about itself.
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Blocks refused because the cache was full.
    pub refused: AtomicU64,
    /// Blocks evicted (LRU).
    pub evicted: AtomicU64,
    /// Files dropped because an elastic budget shrank.
    pub shrink_dropped_files: AtomicU64,
    /// Bytes of memory given back because an elastic budget shrank.
    pub shrink_freed: AtomicU64,
}

/// What a [`BlockCache::resize`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resized {
    /// The files dropped whole (MinIO), newest first. The kernel's registrations of those it read
    /// by itself are the caller's to drop.
    pub dropped: Vec<FileVersion>,
    /// Blocks evicted (LRU).
    pub evicted: u64,
    /// Memory given back, bytes, as the budget counts it.
    pub freed: u64,
    /// Files that lost blocks (MinIO): those dropped, and those that kept their oldest
    /// blocks.
    pub files: u64,
}

/// The cache of one mount.
pub struct BlockCache {
    config: CacheConfig,
    policy: Mutex<Box<dyn CachePolicy<BlockKey>>>,
    /// What the policy said of itself, asked once (see [`CachePolicy`]).
    keeps: bool,
    touch: bool,
    prefetch: bool,
    index: RwLock<Index>,
    store: Store,
    pub counters: CacheCounters,
    /// The files the cache may keep, by dataset-relative path, if not all: in a cluster, those
    /// this member owns ([`BlockCache::keep_only`]).
    keeps_path: std::sync::OnceLock<PathFilter>,
    /// Where the blocks of larger files go when the kernel may read them itself (see
    /// [`BlockCache::keep_files_for_kernel`]).
    kernel: std::sync::OnceLock<KernelFiles>,
    /// The budget is elastic ([`CacheConfig::ceiling`]).
    elastic: bool,
    /// Held shared by lenders of arena bytes and by inserts, alone by a shrink (see the
    /// module header). Only an elastic cache takes it.
    shrink: RwLock<()>,
    /// Memory a keeper holds for this cache (see [`BlockCache::kept`]): its journal, and the
    /// tmpfs for the files the kernel reads until [`BlockCache::keep_files_for_kernel`].
    kept: Option<Arc<CacheJournal>>,
    kept_tmpfs: Mutex<Option<std::os::fd::OwnedFd>>,
    /// Makes the next mapping fail, as an exhausted address space or memory would.
    #[cfg(test)]
    fail_next_mapping: std::sync::atomic::AtomicBool,
}

/// Memory a keeper holds for a cache, so that it outlives the daemon (see `keeper.rs`): the
/// arena's memory file, the journal of the index, and the tmpfs of the files the kernel reads.
#[derive(Debug)]
pub struct CacheMemory {
    pub arena: std::os::fd::OwnedFd,
    pub journal: Arc<CacheJournal>,
    pub tmpfs: Option<std::os::fd::OwnedFd>,
}

/// The key under which a taken-over cache's policy counts the arena's slots that no block
/// holds any more (no file has this version).
const ARENA_HOLES: BlockKey = BlockKey {
    version: FileVersion {
        dev: u64::MAX,
        ino: u64::MAX,
        size: 0,
        mtime_ns: 0,
        ctime_ns: 0,
    },
    block: 0,
};

/// What a cache took over from a previous daemon's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub blocks: u64,
    pub bytes: u64,
    /// Blocks in the journal that could not be taken (no longer fit, or their file is gone).
    pub dropped: u64,
}

/// Says which files, by dataset-relative path, a cache may keep.
pub type PathFilter = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl BlockCache {
    /// A cache following `config`, in the store its policy needs (an arena reserves its
    /// address space here).
    pub fn new(config: CacheConfig) -> std::io::Result<Self> {
        Self::build(config, None)
    }

    /// A cache in memory a keeper holds (`memory`): a cache that never evicts keeps its arena
    /// in the keeper's memory file and its files on the keeper's tmpfs, and records its index
    /// in the journal, from which a successor daemon takes them over ([`BlockCache::restore`]).
    /// A cache that evicts (LRU) is the daemon's alone.
    pub fn kept(config: CacheConfig, memory: CacheMemory) -> std::io::Result<Self> {
        Self::build(config, Some(memory))
    }

    fn build(config: CacheConfig, memory: Option<CacheMemory>) -> std::io::Result<Self> {
        let policy = config.policy.policy(config.capacity);
        let (store, kept, kept_tmpfs) = match memory {
            Some(m) if policy.keeps_anything() && !policy.evicts() => (
                Store::Arena(Arena::shared(&m.arena, config.most() as usize)?),
                Some(m.journal),
                m.tmpfs,
            ),
            _ => (Store::for_policy(&*policy, config.most())?, None, None),
        };
        let elastic = config.ceiling.is_some();
        let index = Index {
            admitted: elastic.then(Admitted::default),
            ..Index::default()
        };
        Ok(BlockCache {
            config,
            keeps: policy.keeps_anything(),
            touch: policy.needs_touch(),
            prefetch: policy.admits_prefetch(),
            policy: Mutex::new(policy),
            index: RwLock::new(index),
            store,
            elastic,
            shrink: RwLock::new(()),
            counters: CacheCounters::default(),
            keeps_path: std::sync::OnceLock::new(),
            kernel: std::sync::OnceLock::new(),
            kept,
            kept_tmpfs: Mutex::new(kept_tmpfs),
            #[cfg(test)]
            fail_next_mapping: Default::default(),
        })
    }

    /// From now on the cache keeps only the files whose dataset-relative path `keeps` says
    /// yes to (the memory tier asks it before it offers a block). Set once.
    pub fn keep_only(&self, keeps: PathFilter) {
        let _ = self.keeps_path.set(keeps);
    }

    /// True if the cache may keep the file at `path` (relative to the dataset root).
    pub fn may_keep(&self, path: &std::path::Path) -> bool {
        use std::os::unix::ffi::OsStrExt;
        self.keeps_path
            .get()
            .is_none_or(|keeps| keeps(path.as_os_str().as_bytes()))
    }

    /// The configuration.
    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// False if the policy keeps nothing (`--policy none`): no cache of coorfs's own.
    pub fn caches(&self) -> bool {
        self.keeps
    }

    /// True if the policy evicts to make room (LRU).
    pub fn evicts(&self) -> bool {
        matches!(self.store, Store::Mappings)
    }

    /// True if blocks fetched by the prefetcher are offered when they arrive; otherwise
    /// they are offered when a reader takes them from the staging area.
    pub fn admits_prefetch(&self) -> bool {
        self.prefetch
    }

    /// The memory a file of `size` bytes takes in the cache, every block of it.
    pub fn file_footprint(&self, size: u64) -> u64 {
        let blocks = self.blocks();
        (0..blocks.count(size))
            .map(|b| self.footprint(size, blocks.len(size, b)))
            .sum()
    }

    /// True if a policy that never evicts has room for `bytes` more now: a file fetched next
    /// will be kept whole, since such a policy refuses nothing while it has room.
    pub fn has_room_for(&self, bytes: u64) -> bool {
        if !self.keeps || !self.prefetch {
            return false;
        }
        let footprint = self.footprint(bytes, bytes);
        let policy = self.policy.lock();
        policy.used() + footprint <= policy.capacity()
    }

    /// Bytes the cache may hold now (an elastic budget's current size).
    pub fn capacity(&self) -> u64 {
        self.policy.lock().capacity()
    }

    /// The most an elastic budget may grow to; the capacity of a fixed one.
    pub fn ceiling(&self) -> u64 {
        self.config.most()
    }

    /// The shrink lock, shared, if the cache is elastic.
    fn lend(&self) -> Option<RwLockReadGuard<'_, ()>> {
        self.elastic.then(|| self.shrink.read_recursive())
    }

    /// True if a file of `size` bytes read now would be kept, whole or in part: the policy
    /// evicts to make room, or one that never evicts has room for its first block.
    pub fn would_keep(&self, size: u64) -> bool {
        if !self.keeps {
            return false;
        }
        let first = self.blocks().len(size, 0);
        self.evicts() || self.has_room_for(first)
    }

    /// The memory a block of `len` bytes of a file of `size` bytes takes where it would be
    /// stored.
    fn footprint(&self, size: u64, len: u64) -> u64 {
        match self.kernel.get() {
            Some(files) if files.takes(size) => KernelFiles::footprint(len),
            _ => self.store.footprint(len as usize),
        }
    }

    /// From now on, while the cache never evicts, the blocks of files over
    /// [`kernel_files::MIN_FILE`] go to files the kernel can read itself (a FUSE passthrough
    /// backing file: [`BlockCache::open_for_kernel`]), on the keeper's tmpfs or else a new one
    /// of `pages`. Fails where no private tmpfs can be made (no `CAP_SYS_ADMIN`); the arena
    /// then keeps everything.
    pub fn keep_files_for_kernel(&self, pages: kernel_files::Pages) -> std::io::Result<()> {
        if !matches!(self.store, Store::Arena(_)) {
            return Err(std::io::Error::other(
                "only a cache that never evicts keeps files",
            ));
        }
        let files = match self.kept_tmpfs.lock().take() {
            Some(root) => KernelFiles::on(root),
            None => KernelFiles::new(self.ceiling(), pages)?,
        };
        let _ = self.kernel.set(files);
        Ok(())
    }

    /// From now on new blocks go to the arena: the kernel will not read files itself. What
    /// is in files already is still served.
    pub fn stop_keeping_files_for_kernel(&self) {
        if let Some(files) = self.kernel.get() {
            files.stop_taking();
        }
    }

    /// True if a file the kernel can read holds every byte of `version`.
    pub fn holds_for_kernel(&self, version: &FileVersion) -> bool {
        self.kernel.get().is_some_and(|f| f.holds(version))
    }

    /// A read-only descriptor of a file holding every byte of `version`, for the kernel to
    /// read (see [`kernel_files`]); None if the cache holds none.
    pub fn open_for_kernel(
        &self,
        version: &FileVersion,
    ) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
        self.kernel.get()?.open_whole(version)
    }

    /// How files are cut into blocks.
    pub fn blocks(&self) -> BlockSize {
        BlockSize::new(self.config.block_size)
    }

    /// The cached bytes of `key`, if any.
    pub fn get(&self, key: &BlockKey) -> Option<CachedBytes<'_>> {
        let lent = self.lend();
        let found = {
            let index = self.index.read();
            match (index.blocks.get(key)?, &self.store) {
                (Stored::Arena(slot), Store::Arena(arena)) => {
                    CachedBytes::Arena(arena.get(*slot), lent)
                }
                (Stored::Mapped(block), _) => CachedBytes::Mapped(block.clone()),
                (Stored::Kernel { offset, len, .. }, _) => {
                    let (offset, len) = (*offset, *len as usize);
                    drop(index);
                    let files = self.kernel.get()?;
                    match files.view(&key.version, offset, len) {
                        Ok(map) => CachedBytes::File(map, lent),
                        Err(e) => {
                            tracing::warn!("reading a cached block back: {e}");
                            return None;
                        }
                    }
                }
                (Stored::Arena(_), _) => return None,
            }
        };
        if self.touch {
            self.policy.lock().touch(key);
        }
        Some(found)
    }

    /// A copy of the cached bytes of `key`, if any (and memory for the copy).
    pub fn copy_of(&self, key: &BlockKey) -> Option<Arc<Block>> {
        Block::copy_of(&self.get(key)?).ok().map(Arc::new)
    }

    /// True if `key` is cached.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.index.read().blocks.contains_key(key)
    }

    /// Offers fetched bytes to the cache. Returns true if they were admitted.
    pub fn insert(&self, key: BlockKey, data: &[u8]) -> bool {
        if !self.keeps {
            return false;
        }
        // From the admission to the publication: a shrink waits, so that it never gives back
        // a slot being written nor counts what is not in the index yet.
        let _admitting = self.lend();
        let footprint = self.footprint(key.version.size, data.len() as u64);
        let admission = self.policy.lock().admit(&key, footprint);
        let evict = match admission {
            Admission::Refuse => {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            Admission::Admit { evict } => evict,
        };
        let for_kernel = self.write_for_kernel(&key, data);
        let stored = match &self.store {
            _ if for_kernel.is_some() => for_kernel,
            Store::Arena(arena) => match arena.alloc(data.len()) {
                Some(slot) => {
                    arena.write(slot, data);
                    Some(Stored::Arena(slot))
                }
                // Unreachable while the policy's capacity equals the arena's; refuse rather
                // than trust that.
                None => None,
            },
            Store::Mappings => match self.map_block(data) {
                Ok(block) => Some(Stored::Mapped(Arc::new(block))),
                Err(e) => {
                    tracing::warn!("caching a block: {e}");
                    None
                }
            },
            Store::Nothing => None,
        };
        let mut index = self.index.write();
        // What the policy evicted goes even if the newcomer cannot be stored: the policy no
        // longer counts it, and the budget holds only while the index holds what it counts.
        for (k, _) in &evict {
            if index.remove(k).is_some() {
                self.counters.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let Some(stored) = stored else {
            // Out of arena, address space or memory: the policy stops counting the newcomer.
            drop(index);
            self.policy.lock().remove(&key, footprint);
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        if let (Stored::Kernel { len, .. }, Some(files)) = (&stored, self.kernel.get()) {
            files.published(&key.version, *len as i64);
        }
        index.add(key, stored);
        true
    }

    /// Writes block `key` to its file's file the kernel can read, if it goes there; None if
    /// it does not, or the write failed (the arena takes it then, at no more memory than the
    /// policy counted).
    fn write_for_kernel(&self, key: &BlockKey, data: &[u8]) -> Option<Stored> {
        let files = self.kernel.get().filter(|f| f.takes(key.version.size))?;
        let offset = self.blocks().offset(key.block);
        match files.write(&key.version, offset, data) {
            Ok(file) => Some(Stored::Kernel {
                offset,
                len: data.len() as u64,
                file,
            }),
            Err(e) => {
                files.write_failed(&e);
                None
            }
        }
    }

    /// Drops block `key`, if it is cached. A mapping is given back to the kernel and the
    /// policy stops counting it; an arena slot is not (the arena only grows), so the policy
    /// goes on counting its memory.
    pub fn remove(&self, key: &BlockKey) {
        let Some(old) = self.index.write().remove(key) else {
            return;
        };
        if let (Stored::Kernel { len, .. }, Some(files)) = (&old, self.kernel.get()) {
            files.published(&key.version, -(*len as i64));
        }
        if let Stored::Mapped(block) = old {
            let footprint = self.store.footprint(block.len);
            self.policy.lock().remove(key, footprint);
        }
    }

    /// A mapping of its own holding `data` (LRU's store).
    fn map_block(&self, data: &[u8]) -> std::io::Result<MappedBlock> {
        #[cfg(test)]
        if self.fail_next_mapping.swap(false, Ordering::Relaxed) {
            return Err(std::io::ErrorKind::OutOfMemory.into());
        }
        MappedBlock::new(data)
    }

    /// Cached bytes of file `version`.
    pub fn cached_bytes_of(&self, version: &FileVersion) -> u64 {
        self.index
            .read()
            .per_file
            .get(version)
            .copied()
            .unwrap_or(0)
    }

    /// True if every byte of `version` is cached (an empty file is, with a cache).
    pub fn holds_file(&self, version: &FileVersion) -> bool {
        self.keeps && self.cached_bytes_of(version) >= version.size
    }

    /// Memory held, as the policy counts it (the budget's unit: stored bytes plus alignment).
    pub fn used(&self) -> u64 {
        self.policy.lock().used()
    }

    /// Bytes of file data held.
    pub fn cached_bytes(&self) -> u64 {
        self.index.read().bytes
    }

    /// Files whose every byte is cached.
    pub fn cached_files(&self) -> u64 {
        self.index.read().full_files
    }

    /// Blocks held.
    pub fn cached_blocks(&self) -> u64 {
        self.index.read().blocks.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(ino: u64, size: u64) -> FileVersion {
        FileVersion::of_test(ino, size)
    }

    fn cache(policy: PolicyKind, capacity: u64) -> BlockCache {
        BlockCache::new(CacheConfig {
            policy,
            capacity,
            ceiling: None,
            block_size: NonZeroU64::new(1000).unwrap(),
        })
        .unwrap()
    }

    proptest::proptest! {
        /// The running total of cached bytes is the sum over files, whatever was inserted,
        /// replaced, removed or evicted (LRU) in whatever order.
        #[test]
        fn cached_bytes_is_the_sum_over_files(
            lru in proptest::bool::ANY,
            ops in proptest::collection::vec((0u64..6, 0u64..3, 1usize..1000, proptest::bool::ANY), 1..60),
        ) {
            let policy = if lru { PolicyKind::Lru } else { PolicyKind::MinIo };
            let c = cache(policy, 4096);
            for (ino, block, len, insert) in ops {
                let key = BlockKey { version: version(ino, 3000), block };
                if insert {
                    c.insert(key, &vec![1; len]);
                } else {
                    c.remove(&key);
                }
                let sum: u64 = c.index.read().per_file.values().sum();
                proptest::prop_assert_eq!(c.cached_bytes(), sum);
            }
        }
    }

    /// Memory for a kept cache, and a copy of its descriptors for a successor's.
    fn memory(tmpfs: bool) -> (CacheMemory, impl Fn() -> CacheMemory) {
        let arena: std::os::fd::OwnedFd =
            rustix::fs::memfd_create("test-arena", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let journal = Arc::new(CacheJournal::create().unwrap());
        let tmpfs = tmpfs
            .then(|| kernel_files::tmpfs(1 << 20, kernel_files::Pages::Huge).ok())
            .flatten();
        let again = {
            let (arena, journal) = (arena.try_clone().unwrap(), journal.clone());
            let tmpfs = tmpfs.as_ref().map(|t| t.try_clone().unwrap());
            move || CacheMemory {
                arena: arena.try_clone().unwrap(),
                journal: journal.clone(),
                tmpfs: tmpfs.as_ref().map(|t| t.try_clone().unwrap()),
            }
        };
        (
            CacheMemory {
                arena,
                journal,
                tmpfs,
            },
            again,
        )
    }

    fn config(capacity: u64, ceiling: Option<u64>) -> CacheConfig {
        CacheConfig {
            policy: PolicyKind::MinIo,
            capacity,
            ceiling,
            block_size: NonZeroU64::new(1000).unwrap(),
        }
    }

    #[test]
    fn a_policy_is_found_by_its_name() {
        for kind in PolicyKind::ALL {
            assert_eq!(PolicyKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(PolicyKind::from_name("MinIO"), None);
        assert_eq!(PolicyKind::ALL[0], PolicyKind::default());
    }

    #[test]
    fn a_kept_cache_is_taken_over_with_the_bytes_it_held_and_no_more() {
        let (first, again) = memory(false);
        let c = BlockCache::kept(config(8192, None), first).unwrap();
        assert_eq!(c.restore().unwrap(), Restored::default());
        let key = |ino, block| BlockKey {
            version: version(ino, 2500),
            block,
        };
        for (k, fill) in [(key(1, 0), 1u8), (key(1, 1), 2), (key(2, 0), 3)] {
            assert!(c.insert(k, &vec![fill; 1000]));
        }
        c.remove(&key(1, 1));
        let used = c.used();
        drop(c);
        let s = BlockCache::kept(config(8192, None), again()).unwrap();
        let r = s.restore().unwrap();
        assert_eq!((r.blocks, r.bytes, r.dropped), (2, 2000, 0));
        assert_eq!(&*s.get(&key(1, 0)).unwrap(), &[1u8; 1000][..]);
        assert_eq!(&*s.get(&key(2, 0)).unwrap(), &[3u8; 1000][..]);
        assert!(s.get(&key(1, 1)).is_none());
        assert_eq!(s.used(), used);
        assert_eq!(s.cached_bytes(), 2000);
        // New blocks go after what was taken over, and a third daemon finds them all.
        assert!(s.insert(key(3, 0), &[4u8; 1000]));
        assert_eq!(&*s.get(&key(1, 0)).unwrap(), &[1u8; 1000][..]);
        drop(s);
        let t = BlockCache::kept(config(8192, None), again()).unwrap();
        assert_eq!(t.restore().unwrap().blocks, 3);
        assert_eq!(&*t.get(&key(3, 0)).unwrap(), &[4u8; 1000][..]);
        // A smaller fixed budget maps a smaller arena: it takes the blocks that lie in it.
        drop(t);
        let small = BlockCache::kept(config(2100, None), again()).unwrap();
        let r = small.restore().unwrap();
        assert_eq!((r.blocks, r.dropped), (1, 2));
        assert_eq!(&*small.get(&key(1, 0)).unwrap(), &[1u8; 1000][..]);
        assert!(small.get(&key(2, 0)).is_none() && small.get(&key(3, 0)).is_none());
        assert!(small.used() <= 2100);
    }

    #[test]
    fn an_elastic_cache_takes_over_at_least_what_it_held() {
        let (first, again) = memory(true);
        let c = BlockCache::kept(config(4096, Some(1 << 20)), first).unwrap();
        c.keep_files_for_kernel(kernel_files::Pages::Huge).ok();
        c.restore().unwrap();
        // A small file (in the arena) and a big one (a tmpfs file where one could be made).
        let small = BlockKey {
            version: version(1, 500),
            block: 0,
        };
        let big = |block| BlockKey {
            version: version(2, 70_000),
            block,
        };
        assert!(c.insert(small, &[7u8; 500]));
        c.resize(1 << 20);
        for b in 0..70 {
            assert!(c.insert(big(b), &[b as u8; 1000]));
        }
        let held = c.used();
        drop(c);
        // The successor's budget starts below what was held (the memory it holds counts as
        // in use): it keeps it all.
        let s = BlockCache::kept(config(4096, Some(1 << 20)), again()).unwrap();
        s.keep_files_for_kernel(kernel_files::Pages::Huge).ok();
        let r = s.restore().unwrap();
        assert_eq!((r.blocks, r.dropped), (71, 0));
        assert!(s.capacity() >= held);
        assert_eq!(&*s.get(&big(69)).unwrap(), &[69u8; 1000][..]);
        assert_eq!(&*s.get(&small).unwrap(), &[7u8; 500][..]);
    }

    #[test]
    fn minio_keeps_what_it_admitted_and_counts_whole_files() {
        let c = cache(PolicyKind::MinIo, 2048);
        let a = version(1, 1500);
        assert!(c.insert(
            BlockKey {
                version: a,
                block: 0
            },
            &[1; 1000]
        ));
        assert!(!c.holds_file(&a));
        assert!(c.insert(
            BlockKey {
                version: a,
                block: 1
            },
            &[2; 500]
        ));
        assert!(c.holds_file(&a));
        assert_eq!(
            (c.cached_files(), c.cached_bytes(), c.cached_bytes_of(&a)),
            (1, 1500, 1500)
        );
        // 1024 + 512 used (64-byte aligned); 640 more do not fit.
        let b = version(2, 600);
        assert!(!c.insert(
            BlockKey {
                version: b,
                block: 0
            },
            &[3; 600]
        ));
        assert_eq!(c.counters.refused.load(Ordering::Relaxed), 1);
        assert_eq!(
            &*c.get(&BlockKey {
                version: a,
                block: 1
            })
            .unwrap(),
            &[2; 500]
        );
        // A new version of the same file is a different key.
        let a2 = FileVersion { mtime_ns: 5, ..a };
        assert!(
            c.get(&BlockKey {
                version: a2,
                block: 0
            })
            .is_none()
        );
        assert!(c.used() <= 2048);
    }

    fn elastic(policy: PolicyKind, capacity: u64, ceiling: u64) -> BlockCache {
        BlockCache::new(CacheConfig {
            policy,
            capacity,
            ceiling: Some(ceiling),
            block_size: NonZeroU64::new(1000).unwrap(),
        })
        .unwrap()
    }

    fn whole(c: &BlockCache, v: FileVersion, fill: u8) -> bool {
        let blocks = c.blocks();
        (0..blocks.count(v.size)).all(|block| {
            let len = blocks.len(v.size, block) as usize;
            c.insert(BlockKey { version: v, block }, &vec![fill; len])
        })
    }

    #[test]
    fn a_shrunk_minio_drops_its_newest_blocks_and_gives_their_memory_back() {
        let c = elastic(PolicyKind::MinIo, 10_000, 1 << 20);
        // Files of 1, 2 and 1 blocks (1000-byte blocks, 1024 bytes each in the arena).
        let (a, b, d) = (version(1, 1000), version(2, 1500), version(3, 700));
        assert!(whole(&c, a, 1) && whole(&c, b, 2) && whole(&c, d, 3));
        assert_eq!(c.used(), 1024 + 1024 + 512 + 704);
        // d's block, then b's last: b keeps its first.
        let done = c.resize(2100);
        assert_eq!(done.dropped, vec![d], "newest first, until it fits");
        assert_eq!((done.freed, done.files), (704 + 512, 2));
        assert_eq!((c.used(), c.capacity(), c.cached_files()), (2048, 2100, 1));
        assert!(c.holds_file(&a) && !c.holds_file(&b) && !c.holds_file(&d));
        assert_eq!(c.cached_bytes_of(&b), 1000);
        let key = |version, block| BlockKey { version, block };
        assert_eq!(&*c.get(&key(a, 0)).unwrap(), &[1; 1000][..]);
        assert_eq!(&*c.get(&key(b, 0)).unwrap(), &[2; 1000][..]);
        assert!(c.get(&key(b, 1)).is_none());
        // Nothing past the new budget.
        assert!(!c.insert(key(version(5, 100), 0), &[5; 100]));
        // Grown back (no further than the ceiling), it admits again, into the space given
        // back, and the bytes are new.
        assert!(c.resize(u64::MAX).dropped.is_empty());
        assert_eq!(c.capacity(), 1 << 20);
        assert!(c.insert(key(b, 1), &[6; 500]) && c.holds_file(&b));
        assert!(whole(&c, version(4, 1000), 4));
        assert_eq!(&*c.get(&key(b, 1)).unwrap(), &[6; 500][..]);
        assert_eq!(&*c.get(&key(version(4, 1000), 0)).unwrap(), &[4; 1000][..]);
        assert_eq!(c.counters.shrink_dropped_files.load(Ordering::Relaxed), 2);
        // To nothing: everything goes.
        let done = c.resize(0);
        assert_eq!(done.dropped.len(), 3);
        assert_eq!((c.used(), c.cached_bytes(), c.cached_blocks()), (0, 0, 0));
    }

    /// An elastic MinIO cache of 1 MiB with 64 KiB blocks that keeps files for the kernel;
    /// None where no private tmpfs can be made (no `CAP_SYS_ADMIN`).
    fn kernel_cache() -> Option<BlockCache> {
        let c = BlockCache::new(CacheConfig {
            policy: PolicyKind::MinIo,
            capacity: 1 << 20,
            ceiling: Some(1 << 20),
            block_size: NonZeroU64::new(1 << 16).unwrap(),
        })
        .unwrap();
        c.keep_files_for_kernel(kernel_files::Pages::Huge)
            .is_ok()
            .then_some(c)
    }

    #[test]
    fn a_shrink_unlinks_the_files_the_kernel_reads_newest_first() {
        let Some(c) = kernel_cache() else {
            return; // no private tmpfs without CAP_SYS_ADMIN: the arena's case is tested above
        };
        let (small, a, b) = (version(1, 1000), version(2, 100_000), version(3, 100_000));
        assert!(whole(&c, small, 1) && whole(&c, a, 2) && whole(&c, b, 3));
        assert!(c.holds_for_kernel(&a) && c.holds_for_kernel(&b));
        let open = c.open_for_kernel(&b).unwrap().unwrap();
        // b's two blocks: whole pages each, and the file's overhead per block.
        let b_bytes = KernelFiles::footprint(65536) + KernelFiles::footprint(100_000 - 65536);
        let done = c.resize(c.used() - 1);
        assert_eq!((done.dropped, done.freed), (vec![b], b_bytes));
        assert!(!c.holds_for_kernel(&b) && c.open_for_kernel(&b).is_none());
        assert!(c.holds_for_kernel(&a) && c.holds_file(&small));
        // An open descriptor still reads the whole file.
        let mut back = vec![0u8; 100_000];
        assert_eq!(rustix::io::pread(&open, &mut back, 0).unwrap(), 100_000);
        assert!(back.iter().all(|&x| x == 3));
        // The small file, in the arena, came first: a goes before it.
        assert_eq!(c.resize(1).dropped, vec![a, small]);
        assert_eq!(c.used(), 0);
    }

    #[test]
    fn a_shrink_takes_back_the_arena_s_last_slots_when_files_interleave() {
        let c = elastic(PolicyKind::MinIo, 1 << 20, 1 << 20);
        let (a, b) = (version(1, 2000), version(2, 2000));
        let key = |version, block| BlockKey { version, block };
        // a0 b0 a1 b1 in the arena.
        for k in [key(a, 0), key(b, 0), key(a, 1), key(b, 1)] {
            assert!(c.insert(k, &[7; 1000]));
        }
        // The arena gives memory back from its end only: b1 goes, b0 stays.
        let done = c.resize(3 * 1024);
        assert_eq!((done.dropped.len(), done.freed, done.files), (0, 1024, 1));
        assert!(c.holds_file(&a) && c.cached_bytes_of(&b) == 1000);
        assert_eq!(c.used(), 3 * 1024);
        // Then a1, and b0: b is gone, a keeps a0.
        let done = c.resize(1024);
        assert_eq!((done.dropped, done.freed, done.files), (vec![b], 2048, 2));
        assert_eq!((c.cached_bytes_of(&a), c.cached_bytes_of(&b)), (1000, 0));
        assert_eq!(&*c.get(&key(a, 0)).unwrap(), &[7; 1000][..]);
    }

    #[test]
    fn a_shrink_cuts_the_newest_blocks_of_a_file_the_kernel_never_opened_whole() {
        let Some(c) = kernel_cache() else {
            return; // no private tmpfs without CAP_SYS_ADMIN: the arena's case is tested above
        };
        // A shard of four blocks, read whole, that no open took for its backing file.
        let shard = version(1, 4 << 16);
        let key = |block| BlockKey {
            version: shard,
            block,
        };
        for block in 0..4 {
            assert!(c.insert(key(block), &[block as u8 + 1; 1 << 16]));
        }
        assert!(c.holds_for_kernel(&shard));
        // A block and a half short: its last two blocks go, the file stays.
        let block = KernelFiles::footprint(1 << 16);
        let done = c.resize(c.used() - block - block / 2);
        assert_eq!(
            (done.dropped.len(), done.freed, done.files),
            (0, 2 * block, 1)
        );
        assert_eq!(c.cached_bytes_of(&shard), 2 << 16);
        assert!(!c.holds_for_kernel(&shard) && c.open_for_kernel(&shard).is_none());
        for b in 0..2 {
            assert_eq!(&*c.get(&key(b)).unwrap(), &[b as u8 + 1; 1 << 16][..]);
        }
        assert!(c.get(&key(2)).is_none() && c.get(&key(3)).is_none());
        // Read again with room, it is whole again, and an open for the kernel reads it all.
        c.resize(u64::MAX);
        for block in 2..4 {
            assert!(c.insert(key(block), &[block as u8 + 11; 1 << 16]));
        }
        let open = c.open_for_kernel(&shard).unwrap().unwrap();
        let mut back = vec![0u8; 4 << 16];
        assert_eq!(rustix::io::pread(&open, &mut back, 0).unwrap(), 4 << 16);
        let expected = [1u8, 2, 13, 14].map(|fill| vec![fill; 1 << 16]).concat();
        assert!(back == expected);
        // Opened whole, it is never cut: a shrink drops it whole, and the open reads it still.
        let done = c.resize(c.used() - 1);
        assert_eq!((done.dropped, done.freed), (vec![shard], 4 * block));
        assert_eq!(rustix::io::pread(&open, &mut back, 0).unwrap(), 4 << 16);
        assert!(back == expected);
    }

    #[test]
    fn a_shrunk_lru_evicts_the_least_recently_used() {
        let c = elastic(PolicyKind::Lru, 3 * 4096, 1 << 20);
        let key = |ino| BlockKey {
            version: version(ino, 1000),
            block: 0,
        };
        for ino in 1..=3 {
            assert!(c.insert(key(ino), &[ino as u8; 1000]));
        }
        assert!(c.get(&key(1)).is_some());
        let done = c.resize(4096);
        assert_eq!((done.evicted, done.freed, done.dropped.len()), (2, 8192, 0));
        assert!(c.get(&key(1)).is_some() && c.get(&key(2)).is_none());
        assert_eq!(c.used(), 4096);
    }

    #[test]
    fn lru_evicts_and_keeps_counts_right() {
        // Each 1000-byte block takes a 4 KiB page.
        let c = cache(PolicyKind::Lru, 8192);
        let (a, b, d) = (version(1, 1000), version(2, 1000), version(3, 1000));
        assert!(c.insert(
            BlockKey {
                version: a,
                block: 0
            },
            &[1; 1000]
        ));
        assert!(c.insert(
            BlockKey {
                version: b,
                block: 0
            },
            &[2; 1000]
        ));
        assert!(
            c.get(&BlockKey {
                version: a,
                block: 0
            })
            .is_some()
        );
        assert!(c.insert(
            BlockKey {
                version: d,
                block: 0
            },
            &[3; 1000]
        ));
        assert!(c.holds_file(&a) && !c.holds_file(&b) && c.holds_file(&d));
        assert_eq!(
            (c.cached_files(), c.cached_bytes(), c.used()),
            (2, 2000, 8192)
        );
        assert_eq!(c.counters.evicted.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn lru_keeps_its_budget_when_a_mapping_fails() {
        // Two 4 KiB pages of budget; each 1000-byte block takes a page.
        let c = cache(PolicyKind::Lru, 8192);
        let key = |ino| BlockKey {
            version: version(ino, 1000),
            block: 0,
        };
        assert!(c.insert(key(1), &[1; 1000]));
        assert!(c.insert(key(2), &[2; 1000]));
        // Admitting 3 evicts 1, then 3's mapping fails.
        c.fail_next_mapping.store(true, Ordering::Relaxed);
        assert!(!c.insert(key(3), &[3; 1000]));
        assert!(c.get(&key(1)).is_none(), "the evicted block is gone");
        assert!(c.get(&key(3)).is_none());
        assert_eq!((c.cached_blocks(), c.used()), (1, 4096));
        // The policy counts exactly what the index holds, so the budget holds from here on.
        for ino in 4..10 {
            assert!(c.insert(key(ino), &[4; 1000]));
            assert_eq!(c.used(), c.cached_blocks() * 4096, "after {ino}");
            assert!(c.cached_blocks() * 4096 <= 8192, "after {ino}");
        }
        assert_eq!(c.counters.refused.load(Ordering::Relaxed), 1);
    }

    /// A policy that admits everything and evicts as it is told it does.
    struct Told {
        evicts: bool,
    }

    impl CachePolicy<BlockKey> for Told {
        fn admit(&mut self, _key: &BlockKey, _size: u64) -> Admission<BlockKey> {
            Admission::Admit { evict: Vec::new() }
        }
        fn touch(&mut self, _key: &BlockKey) {}
        fn remove(&mut self, _key: &BlockKey, _size: u64) {}
        fn used(&self) -> u64 {
            0
        }
        fn capacity(&self) -> u64 {
            0
        }
        fn resize(&mut self, _capacity: u64) -> Vec<(BlockKey, u64)> {
            Vec::new()
        }
        fn evicts(&self) -> bool {
            self.evicts
        }
        fn needs_touch(&self) -> bool {
            false
        }
        fn admits_prefetch(&self) -> bool {
            false
        }
    }

    #[test]
    fn the_store_follows_what_the_policy_needs() {
        let store = |p: &dyn CachePolicy<BlockKey>| Store::for_policy(p, 4096).unwrap();
        assert!(matches!(store(&Told { evicts: false }), Store::Arena(_)));
        assert!(matches!(store(&Told { evicts: true }), Store::Mappings));
        assert!(matches!(store(&NoCachePolicy), Store::Nothing));
        assert!(matches!(
            store(&*PolicyKind::MinIo.policy(4096)),
            Store::Arena(_)
        ));
        assert!(matches!(
            store(&*PolicyKind::Lru.policy(4096)),
            Store::Mappings
        ));
        assert!(PolicyKind::MinIo.caches() && PolicyKind::Lru.caches());
        assert!(!PolicyKind::None.caches());
    }

    #[test]
    fn no_cache_admits_nothing() {
        let c = cache(PolicyKind::None, 1 << 20);
        let a = version(1, 0);
        assert!(!c.insert(
            BlockKey {
                version: a,
                block: 0
            },
            &[]
        ));
        assert!(!c.holds_file(&a));
    }
}
