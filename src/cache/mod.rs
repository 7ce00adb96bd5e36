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
//! Locks: the policy's mutex is held only for the decision, the index's lock only to look
//! up or publish; copying bytes happens outside both.

pub mod arena;
pub mod kernel_files;
pub mod policy;

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::block::{Block, BlockSize};
use crate::namespace::FileVersion;
use arena::{Arena, Slot};
use kernel_files::KernelFiles;
use policy::{Admission, CachePolicy, LruPolicy, MinIoPolicy, NoCachePolicy};

/// Which policy a cache follows.
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
    /// Bytes the cache may hold.
    pub capacity: u64,
    /// Bytes per block of a large file; files up to this size are cached whole. Never zero:
    /// every block count and offset divides or multiplies by it.
    pub block_size: NonZeroU64,
}

/// One block of one version of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub version: FileVersion,
    pub block: u64,
}

/// One block of LRU's: its own anonymous mapping.
#[derive(Debug)]
pub struct MappedBlock {
    map: memmap2::Mmap,
    len: usize,
}

impl MappedBlock {
    fn new(data: &[u8]) -> std::io::Result<Self> {
        let mut map = memmap2::MmapOptions::new()
            .len(data.len().max(1))
            .map_anon()?;
        map[..data.len()].copy_from_slice(data);
        Ok(MappedBlock {
            map: map.make_read_only()?,
            len: data.len(),
        })
    }

    /// The memory a mapping of `len` bytes takes: whole pages.
    fn footprint(len: usize) -> usize {
        len.max(1).div_ceil(PAGE) * PAGE
    }
}

/// The page size that mappings are rounded to.
const PAGE: usize = 4096;

/// Where admitted blocks are kept: chosen by what the policy needs, not by its name.
#[derive(Debug)]
enum Store {
    /// Nothing: the policy admits nothing.
    Nothing,
    /// An append-only arena, for a policy that never evicts.
    Arena(Arena),
    /// A mapping per block, given back to the kernel when the policy evicts it.
    Mappings,
}

impl Store {
    /// The store `policy` needs, for a cache of `capacity` bytes. An arena reserves its
    /// address space here.
    fn for_policy(policy: &dyn CachePolicy<BlockKey>, capacity: u64) -> std::io::Result<Self> {
        Ok(if !policy.keeps_anything() {
            Store::Nothing
        } else if policy.evicts() {
            Store::Mappings
        } else {
            Store::Arena(Arena::new(capacity as usize)?)
        })
    }

    /// The memory `len` bytes take in this store: what the budget counts.
    fn footprint(&self, len: usize) -> u64 {
        match self {
            Store::Arena(_) => Arena::footprint(len) as u64,
            Store::Nothing | Store::Mappings => MappedBlock::footprint(len) as u64,
        }
    }
}

#[derive(Clone, Debug)]
enum Stored {
    Arena(Slot),
    Mapped(Arc<MappedBlock>),
    /// In its file's file on the private tmpfs ([`kernel_files`]), at `offset`.
    Kernel {
        offset: u64,
        len: u64,
    },
}

impl Stored {
    fn len(&self) -> u64 {
        match self {
            Stored::Arena(s) => s.len as u64,
            Stored::Mapped(b) => b.len as u64,
            Stored::Kernel { len, .. } => *len,
        }
    }
}

/// Bytes found in the cache.
#[derive(Clone, Debug)]
pub enum CachedBytes<'a> {
    Arena(&'a [u8]),
    Mapped(Arc<MappedBlock>),
    /// Read from a file the kernel can read ([`kernel_files`]) into a block of its own.
    Copied(Arc<Block>),
}

impl std::ops::Deref for CachedBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            CachedBytes::Arena(b) => b,
            CachedBytes::Mapped(b) => &b.map[..b.len],
            CachedBytes::Copied(b) => b,
        }
    }
}

