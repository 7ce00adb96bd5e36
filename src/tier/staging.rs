//! The staging area: blocks fetched ahead of their readers, by the prefetcher
//! ([`crate::prefetch`]), that the cache did not take (it is full, or its policy does not take
//! guesses), under a budget of its own (`--prefetch-memory`).
//!
//! Room is reserved when a fetch is issued, so bytes in flight count too. Each block is
//! staged for a job and an epoch. When the job opens the file it claims the file's staged
//! blocks: they leave the staging area together for the open file, which frees them when it
//! is closed; blocks another job staged are shared, not taken. When a job's epoch ends early
//! (a restart, `drop_last`), what it staged and did not read is still what it will read next
//! epoch if it reads the dataset: those blocks move to the new epoch
//! ([`Staging::retag_before`]). Otherwise, or when the job stops reading, they are dropped and
//! counted as "prefetched but unused" ([`Staging::drop_before`]).
//!
//! As a tier ([`Tier`]) it serves a reader of the job that staged a block (the claim, when a
//! prefetch landed after the open), keeps only prefetched blocks, and forgets a block a
//! reader of its job got another way (a read that joined the prefetch in flight).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Found, Tier, TierError, Want, Why};
use crate::block::{Block, BlockSize};
use crate::cache::BlockKey;
use crate::jobs::JobKey;
use crate::namespace::FileVersion;

#[derive(Debug)]
struct Staged {
    data: Arc<Block>,
    job: JobKey,
    epoch: u64,
}

#[derive(Debug, Default)]
struct Inner {
    blocks: HashMap<BlockKey, Staged>,
    /// Bytes staged or reserved for fetches in flight.
    bytes: u64,
    /// Blocks staged, per job.
    per_job: HashMap<JobKey, u64>,
}

impl Inner {
    fn insert(&mut self, key: BlockKey, staged: Staged) {
        *self.per_job.entry(staged.job).or_default() += 1;
        if let Some(old) = self.blocks.insert(key, staged) {
            self.forget(&old);
        }
    }

    fn remove(&mut self, key: &BlockKey) -> Option<Staged> {
        let s = self.blocks.remove(key)?;
        self.forget(&s);
        Some(s)
    }

    /// Takes back the bytes and the job's count of a block that left.
    fn forget(&mut self, s: &Staged) {
        self.bytes -= s.data.footprint().min(self.bytes);
        if let Some(n) = self.per_job.get_mut(&s.job) {
            *n -= 1;
            if *n == 0 {
                self.per_job.remove(&s.job);
            }
        }
    }

    /// See [`Staging::claim`]; `blocks` is the file's block count.
    fn claim(&mut self, version: &FileVersion, blocks: u64, job: JobKey) -> Vec<(u64, Arc<Block>)> {
        let mut out = Vec::new();
        for block in 0..blocks {
            let key = BlockKey {
                version: *version,
                block,
            };
            let mine = match self.blocks.get(&key) {
                Some(s) if s.job == job => true,
                Some(s) => {
                    out.push((block, s.data.clone()));
                    false
                }
                None => false,
            };
            if mine && let Some(s) = self.remove(&key) {
                out.push((block, s.data));
            }
        }
        out
    }
}

/// Blocks fetched ahead of their readers.
#[derive(Debug)]
pub struct Staging {
    capacity: u64,
    blocks: BlockSize,
    inner: Mutex<Inner>,
}

/// What was dropped from the staging area, or moved to another epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    pub blocks: u64,
    /// The memory they took.
    pub bytes: u64,
    /// The bytes read from the source for them.
    pub read: u64,
    /// Files they belong to.
    pub files: u64,
}

