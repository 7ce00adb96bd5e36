//! Plain configuration of a mount. The CLI (`cli.rs`) fills these in; nothing below the CLI
//! sees clap. Every field says its unit. Building one probes nothing: what depends on the
//! machine (the cache budget, the staging area in a memory cgroup) `coorfs mount` decides
//! in its preflight (`daemon/preflight.rs`).

use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

use crate::cache::{CacheConfig, PolicyKind};
use crate::jobs::{HintLimits, JobConfig};
use crate::prefetch::PrefetchConfig;

/// Who opens the mount's files (`--opens`; see `crate::fs`'s `told/`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Opens {
    /// The daemon until the scan shows it safe, then the kernel, which tells the daemon.
    #[default]
    Auto,
    /// Every open asks the daemon.
    Daemon,
    /// The kernel from the first open (`--fast-open`).
    Kernel,
}

/// How a mount serves its source.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// The dataset directory (absolute, canonical).
    pub source: PathBuf,
    /// Where it appears (absolute, canonical).
    pub mountpoint: PathBuf,
    /// FUSE worker threads.
    pub threads: usize,
    /// How long the kernel may cache entries and attributes.
    pub metadata_ttl: Duration,
    /// An object store's objects from this manifest file instead of a listing.
    pub manifest: Option<std::path::PathBuf>,
    /// Let users other than the mounting one use the mount (`allow_other`).
    pub allow_other: bool,
    /// The kernel evaluates the source's POSIX ACLs (FUSE_POSIX_ACL).
    pub acl: bool,
    /// Who opens the mount's files: the daemon, or the kernel by itself (`--opens`).
    pub opens: Opens,
    /// The kernel may read files from backing files by itself (FUSE passthrough; off with
    /// `--no-passthrough`).
    pub passthrough: bool,
    /// A keeper process holds the FUSE connection and replaces a daemon that dies (root
    /// only; off with `--no-keeper`).
    pub keeper: bool,
    /// Whether the kernel's requests come over io_uring (`--io-uring`).
    pub io_uring: IoUring,
    /// Mount over a non-empty directory.
    pub allow_non_empty: bool,
    /// Threads that read the source for cache misses.
    pub io_threads: usize,
    /// Bytes of an object-store part: a big object is read in ranged GETs of this size (a
    /// whole number of cache blocks; the block size or less reads block by block).
    pub part_size: u64,
    /// Bytes the kernel may read ahead in an open file of the mount (the mount's
    /// `read_ahead_kb`, set by root at mount); 0 leaves the kernel's default (128 KiB).
    pub readahead: u64,
    /// The cache: policy, budget (bytes) and block size (bytes).
    pub cache: CacheConfig,
    /// The budget was given (`--cache-size`). If not, `preflight` replaces the
    /// [`UNDECIDED_CACHE_SIZE`] of [`MountConfig::new`] with an elastic budget that starts at
    /// what the memory cgroup (or host) has free.
    pub cache_size_given: bool,
    /// How the budget was chosen, for the daemon's log (set by `preflight`).
    pub cache_size_why: String,
    /// The rules of an elastic budget (`--cache-size auto`, the default), set by `preflight`:
    /// the daemon then watches the memory and resizes the cache ([`crate::elastic`]).
    pub elastic: Option<crate::elastic::Rules>,
    /// `--prefetch-memory` was given; if not, `preflight` sizes the staging area to the
    /// memory cgroup.
    pub prefetch_memory_given: bool,
    /// How jobs are told apart, and forgotten.
    pub jobs: JobConfig,
    /// Bytes the node table may take before the daemon would outgrow its memory (the scan
    /// warns past it); None if unknown.
    pub metadata_room: Option<u64>,
    /// Bytes of memory that order hints may hold, in total and per user.
    pub hint_limits: HintLimits,
    /// The user who mounts (under `--job-key none`, the one user besides root who may hint).
    pub owner_uid: u32,
    /// The prefetcher: on or off, staging budget (bytes), queue depth.
    pub prefetch: PrefetchConfig,
    /// Added to every read of the source: emulates network storage in benchmarks.
    pub read_delay: Duration,
    /// Where Prometheus metrics are served (`--metrics-addr`), if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The cluster this mount is a member of (`--peers`), if any.
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// The disk tier (`--cache-dir`, `--disk-cache-size`), if any.
    pub disk: Option<crate::tier::disk::DiskConfig>,
}

