//! Epoch-aware prefetch: fetch what each job will read next, into the staging area.
//!
//! The files a job has not read yet in its epoch will all be read before the epoch ends
//! (CoorDL, VLDB 2021). Prefetching from that remaining set wastes no I/O: every
//! staged byte is read by the job this epoch. With a staging area of S files and U uncached
//! files, a random order still turns about S(1 + ln(U/S)) misses per epoch into hits, and
//! the prefetcher reads in on-disk (inode) order with a deep queue, which storage likes.
//! With an order hint (NoPFS) the prefetcher follows the job's order exactly and every
//! uncached file can be staged before the job asks for it.
//!
//! Whom to prefetch for and what next is pure ([`plan`]); how deep to read is learned from
//! the storage ([`pacer`]); where the blocks wait is the staging tier
//! ([`crate::tier::staging`]).

pub mod pacer;
pub mod plan;

/// How the prefetcher runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchConfig {
    pub enabled: bool,
    /// Bytes the staging area may hold, in flight included.
    pub memory: u64,
    /// Prefetch fetches in flight at once.
    pub depth: usize,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            enabled: true,
            // Enough for ~2,400 ImageNet-sized files: past the point where the remaining-set
            // gain S(1 + ln(U/S)) flattens for caches of a few GiB, small beside the cache.
            memory: 256 << 20,
            // A deep queue for network storage (16 x 2 ms round trips ~ 8,000 files/s) that a
            // local disk also serves well.
            depth: 16,
        }
    }
}
