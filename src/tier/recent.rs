//! Blocks read moments ago that the cache did not keep, so that a re-read of the same file
//! right after costs no second read of the source.
//!
//! A job's re-read of a file it read moments ago is the same access ([`crate::epoch`]): a
//! dataset that checks a file and then decodes it opens it twice, two workers may read one
//! file at about the same time. When the cache keeps the file (MinIO with room, LRU) the
//! second open is a hit; when it does not (MinIO full) the second open used to read the source
//! again, and a double-open job read every uncached byte twice (measured: 415/277/277 MiB for
//! a 277 MiB dataset in three epochs with a cache of half of it).
//!
//! A small FIFO of the last blocks that came from the source, or from the staging area, and
//! are not cached, each with the job that read it. A job's re-read of a file it read moments
//! ago ([`crate::epoch::Step::Repeat`]), or a process's second look at a file it read just
//! before the epoch ended, may take blocks from it, and so may another job's read (jobs that
//! read in one order move in step, a moment apart). A job's own first read of a file in an
//! epoch never does: it comes from the source (or the staging area), so every uncached file
//! is read from the source exactly once an epoch of a job reading alone. Bounded in blocks
//! and bytes, so it holds what a few dozen workers have just read and is no second cache.
//!
//! As a tier it answers reads (never the prefetcher's guesses) and keeps what readers read
//! (from the source, or taken from the staging area).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{DataError, Found, Tier, Want, Why};
use crate::block::Block;
use crate::cache::BlockKey;
use crate::jobs::JobKey;

/// Blocks held: one file in flight for each of 64 readers (a DataLoader's workers, the
/// threads of tf.data) with room to spare.
pub const RECENT_BLOCKS: usize = 64;

/// Memory held at most: 16 MiB, 64 ImageNet-sized files or 16 blocks of a large file.
pub const RECENT_BYTES: u64 = 16 << 20;

#[derive(Debug, Default)]
struct Inner {
    /// Each block with the number of its last put and the job that read it.
    blocks: HashMap<BlockKey, (Arc<Block>, u64, JobKey)>,
    /// Puts, oldest first; a put of a block held already supersedes its earlier one.
    order: VecDeque<(BlockKey, u64)>,
    puts: u64,
    bytes: u64,
}

/// The last blocks read that the cache did not keep.
#[derive(Debug)]
pub struct RecentBlocks {
    enabled: bool,
    inner: Mutex<Inner>,
}

