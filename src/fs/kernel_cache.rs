//! Whether the kernel's page cache is a free first level over the cache, measured.
//!
//! A hit may be opened with `keep_cache`, so that the kernel serves the file from the pages it
//! cached when it last read it, without asking the daemon. That level is free only while the
//! kernel keeps those pages until the file is read again. When the memory the cache leaves is
//! too small for a second copy (a memory cgroup sized for the cache, a small machine), the
//! kernel reclaims each file's pages before training reads it again an epoch later: every
//! hit then allocates page cache against the limit, reclaims other pages to get it, and copies
//! the bytes twice, for nothing. Direct I/O is cheaper then: the daemon copies from its arena
//! into the reader's buffer. In the setup of `scripts/bench-frameworks.sh`, direct I/O for
//! hits took an epoch of the PyTorch pipeline from 6.8 s to 6.4 s (A/B, 2 rounds); with the
//! source hot and memory to spare, `keep_cache` is 3.5 times as fast (`fuse/mod.rs`).
//!
//! The gauge decides from what the kernel does. One file in [`SENTINEL_EVERY`] (by file id) is
//! a sentinel, always opened with `keep_cache`. A sentinel whose bytes the kernel was given
//! before, opened again, either needs no read (the kernel kept its pages) or asks for them
//! again (it reclaimed them). Over every [`WINDOW`] such reopens, if half or more asked
//! again, the other hits get direct I/O until a window says otherwise.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::namespace::FileId;

/// One file in this many is a sentinel.
pub const SENTINEL_EVERY: FileId = 16;
/// Reopens of sentinels per decision.
pub const WINDOW: u32 = 32;

/// A sentinel's open, watched until it closes.
#[derive(Debug)]
pub struct Watch {
    file: FileId,
    /// The kernel was given the file's bytes before this open.
    reopen: bool,
    asked: AtomicBool,
}

#[derive(Debug, Default)]
struct Window {
    reopens: u32,
    asked: u32,
}

/// See the module documentation.
#[derive(Debug)]
pub struct KernelCacheGauge {
    /// Sentinels whose bytes the kernel has been given.
    given: Mutex<HashSet<FileId>>,
    window: Mutex<Window>,
    keeps: AtomicBool,
    /// Reopened sentinels whose pages the kernel no longer had.
    refills: AtomicU64,
}

impl Default for KernelCacheGauge {
    fn default() -> Self {
        KernelCacheGauge {
            given: Mutex::default(),
            window: Mutex::default(),
            keeps: AtomicBool::new(true),
            refills: AtomicU64::new(0),
        }
    }
}

impl KernelCacheGauge {
    /// True while the kernel keeps the pages it is given (the first guess).
    pub fn keeps(&self) -> bool {
        self.keeps.load(Ordering::Relaxed)
    }

    /// Reopened sentinels the kernel had to read again, since the mount.
    pub fn refills(&self) -> u64 {
        self.refills.load(Ordering::Relaxed)
    }

    /// Whether a hit on `file` may use the kernel's page cache, and the watch to keep on the
    /// open if `file` is a sentinel.
    pub fn open(&self, file: FileId) -> (bool, Option<Watch>) {
        if !file.is_multiple_of(SENTINEL_EVERY) {
            return (self.keeps(), None);
        }
        let reopen = self.given.lock().contains(&file);
        let watch = Watch {
            file,
            reopen,
            asked: AtomicBool::new(false),
        };
        (true, Some(watch))
    }

    /// The kernel asked for bytes of a watched open.
    pub fn asked(&self, watch: &Watch) {
        if !watch.asked.swap(true, Ordering::Relaxed) && !watch.reopen {
            self.given.lock().insert(watch.file);
        }
    }

    /// A watched open closed: a reopen counts towards the window.
    pub fn closed(&self, watch: &Watch) {
        if !watch.reopen {
            return;
        }
        let asked = watch.asked.load(Ordering::Relaxed);
        if asked {
            self.refills.fetch_add(1, Ordering::Relaxed);
        }
        let mut w = self.window.lock();
        w.reopens += 1;
        w.asked += u32::from(asked);
        if w.reopens >= WINDOW {
            let keeps = 2 * w.asked < w.reopens;
            if keeps != self.keeps.swap(keeps, Ordering::Relaxed) {
                tracing::info!(
                    "{} of {} reopened sentinel files were read again: hits {}",
                    w.asked,
                    w.reopens,
                    if keeps {
                        "use the kernel's page cache again"
                    } else {
                        "bypass the kernel's page cache (it does not keep them)"
                    }
                );
            }
            *w = Window::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens sentinel `file`, lets the kernel ask for its bytes if `asks`, and closes it.
    fn cycle(g: &KernelCacheGauge, file: FileId, asks: bool) {
        let (keep, watch) = g.open(file);
        assert!(keep, "sentinels always use the kernel's cache");
        let watch = watch.expect("a sentinel is watched");
        if asks {
            g.asked(&watch);
        }
        g.closed(&watch);
    }

    #[test]
    fn other_files_are_not_watched() {
        let g = KernelCacheGauge::default();
        assert_eq!(g.open(1).1.map(|w| w.file), None);
        assert!(g.open(1).0);
    }

    #[test]
    fn first_reads_do_not_count_and_reads_again_turn_the_kernel_cache_off_and_on() {
        let g = KernelCacheGauge::default();
        let sentinels: Vec<FileId> = (0..WINDOW).map(|i| i * SENTINEL_EVERY).collect();
        // First epoch: the kernel is given every sentinel; nothing is decided.
        for &f in &sentinels {
            cycle(&g, f, true);
        }
        assert!(g.keeps());
        assert_eq!(g.refills(), 0);
        // Kept: reopens need no read.
        for &f in &sentinels {
            cycle(&g, f, false);
        }
        assert!(g.keeps());
        // Reclaimed: half of a window read again is enough to bypass it.
        for (i, &f) in sentinels.iter().enumerate() {
            cycle(&g, f, i % 2 == 0);
        }
        assert!(!g.keeps());
        assert!(!g.open(1).0, "other hits now bypass the kernel's cache");
        assert_eq!(g.refills(), u64::from(WINDOW / 2));
        // Less than half: the kernel keeps them again.
        for (i, &f) in sentinels.iter().enumerate() {
            cycle(&g, f, i % 3 == 0);
        }
        assert!(g.keeps());
        assert!(g.open(1).0);
    }

    #[test]
    fn a_window_needs_reopens_only() {
        let g = KernelCacheGauge::default();
        // WINDOW files read for the first time decide nothing, however often the kernel asks.
        for i in 0..WINDOW * 4 {
            let (_, watch) = g.open(i * SENTINEL_EVERY);
            let watch = watch.unwrap();
            g.asked(&watch);
            g.asked(&watch);
            g.closed(&watch);
        }
        assert!(g.keeps());
        assert_eq!(g.refills(), 0);
    }
}