#[derive(Debug, Default)]
struct Index {
    blocks: HashMap<BlockKey, Stored>,
    /// Cached bytes per file version.
    per_file: HashMap<FileVersion, u64>,
    /// Versions whose every byte is cached.
    full_files: u64,
}

impl Index {
    fn add(&mut self, key: BlockKey, stored: Stored) {
        let len = stored.len();
        if let Some(old) = self.blocks.insert(key, stored) {
            self.sub(key.version, old.len());
        }
        let bytes = self.per_file.entry(key.version).or_default();
        let was_full = *bytes >= key.version.size;
        *bytes += len;
        if !was_full && *bytes >= key.version.size {
            self.full_files += 1;
        }
    }

    fn remove(&mut self, key: &BlockKey) -> Option<Stored> {
        let old = self.blocks.remove(key)?;
        self.sub(key.version, old.len());
        Some(old)
    }

    fn sub(&mut self, version: FileVersion, len: u64) {
        if let Some(bytes) = self.per_file.get_mut(&version) {
            let was_full = *bytes >= version.size;
            *bytes -= len.min(*bytes);
            if was_full && *bytes < version.size {
                self.full_files -= 1;
            }
            if *bytes == 0 {
                self.per_file.remove(&version);
            }
        }
    }
}

/// Counters the cache keeps about itself.
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Blocks refused because the cache was full.
    pub refused: AtomicU64,
    /// Blocks evicted (LRU).
    pub evicted: AtomicU64,
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
    /// Makes the next mapping fail, as an exhausted address space or memory would.
    #[cfg(test)]
    fail_next_mapping: std::sync::atomic::AtomicBool,
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
        let policy = config.policy.policy(config.capacity);
        let store = Store::for_policy(&*policy, config.capacity)?;
        Ok(BlockCache {
            config,
            keeps: policy.keeps_anything(),
            touch: policy.needs_touch(),
            prefetch: policy.admits_prefetch(),
            policy: Mutex::new(policy),
            index: RwLock::new(Index::default()),
            store,
            counters: CacheCounters::default(),
            keeps_path: std::sync::OnceLock::new(),
            kernel: std::sync::OnceLock::new(),
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

    /// True if a policy that never evicts has room for `bytes` more now: a file fetched next
    /// will be kept whole, since such a policy refuses nothing while it has room.
    pub fn has_room_for(&self, bytes: u64) -> bool {
        if !self.keeps || !self.prefetch {
            return false;
        }
        let footprint = self.footprint(bytes, bytes);
        self.policy.lock().used() + footprint <= self.config.capacity
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
    /// backing file: [`BlockCache::open_for_kernel`]). Fails where no private tmpfs can be made
    /// (no `CAP_SYS_ADMIN`); the arena then keeps everything.
    pub fn keep_files_for_kernel(&self) -> std::io::Result<()> {
        if !matches!(self.store, Store::Arena(_)) {
            return Err(std::io::Error::other(
                "only a cache that never evicts keeps files",
            ));
        }
        let files = KernelFiles::new(self.config.capacity)?;
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
        let found = {
            let index = self.index.read();
            match (index.blocks.get(key)?, &self.store) {
                (Stored::Arena(slot), Store::Arena(arena)) => CachedBytes::Arena(arena.get(*slot)),
                (Stored::Mapped(block), _) => CachedBytes::Mapped(block.clone()),
                (Stored::Kernel { offset, len }, _) => {
                    let (offset, len) = (*offset, *len as usize);
                    drop(index);
                    let files = self.kernel.get()?;
                    match files.read(&key.version, offset, len) {
                        Ok(block) => CachedBytes::Copied(Arc::new(block)),
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
            Ok(()) => Some(Stored::Kernel {
                offset,
                len: data.len() as u64,
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
        self.index.read().per_file.values().sum()
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
            block_size: NonZeroU64::new(1000).unwrap(),
        })
        .unwrap()
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
