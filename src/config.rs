//! Plain configuration of a mount. The CLI (`cli.rs`) fills these in; nothing below the CLI
//! sees clap. Every field says its unit.

use std::path::PathBuf;
use std::time::Duration;

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
    /// Let users other than the mounting one use the mount (`allow_other`).
    pub allow_other: bool,
    /// Mount over a non-empty directory.
    pub allow_non_empty: bool,
    /// Threads that read the source for cache misses.
    pub io_threads: usize,
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
            allow_other: false,
            allow_non_empty: false,
            // Enough concurrent source reads to keep a network filesystem's pipe full (a
            // 2 ms round trip and 110 KiB files need ~30 in flight for 1.5 GiB/s), few enough
            // that idle threads cost nothing worth mentioning.
            io_threads: 64,
        }
    }
}

/// The default number of FUSE threads: one per CPU.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}