impl MountConfig {
    /// The defaults for a mount of `source` at `mountpoint`.
    pub fn new(source: PathBuf, mountpoint: PathBuf) -> Self {
        MountConfig {
            source,
            mountpoint,
            threads: default_threads(),
            // The dataset is immutable while a job trains on it; a day is "forever" for the
            // kernel's caches while still letting a changed tree show up eventually.
            metadata_ttl: Duration::from_secs(24 * 3600),
            manifest: None,
            allow_other: false,
            acl: false,
            opens: Opens::Auto,
            passthrough: true,
            keeper: true,
            io_uring: IoUring::Off,
            allow_non_empty: false,
            // Enough concurrent source reads to keep a network filesystem's pipe full (a
            // 2 ms round trip and 110 KiB files need ~30 in flight for 1.5 GiB/s), few enough
            // that idle threads cost nothing worth mentioning.
            io_threads: 64,
            part_size: DEFAULT_PART_SIZE,
            readahead: DEFAULT_READAHEAD,
            cache: CacheConfig {
                policy: PolicyKind::default(),
                capacity: UNDECIDED_CACHE_SIZE,
                ceiling: None,
                block_size: DEFAULT_BLOCK_SIZE,
            },
            cache_size_given: false,
            cache_size_why: "default".into(),
            elastic: None,
            prefetch_memory_given: false,
            jobs: JobConfig::default(),
            hint_limits: HintLimits::default(),
            metadata_room: None,
            owner_uid: rustix::process::getuid().as_raw(),
            prefetch: PrefetchConfig::default(),
            read_delay: Duration::ZERO,
            metrics_addr: None,
            cluster: None,
            disk: None,
        }
    }
}

/// The default number of FUSE threads: one per CPU.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}

/// Bytes per cache block of a large file: big enough that a block is one efficient source
/// read, small enough that random access into a big file does not drag in much it won't use.
pub const DEFAULT_BLOCK_SIZE: NonZeroU64 = NonZeroU64::new(1 << 20).unwrap();

/// Bytes of an object-store part (`--part-size`): one ranged GET. At 20 ms to a first byte
/// and about 100 MiB/s a stream, 8 MiB spends a fifth of a GET waiting, where 1 MiB blocks
/// spent two thirds; mountpoint-s3 and the AWS CRT use 8 MiB too.
pub const DEFAULT_PART_SIZE: u64 = 8 << 20;

/// Bytes the kernel may read ahead in an open file (`--readahead`): the window of a reader
/// streaming through a shard. Its default of 128 KiB sent a shard's 16 KiB reads as READs of
/// 128 KiB, one or two in flight; 16 MiB keeps two 8 MiB parts of an object in flight per
/// reader. The pages it reads are the kernel's page cache: reclaimable, and dropped when a
/// streamed file is closed (`fs/open.rs`).
pub const DEFAULT_READAHEAD: u64 = 16 << 20;

/// The cache budget of a [`MountConfig::new`] until something decides it: `coorfs mount`'s
/// `preflight` does, from the memory it finds (`--cache-size auto`, [`crate::elastic`]), and
/// a core built without it (the tests that drive one directly) keeps this. A configuration
/// is plain data: building one probes nothing.
pub const UNDECIDED_CACHE_SIZE: u64 = 1 << 30;

/// A field of /proc/meminfo, in bytes.
pub fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    crate::budget::meminfo_field(&text, field)
}

/// Whether the kernel's requests come over io_uring (FUSE over io_uring, Linux 6.14) or are
/// read from `/dev/fuse` (`--io-uring`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoUring {
    /// Where it cannot cost a read: without a keeper (see `fuse/session.rs`).
    Auto,
    /// Whenever the kernel offers it, under a keeper too.
    On,
    /// Never: requests are read from `/dev/fuse`. The default: io_uring measured no faster
    /// on hot small files (docs/DESIGN.md).
    #[default]
    Off,
}