impl Staging {
    /// An empty staging area of `capacity` bytes, for files cut into `blocks`.
    pub fn new(capacity: u64, blocks: BlockSize) -> Self {
        Staging {
            capacity,
            blocks,
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
    pub fn put(&self, key: BlockKey, data: Arc<Block>, job: JobKey, epoch: u64) {
        self.inner.lock().insert(key, Staged { data, job, epoch });
    }

    /// True if `key` is staged.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.inner.lock().blocks.contains_key(key)
    }

    /// Takes every staged block of `version` that `job` staged (they leave the staging area)
    /// and returns them by block number; blocks other jobs staged are shared, not taken.
    pub fn claim(&self, version: &FileVersion, job: JobKey) -> Vec<(u64, Arc<Block>)> {
        self.inner
            .lock()
            .claim(version, self.blocks.count(version.size), job)
    }

    /// Drops `key` if `job` staged it (its reader got the bytes another way).
    pub fn discard(&self, key: &BlockKey, job: JobKey) {
        let mut inner = self.inner.lock();
        if inner.blocks.get(key).is_some_and(|s| s.job == job) {
            inner.remove(key);
        }
    }

    /// Applies `each` to every block of `job` staged for an epoch before `epoch`, under the
    /// lock, and returns what they were, tallied by the epoch they were staged for.
    fn each_stale(
        &self,
        job: JobKey,
        epoch: u64,
        mut each: impl FnMut(&mut Inner, BlockKey),
    ) -> HashMap<u64, Dropped> {
        let mut inner = self.inner.lock();
        let mut tally: HashMap<u64, Dropped> = HashMap::new();
        if !inner.per_job.contains_key(&job) {
            return tally;
        }
        let mut keys = Vec::new();
        let mut files = std::collections::HashSet::new();
        for (key, s) in &inner.blocks {
            if s.job == job && s.epoch < epoch {
                keys.push(*key);
                let d = tally.entry(s.epoch).or_default();
                d.blocks += 1;
                d.bytes += s.data.footprint();
                d.read += s.data.len() as u64;
                if files.insert((s.epoch, key.version)) {
                    d.files += 1;
                }
            }
        }
        for key in keys {
            each(&mut inner, key);
        }
        tally
    }

    /// Drops what `job` staged for epochs before `epoch`, and returns it, by epoch.
    pub fn drop_before(&self, job: JobKey, epoch: u64) -> HashMap<u64, Dropped> {
        self.each_stale(job, epoch, |inner, key| {
            inner.remove(&key);
        })
    }

    /// Moves what `job` staged for epochs before `epoch` to `epoch`, and returns what moved,
    /// by the epoch it was staged for.
    pub fn retag_before(&self, job: JobKey, epoch: u64) -> HashMap<u64, Dropped> {
        self.each_stale(job, epoch, |inner, key| {
            if let Some(s) = inner.blocks.get_mut(&key) {
                s.epoch = epoch;
            }
        })
    }

    /// Blocks `job` has staged.
    pub fn held_by(&self, job: JobKey) -> u64 {
        self.inner.lock().per_job.get(&job).copied().unwrap_or(0)
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

impl Tier for Staging {
    fn name(&self) -> &'static str {
        "staging"
    }

    fn get(&self, want: &Want<'_>) -> Result<Option<Found<'_>>, TierError> {
        let mut inner = self.inner.lock();
        if !inner.blocks.contains_key(&want.key) {
            return Ok(None);
        }
        let version = want.key.version;
        let claimed = inner.claim(&version, self.blocks.count(version.size), want.job);
        Ok(Some(Found::File(claimed)))
    }

    fn admit(&self, want: &Want<'_>, data: &Arc<Block>) -> bool {
        if want.why != Why::Prefetch {
            return false;
        }
        self.put(want.key, data.clone(), want.job, want.epoch);
        true
    }

    fn remove(&self, want: &Want<'_>) {
        self.discard(&want.key, want.job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ino: u64, block: u64) -> BlockKey {
        crate::tier::tests::key(ino, 100, block)
    }

    /// Files of 100 bytes are two blocks.
    const BLOCKS: BlockSize = BlockSize::new(std::num::NonZeroU64::new(64).unwrap());

    /// The memory a staged block of 100 bytes takes (a page).
    const P: u64 = 4096;

    fn block(fill: u8) -> Arc<Block> {
        let b = Arc::new(Block::copy_of(&[fill; 100]).unwrap());
        assert_eq!(b.footprint(), P);
        b
    }

    #[test]
    fn reservations_bound_the_staging_area() {
        let s = Staging::new(P * 5 / 2, BLOCKS);
        assert!(s.reserve(P) && s.reserve(P));
        assert!(!s.reserve(P));
        s.put(key(1, 0), block(0), JobKey::All, 1);
        s.unreserve(P);
        assert!(s.reserve(P));
        assert_eq!(s.bytes(), 2 * P);
    }

    #[test]
    fn claims_take_own_blocks_and_share_others() {
        let s = Staging::new(10 * P, BLOCKS);
        let (a, b) = (JobKey::Pgid(1), JobKey::Pgid(2));
        for (k, job) in [(key(1, 0), a), (key(1, 1), a), (key(2, 0), b)] {
            assert!(s.reserve(P));
            s.put(k, block(k.block as u8), job, 1);
        }
        let got = s.claim(&key(1, 0).version, a);
        assert_eq!(got.iter().map(|(b, _)| *b).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(s.bytes(), P);
        let shared = s.claim(&key(2, 0).version, a);
        assert_eq!(shared.len(), 1);
        assert!(s.contains(&key(2, 0)), "job a must not take job b's block");
        s.discard(&key(2, 0), a);
        assert!(s.contains(&key(2, 0)));
        s.discard(&key(2, 0), b);
        assert_eq!((s.blocks(), s.bytes()), (0, 0));
    }

    #[test]
    fn stale_blocks_are_dropped_and_counted_by_epoch() {
        let s = Staging::new(10 * P, BLOCKS);
        let job = JobKey::All;
        for (ino, epoch) in [(1, 1), (2, 1), (3, 2)] {
            assert!(s.reserve(P));
            s.put(key(ino, 0), block(0), job, epoch);
        }
        let dropped = s.drop_before(job, 2);
        assert_eq!(
            dropped.get(&1),
            Some(&Dropped {
                blocks: 2,
                bytes: 2 * P,
                read: 200,
                files: 2,
            })
        );
        assert_eq!(dropped.get(&2), None);
        assert_eq!((s.blocks(), s.bytes(), s.held_by(job)), (1, P, 1));
        assert_eq!(s.held_by(JobKey::Pgid(9)), 0);
    }

    #[test]
    fn blocks_of_an_ended_epoch_can_move_to_the_next() {
        let s = Staging::new(10 * P, BLOCKS);
        let (a, b) = (JobKey::Pgid(1), JobKey::Pgid(2));
        for (ino, job, epoch) in [(1, a, 1), (2, a, 2), (3, b, 1)] {
            assert!(s.reserve(P));
            s.put(key(ino, 0), block(0), job, epoch);
        }
        let moved = s.retag_before(a, 3);
        assert_eq!(moved.len(), 2);
        assert_eq!(moved[&1].files, 1);
        assert!(
            s.drop_before(a, 3).is_empty(),
            "all of a's blocks are epoch 3's now"
        );
        assert_eq!(
            s.drop_before(a, 4).values().map(|d| d.blocks).sum::<u64>(),
            2
        );
        assert_eq!((s.held_by(a), s.held_by(b), s.bytes()), (0, 1, P));
    }

    #[test]
    fn as_a_tier_it_hands_a_reader_of_its_job_the_whole_file() {
        use crate::tier::tests::want;
        let s = Staging::new(10 * P, BLOCKS);
        let w = want(1, 100, 1, Why::Read);
        assert!(s.reserve(P) && s.reserve(P));
        assert!(!s.admit(&w, &block(1)), "only prefetched blocks are staged");
        assert!(s.admit(&w.block(0).because(Why::Prefetch), &block(0)));
        assert!(s.admit(&w.because(Why::Prefetch), &block(1)));
        match Tier::get(&s, &w) {
            Ok(Some(Found::File(blocks))) => {
                let got: Vec<(u64, u8)> = blocks.iter().map(|(b, d)| (*b, d[0])).collect();
                assert_eq!(got, vec![(0, 0), (1, 1)]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!((s.blocks(), s.bytes()), (0, 0), "taken together");
        assert!(Tier::get(&s, &w).unwrap().is_none());
        assert!(s.reserve(P));
        assert!(s.admit(&w.because(Why::Prefetch), &block(1)));
        Tier::remove(&s, &w);
        assert_eq!(s.blocks(), 0, "its reader got it another way");
    }
}