impl RecentBlocks {
    /// An empty buffer; a disabled one holds nothing (`--policy none`, whose baseline is the
    /// kernel's page cache alone).
    pub fn new(enabled: bool) -> Self {
        RecentBlocks {
            enabled,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Keeps `data` as block `key`, pushing out the oldest blocks past the bounds. Returns
    /// false if it cannot keep it (disabled, or larger than the bound).
    /// `job` is the job that read it.
    pub fn put(&self, key: BlockKey, data: &Arc<Block>, job: JobKey) -> bool {
        let size = data.footprint();
        if !self.enabled || size > RECENT_BYTES {
            return false;
        }
        let mut inner = self.inner.lock();
        inner.puts += 1;
        let put = inner.puts;
        if let Some((old, ..)) = inner.blocks.insert(key, (data.clone(), put, job)) {
            inner.bytes -= old.footprint().min(inner.bytes);
        }
        inner.bytes += size;
        inner.order.push_back((key, put));
        while inner.blocks.len() > RECENT_BLOCKS || inner.bytes > RECENT_BYTES {
            let Some((old, when)) = inner.order.pop_front() else {
                break;
            };
            if inner.blocks.get(&old).is_some_and(|b| b.1 == when)
                && let Some((b, ..)) = inner.blocks.remove(&old)
            {
                inner.bytes -= b.footprint().min(inner.bytes);
            }
        }
        // Superseded puts hold nothing: dropped once they are most of the queue (a file read
        // again and again would grow it without bound).
        if inner.order.len() > 4 * RECENT_BLOCKS {
            let Inner { blocks, order, .. } = &mut *inner;
            order.retain(|(k, when)| blocks.get(k).is_some_and(|b| b.1 == *when));
        }
        true
    }

    /// Block `key`, if it was read moments ago, and by another job than `not_by` if given.
    pub fn get(&self, key: &BlockKey, not_by: Option<JobKey>) -> Option<Arc<Block>> {
        if !self.enabled {
            return None;
        }
        let inner = self.inner.lock();
        let (data, _, reader) = inner.blocks.get(key)?;
        (not_by != Some(*reader)).then(|| data.clone())
    }

    /// Forgets block `key`.
    pub fn remove(&self, key: &BlockKey) {
        let mut inner = self.inner.lock();
        if let Some((b, ..)) = inner.blocks.remove(key) {
            inner.bytes -= b.footprint().min(inner.bytes);
        }
    }

    /// Memory held.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }
}

impl Tier for RecentBlocks {
    fn name(&self) -> &'static str {
        "recent"
    }

    fn get(&self, want: &Want<'_>) -> Result<Option<Found<'_>>, DataError> {
        let not_by = match want.why {
            Why::Reread => None,
            // A job's first read of a file in an epoch comes from below, unless another job
            // read it moments ago.
            Why::Read => Some(want.job),
            Why::Prefetch | Why::Claimed | Why::Peer => return Ok(None),
        };
        Ok(self.get(&want.key, not_by).map(Found::Block))
    }

    fn admit(&self, want: &Want<'_>, data: &Arc<Block>) -> bool {
        want.why != Why::Prefetch && self.put(want.key, data, want.job)
    }

    fn remove(&self, want: &Want<'_>) {
        RecentBlocks::remove(self, &want.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ino: u64) -> BlockKey {
        crate::tier::tests::key(ino, 100, 0)
    }

    #[test]
    fn keeps_the_last_blocks_within_its_bounds() {
        let r = RecentBlocks::new(true);
        let small = Arc::new(Block::copy_of(&[1; 100]).unwrap());
        for ino in 0..RECENT_BLOCKS as u64 + 10 {
            r.put(key(ino), &small, JobKey::All);
        }
        assert!(r.get(&key(9), None).is_none(), "the oldest went");
        assert_eq!(&r.get(&key(10), None).unwrap()[..], &[1; 100]);
        assert_eq!(r.bytes(), RECENT_BLOCKS as u64 * 4096);
        // Bytes bound too: large blocks push out many small ones.
        let big = Arc::new(Block::zeroed(4 << 20).unwrap());
        for ino in 1000..1004 {
            r.put(key(ino), &big, JobKey::All);
        }
        assert!(r.bytes() <= RECENT_BYTES);
        assert!(r.get(&key(1003), None).is_some());
        assert!(r.get(&key(RECENT_BLOCKS as u64 + 9), None).is_none());
        // A block put again is as recent as its last put.
        let r = RecentBlocks::new(true);
        r.put(key(0), &small, JobKey::All);
        for ino in 1..RECENT_BLOCKS as u64 {
            r.put(key(ino), &small, JobKey::All);
        }
        r.put(key(0), &small, JobKey::All);
        r.put(key(1000), &small, JobKey::All);
        assert!(r.get(&key(0), None).is_some() && r.get(&key(1), None).is_none());
        assert_eq!(r.bytes(), RECENT_BLOCKS as u64 * 4096);
        for _ in 0..10_000 {
            r.put(key(0), &small, JobKey::All);
        }
        assert!(r.inner.lock().order.len() <= 4 * RECENT_BLOCKS + 1);
        assert_eq!(r.bytes(), RECENT_BLOCKS as u64 * 4096);
        let off = RecentBlocks::new(false);
        off.put(key(1), &small, JobKey::All);
        assert!(off.get(&key(1), None).is_none());
    }

    #[test]
    fn as_a_tier_it_keeps_what_readers_read_and_serves_readers() {
        use crate::tier::tests::want;
        let r = RecentBlocks::new(true);
        let data = Arc::new(Block::copy_of(&[3; 100]).unwrap());
        let (read, reread) = (want(1, 100, 0, Why::Read), want(1, 100, 0, Why::Reread));
        assert!(!r.admit(&want(1, 100, 0, Why::Prefetch), &data));
        assert!(Tier::get(&r, &reread).unwrap().is_none());
        assert!(r.admit(&read, &data));
        assert!(matches!(Tier::get(&r, &reread), Ok(Some(Found::Block(b))) if b[0] == 3));
        assert!(
            Tier::get(&r, &read).unwrap().is_none(),
            "its job's first read"
        );
        // Another job's first read of it moments later (a member of a group in step) needs
        // no second read of the source.
        let other = Want {
            job: JobKey::Pgid(99),
            ..read
        };
        assert!(matches!(Tier::get(&r, &other), Ok(Some(Found::Block(b))) if b[0] == 3));
        let claimed = want(1, 100, 0, Why::Claimed);
        assert!(Tier::get(&r, &claimed).unwrap().is_none());
        Tier::remove(&r, &read);
        assert!(Tier::get(&r, &reread).unwrap().is_none());
        assert_eq!(r.bytes(), 0);
        assert!(!RecentBlocks::new(false).admit(&read, &data), "disabled");
    }
}
