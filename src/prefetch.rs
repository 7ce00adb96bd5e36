//! Epoch-aware prefetch: the staging area and the choice of what to fetch next.
//!
//! The files a job has not read yet in its epoch will all be read before the epoch ends
//! (CoorDL; ../shared/DESIGN.md). Prefetching from that remaining set wastes no I/O: every
//! staged byte is read by the job this epoch. With a staging area of S files and U uncached
//! files, a random order still turns about S(1 + ln(U/S)) misses per epoch into hits, and
//! the prefetcher reads in on-disk (inode) order with a deep queue, which storage likes.
//! With an order hint (NoPFS) the prefetcher follows the job's order exactly and every
//! uncached file can be staged before the job asks for it.
//!
//! [`Staging`] holds fetched blocks that the cache did not take (it is full, or it is LRU,
//! which must not evict for a guess), under its own budget (`--prefetch-memory`). Room is
//! reserved when a fetch is issued, so bytes in flight count too. When a job opens a file
//! it claims the file's staged blocks: they leave the staging area for the open file and
//! are freed when it is closed. When a job's epoch ends, what it staged and never claimed
//! is dropped and counted as "prefetched but unused".
//!
//! [`next_candidates`] is pure: it walks an order from a cursor and picks what is eligible.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::cache::BlockKey;
use crate::jobs::JobKey;
use crate::namespace::{FileId, FileVersion};

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

#[derive(Debug)]
struct Staged {
    data: Arc<Vec<u8>>,
    job: JobKey,
    epoch: u64,
}

#[derive(Debug, Default)]
struct Inner {
    blocks: HashMap<BlockKey, Staged>,
    /// Bytes staged or reserved for fetches in flight.
    bytes: u64,
}

/// Blocks fetched ahead of their readers.
#[derive(Debug)]
pub struct Staging {
    capacity: u64,
    inner: Mutex<Inner>,
}

/// What was dropped from the staging area.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    pub blocks: u64,
    pub bytes: u64,
}

impl Staging {
    /// An empty staging area of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Staging {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Reserves `len` bytes for a fetch, if there is room.
    pub fn reserve(&self, len: u64) -> bool {
        let mut inner = self.inner.lock();
        if inner.bytes + len > self.capacity {
            return false;
        }
        inner.bytes += len;
        true
    }

    /// Gives back a reservation that will not be used.
    pub fn unreserve(&self, len: u64) {
        let mut inner = self.inner.lock();
        inner.bytes -= len.min(inner.bytes);
    }

    /// Stores a fetched block under its reservation, for `job`'s epoch `epoch`.
    pub fn put(&self, key: BlockKey, data: Arc<Vec<u8>>, job: JobKey, epoch: u64) {
        let mut inner = self.inner.lock();
        if let Some(old) = inner.blocks.insert(key, Staged { data, job, epoch }) {
            inner.bytes -= (old.data.len() as u64).min(inner.bytes);
        }
    }

    /// True if `key` is staged.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.inner.lock().blocks.contains_key(key)
    }

    /// Takes every staged block of `version` that `job` staged (they leave the staging area)
    /// and returns them by block number; blocks other jobs staged are shared, not taken.
    pub fn claim(
        &self,
        version: &FileVersion,
        blocks: u64,
        job: JobKey,
    ) -> Vec<(u64, Arc<Vec<u8>>)> {
        let mut inner = self.inner.lock();
        let mut out = Vec::new();
        for block in 0..blocks {
            let key = BlockKey {
                version: *version,
                block,
            };
            let mine = match inner.blocks.get(&key) {
                Some(s) if s.job == job => true,
                Some(s) => {
                    out.push((block, s.data.clone()));
                    false
                }
                None => false,
            };
            if mine && let Some(s) = inner.blocks.remove(&key) {
                inner.bytes -= (s.data.len() as u64).min(inner.bytes);
                out.push((block, s.data));
            }
        }
        out
    }

    /// Drops `key` if `job` staged it (its reader got the bytes another way).
    pub fn discard(&self, key: &BlockKey, job: JobKey) {
        let mut inner = self.inner.lock();
        if inner.blocks.get(key).is_some_and(|s| s.job == job)
            && let Some(s) = inner.blocks.remove(key)
        {
            inner.bytes -= (s.data.len() as u64).min(inner.bytes);
        }
    }

    /// Drops what `job` staged for epochs before `epoch`, and returns it, by epoch.
    pub fn drop_before(&self, job: JobKey, epoch: u64) -> HashMap<u64, Dropped> {
        let mut inner = self.inner.lock();
        let mut dropped: HashMap<u64, Dropped> = HashMap::new();
        let mut freed = 0;
        inner.blocks.retain(|_, s| {
            let stale = s.job == job && s.epoch < epoch;
            if stale {
                let d = dropped.entry(s.epoch).or_default();
                d.blocks += 1;
                d.bytes += s.data.len() as u64;
                freed += s.data.len() as u64;
            }
            !stale
        });
        inner.bytes -= freed.min(inner.bytes);
        dropped
    }

    /// Bytes staged or reserved.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    /// Blocks staged.
    pub fn blocks(&self) -> u64 {
        self.inner.lock().blocks.len() as u64
    }

    /// The budget in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

/// Walks `order` from `cursor` and returns up to `want` files for which `eligible` holds,
/// with their positions, and the cursor to resume from: past every file looked at, since a
/// file that is not eligible now (read, cached, staged, in flight) will not become so in
/// this epoch. A caller that cannot take a picked file resumes from its position instead.
pub fn next_candidates(
    order: &[FileId],
    cursor: usize,
    want: usize,
    mut eligible: impl FnMut(FileId) -> bool,
) -> (Vec<(usize, FileId)>, usize) {
    let mut picked = Vec::new();
    let mut at = cursor;
    while at < order.len() && picked.len() < want {
        if eligible(order[at]) {
            picked.push((at, order[at]));
        }
        at += 1;
    }
    (picked, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ino: u64, block: u64) -> BlockKey {
        BlockKey {
            version: FileVersion {
                dev: 1,
                ino,
                size: 100,
                mtime_ns: 0,
            },
            block,
        }
    }

    #[test]
    fn reservations_bound_the_staging_area() {
        let s = Staging::new(250);
        assert!(s.reserve(100) && s.reserve(100));
        assert!(!s.reserve(100));
        s.put(key(1, 0), Arc::new(vec![0; 100]), JobKey::All, 1);
        s.unreserve(100);
        assert!(s.reserve(100));
        assert_eq!(s.bytes(), 200);
    }

    #[test]
    fn claims_take_own_blocks_and_share_others() {
        let s = Staging::new(1000);
        let (a, b) = (JobKey::Pgid(1), JobKey::Pgid(2));
        for (k, job) in [(key(1, 0), a), (key(1, 1), a), (key(2, 0), b)] {
            assert!(s.reserve(100));
            s.put(k, Arc::new(vec![k.block as u8; 100]), job, 1);
        }
        let got = s.claim(&key(1, 0).version, 2, a);
        assert_eq!(got.iter().map(|(b, _)| *b).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(s.bytes(), 100);
        let shared = s.claim(&key(2, 0).version, 1, a);
        assert_eq!(shared.len(), 1);
        assert!(s.contains(&key(2, 0)), "job a must not take job b's block");
        s.discard(&key(2, 0), a);
        assert!(s.contains(&key(2, 0)));
        s.discard(&key(2, 0), b);
        assert_eq!((s.blocks(), s.bytes()), (0, 0));
    }

    #[test]
    fn stale_blocks_are_dropped_and_counted_by_epoch() {
        let s = Staging::new(1000);
        let job = JobKey::All;
        for (ino, epoch) in [(1, 1), (2, 1), (3, 2)] {
            assert!(s.reserve(100));
            s.put(key(ino, 0), Arc::new(vec![0; 100]), job, epoch);
        }
        let dropped = s.drop_before(job, 2);
        assert_eq!(
            dropped.get(&1),
            Some(&Dropped {
                blocks: 2,
                bytes: 200
            })
        );
        assert_eq!(dropped.get(&2), None);
        assert_eq!((s.blocks(), s.bytes()), (1, 100));
    }

    #[test]
    fn candidates_follow_the_order_and_skip_the_ineligible() {
        let order = [5, 3, 8, 1, 9, 2];
        let (picked, cursor) = next_candidates(&order, 0, 2, |f| f != 3);
        assert_eq!((picked, cursor), (vec![(0, 5), (2, 8)], 3));
        let (picked, cursor) = next_candidates(&order, cursor, 10, |f| f > 1);
        assert_eq!((picked, cursor), (vec![(4, 9), (5, 2)], 6));
        assert_eq!(next_candidates(&order, 6, 3, |_| true), (vec![], 6));
    }
}
