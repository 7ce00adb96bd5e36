//! Epoch-aware prefetch: the staging area and the choice of what to fetch next.
//!
//! The files a job has not read yet in its epoch will all be read before the epoch ends
//! (CoorDL, VLDB 2021). Prefetching from that remaining set wastes no I/O: every
//! staged byte is read by the job this epoch. With a staging area of S files and U uncached
//! files, a random order still turns about S(1 + ln(U/S)) misses per epoch into hits, and
//! the prefetcher reads in on-disk (inode) order with a deep queue, which storage likes.
//! With an order hint (NoPFS) the prefetcher follows the job's order exactly and every
//! uncached file can be staged before the job asks for it.
//!
//! That holds only for a job whose epoch is the whole dataset. A shard job (rank r of K
//! under `DistributedSampler`, a different 1/K of the files every epoch) reads few of the
//! files it has not read, and a prefetcher that guessed for it wasted about half of what it
//! staged (measured: 375 of 730 staged blocks an epoch for a shard of 2). A glance (`head`,
//! `file`) is a job of one file. So without an order hint, [`may_prefetch_remaining`]
//! lets the prefetcher read ahead for a job only once its reads say that it reads the
//! dataset: it read (99% of) every file in one of its epochs, or clearly more than half of
//! the files in this one (no shard of two or more ranks does), and in either case at least
//! [`START_FILES`] files (or 1% of a small dataset) in this epoch. So the first epoch of a
//! job is prefetched from its middle on, and the later ones from their 32nd file. That costs
//! the first epoch of a job that reads the dataset: 1,000 files of 16 KiB, half cached,
//! storage with 2 ms reads, `coorfs read --procs 2`: 1.0 s instead of 0.4 s, while a shard
//! of two prefetched without the rule read 748 files from the source for its 500-file first
//! epoch and 487 for 233 in its third.
//!
//! [`Staging`] holds fetched blocks that the cache did not take (it is full, or it is LRU,
//! which must not evict for a guess), under its own budget (`--prefetch-memory`). Room is
//! reserved when a fetch is issued, so bytes in flight count too. When a job opens a file
//! it claims the file's staged blocks: they leave the staging area for the open file and
//! are freed when it is closed. When a job's epoch ends early (a restart, `drop_last`),
//! what it staged and did not read is still what it will read next epoch if it reads the
//! dataset: those blocks move to the new epoch ([`Staging::retag_before`]). Otherwise, or
//! when the job stops reading, they are dropped and counted as "prefetched but unused".
//!
//! [`next_candidates`] is pure: it walks an order from a cursor and picks what is eligible.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::block::Block;
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
}

/// Blocks fetched ahead of their readers.
#[derive(Debug)]
pub struct Staging {
    capacity: u64,
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
    pub fn put(&self, key: BlockKey, data: Arc<Block>, job: JobKey, epoch: u64) {
        self.inner.lock().insert(key, Staged { data, job, epoch });
    }

    /// True if `key` is staged.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.inner.lock().blocks.contains_key(key)
    }

    /// Takes every staged block of `version` that `job` staged (they leave the staging area)
    /// and returns them by block number; blocks other jobs staged are shared, not taken.
    pub fn claim(&self, version: &FileVersion, blocks: u64, job: JobKey) -> Vec<(u64, Arc<Block>)> {
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
            if mine && let Some(s) = inner.remove(&key) {
                out.push((block, s.data));
            }
        }
        out
    }

    /// Drops `key` if `job` staged it (its reader got the bytes another way).
    pub fn discard(&self, key: &BlockKey, job: JobKey) {
        let mut inner = self.inner.lock();
        if inner.blocks.get(key).is_some_and(|s| s.job == job) {
            inner.remove(key);
        }
    }

    /// The blocks of `job` staged for epochs before `epoch`, tallied by epoch.
    fn stale(inner: &Inner, job: JobKey, epoch: u64) -> (Vec<BlockKey>, HashMap<u64, Dropped>) {
        let mut keys = Vec::new();
        let mut tally: HashMap<u64, Dropped> = HashMap::new();
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
        (keys, tally)
    }

    /// Drops what `job` staged for epochs before `epoch`, and returns it, by epoch.
    pub fn drop_before(&self, job: JobKey, epoch: u64) -> HashMap<u64, Dropped> {
        let mut inner = self.inner.lock();
        if !inner.per_job.contains_key(&job) {
            return HashMap::new();
        }
        let (keys, dropped) = Self::stale(&inner, job, epoch);
        for key in keys {
            inner.remove(&key);
        }
        dropped
    }

    /// Moves what `job` staged for epochs before `epoch` to `epoch`, and returns what moved,
    /// by the epoch it was staged for.
    pub fn retag_before(&self, job: JobKey, epoch: u64) -> HashMap<u64, Dropped> {
        let mut inner = self.inner.lock();
        if !inner.per_job.contains_key(&job) {
            return HashMap::new();
        }
        let (keys, moved) = Self::stale(&inner, job, epoch);
        for key in keys {
            if let Some(s) = inner.blocks.get_mut(&key) {
                s.epoch = epoch;
            }
        }
        moved
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

/// How many prefetch reads may be in flight, learned from how the storage answers.
///
/// Prefetch reads compete with demand reads for the storage. On storage bound by latency
/// (network filesystems: each read waits, and many wait at once for no extra cost) a deep
/// queue and a large staging area are free, and prefetch should use them. On storage bound
/// by bandwidth (a throttled or busy disk) prefetch cannot add bandwidth, and a staging area
/// full of files read ahead made epochs slower (measured on a 200 MiB/s throttle: 6.5 s
/// against 5.7 s without prefetch with 256 MiB staged, 5.9 s with 2 MiB): the reader falls
/// behind while the staging area fills and the storage idles at the end of the epoch.
///
/// The pacer tells the two apart from the reads themselves: reads issued alone give the base
/// latency; reads issued with many others in flight (a quarter of the depth or more) show
/// how latency grows with the queue. A throttled disk lets short bursts through at full
/// speed, so only a deep queue shows the difference. If a read with `n` in flight takes
/// about `n` times the base the storage serves one read after another (bandwidth-bound):
/// prefetch narrows to one read, only while no demand read is in flight, into a small
/// staging area. If it takes about the base (latency-bound) the window is the depth. The
/// verdict is probed again every [`PROBE_EVERY`] reads, so storage that changes is followed.
/// A verdict turns only when the growth passes the other side by a margin (hysteresis:
/// [`SERIAL_ON`], [`SERIAL_OFF`]); the window's changes are logged at DEBUG.
///
/// Pure: the caller reports each read's latency and the reads in flight when it was issued.
#[derive(Clone, Debug)]
pub struct Pacer {
    max: usize,
    /// Latencies of reads issued alone, in seconds.
    alone: std::collections::VecDeque<f64>,
    /// Latency growth per extra read in flight, relative to the base, of deep-queue reads.
    growth: std::collections::VecDeque<f64>,
    /// Some(true): bandwidth-bound; Some(false): latency-bound; None: not known yet.
    verdict: Option<bool>,
    /// Reads since the verdict.
    since: u64,
}

/// Samples a verdict rests on.
const SAMPLES: usize = 16;
/// At least this many of each kind before a verdict, and after a verdict changed before it
/// is judged again.
const MIN_SAMPLES: usize = 4;
/// Growth per extra read above which reads are taken to queue one behind the other: 0 for
/// storage that serves all at once, 1 for storage that serves one at a time.
const SERIAL: f64 = 0.5;
/// Once there is a verdict, the growth must pass these to turn it: hysteresis. With one
/// threshold, storage whose growth hovers near it (a disk that is partly busy, noisy samples)
/// flipped the window between 1 and 16 ten times within milliseconds.
const SERIAL_ON: f64 = 0.7;
const SERIAL_OFF: f64 = 0.3;
/// Reads after which a bandwidth-bound verdict is probed again with a deep queue.
pub const PROBE_EVERY: u64 = 4096;

fn median(v: &std::collections::VecDeque<f64>) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().collect();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

impl Pacer {
    /// A pacer that allows at most `max` reads in flight.
    pub fn new(max: usize) -> Self {
        Pacer {
            max: max.max(1),
            alone: std::collections::VecDeque::with_capacity(SAMPLES),
            growth: std::collections::VecDeque::with_capacity(SAMPLES),
            verdict: None,
            since: 0,
        }
    }

    fn deep(&self) -> usize {
        (self.max / 4).max(2)
    }

    /// Records a read that took `latency` seconds and was issued with `inflight` reads in
    /// flight (itself included).
    pub fn record(&mut self, latency: f64, inflight: usize) {
        if !(latency.is_finite() && latency > 0.0) {
            return;
        }
        self.since += 1;
        if self.verdict == Some(true) && self.since >= PROBE_EVERY {
            // Probe again: open the window until deep-queue samples give a new verdict.
            self.verdict = None;
            self.growth.clear();
        }
        if inflight <= 1 {
            if self.alone.len() == SAMPLES {
                self.alone.pop_front();
            }
            self.alone.push_back(latency);
        } else if inflight >= self.deep() && self.alone.len() >= MIN_SAMPLES {
            let growth = (latency / median(&self.alone) - 1.0) / (inflight - 1) as f64;
            if self.growth.len() == SAMPLES {
                self.growth.pop_front();
            }
            self.growth.push_back(growth);
            if self.growth.len() >= MIN_SAMPLES {
                let growth = median(&self.growth);
                let serial = match self.verdict {
                    None => growth > SERIAL,
                    Some(true) => growth > SERIAL_OFF,
                    Some(false) => growth > SERIAL_ON,
                };
                if self.verdict.is_some() && self.verdict != Some(serial) {
                    // The new verdict is judged again on samples taken under it.
                    self.growth.clear();
                }
                if self.verdict != Some(serial) {
                    self.since = 0;
                }
                self.verdict = Some(serial);
            }
        }
    }

    /// True once the storage was judged bandwidth-bound.
    pub fn bandwidth_bound(&self) -> bool {
        self.verdict == Some(true)
    }

    /// The window: reads in flight, demand and prefetch together.
    pub fn window(&self) -> usize {
        match self.verdict {
            // Probing: one read at a time for the base, then a deep queue.
            None if self.alone.len() < MIN_SAMPLES => 1,
            None | Some(false) => self.max,
            Some(true) => 1,
        }
    }

    /// What the pacer concluded, for the log.
    pub fn describe(&self) -> String {
        let base = if self.alone.is_empty() {
            0.0
        } else {
            median(&self.alone)
        };
        let growth = if self.growth.is_empty() {
            0.0
        } else {
            median(&self.growth)
        };
        let verdict = match self.verdict {
            None => "probing",
            Some(true) => "reads queue one behind another: bandwidth-bound",
            Some(false) => "reads do not slow each other: latency-bound",
        };
        format!(
            "{verdict}; base {:.2} ms, growth {growth:.2} per read in flight",
            base * 1e3
        )
    }

    /// Prefetch reads that may be in flight now, with `demand` demand reads in flight.
    pub fn allowed(&self, demand: usize) -> usize {
        self.window().saturating_sub(demand)
    }
}

/// Distinct files a job must have read in its epoch before the prefetcher reads ahead for
/// it without a hint (or 1% of the dataset, if that is fewer). A glance (`head`, `file`, an
/// image viewer) reads one to a few files, and nothing it leaves unread is worth fetching;
/// any real epoch passes 32 files within moments. It costs nothing measurable, since the
/// remaining-set gain is made at the end of an epoch: 1,000 files of 16 KiB, half cached,
/// storage with 2 ms reads, `coorfs read --procs 2`, epochs 2 and 3 staged 444-455 of their
/// 488 misses whether prefetch started at their 1st, 32nd or 128th file.
pub const START_FILES: usize = 32;

/// True if the prefetcher may fetch from a job's remaining set without an order hint: the job
/// reads the whole dataset ([`crate::jobs::reads_the_dataset`]) and its epoch is under way
/// ([`START_FILES`]).
pub fn may_prefetch_remaining(read: usize, total: usize, covered: bool) -> bool {
    read >= START_FILES.min(total.div_ceil(100)).max(1)
        && crate::jobs::reads_the_dataset(read, total, covered)
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
                ctime_ns: 0,
            },
            block,
        }
    }

    /// The memory a staged block of 100 bytes takes (a page).
    const P: u64 = 4096;

    fn block(fill: u8) -> Arc<Block> {
        let b = Arc::new(Block::copy_of(&[fill; 100]).unwrap());
        assert_eq!(b.footprint(), P);
        b
    }

    #[test]
    fn reservations_bound_the_staging_area() {
        let s = Staging::new(P * 5 / 2);
        assert!(s.reserve(P) && s.reserve(P));
        assert!(!s.reserve(P));
        s.put(key(1, 0), block(0), JobKey::All, 1);
        s.unreserve(P);
        assert!(s.reserve(P));
        assert_eq!(s.bytes(), 2 * P);
    }

    #[test]
    fn claims_take_own_blocks_and_share_others() {
        let s = Staging::new(10 * P);
        let (a, b) = (JobKey::Pgid(1), JobKey::Pgid(2));
        for (k, job) in [(key(1, 0), a), (key(1, 1), a), (key(2, 0), b)] {
            assert!(s.reserve(P));
            s.put(k, block(k.block as u8), job, 1);
        }
        let got = s.claim(&key(1, 0).version, 2, a);
        assert_eq!(got.iter().map(|(b, _)| *b).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(s.bytes(), P);
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
        let s = Staging::new(10 * P);
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
        let s = Staging::new(10 * P);
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

    /// Simulates reads against storage whose latency is `latency(reads in flight)`, with a
    /// reader that has a demand read in flight every other time, and returns the windows the
    /// pacer chose after settling (from read 200 on).
    fn settle(latency: impl Fn(usize) -> f64) -> Vec<usize> {
        let mut p = Pacer::new(16);
        let mut windows = Vec::new();
        for i in 0..2000 {
            let demand = i % 2;
            let inflight = (demand + p.allowed(demand)).max(1);
            p.record(latency(inflight), inflight);
            windows.push(p.window());
        }
        windows.split_off(200)
    }

    #[test]
    fn the_window_opens_on_latency_bound_storage() {
        // 2 ms whatever the queue (network storage).
        let w = settle(|_| 0.002);
        assert!(w.iter().all(|&w| w == 16), "{:?}", &w[..10]);
    }

    #[test]
    fn the_window_narrows_on_bandwidth_bound_storage() {
        // A token bucket: a read alone or with one other passes at full speed; deeper
        // queues wait 0.5 ms per read ahead (a 200 MiB/s disk and 100 KiB files).
        let w = settle(|n| if n <= 2 { 0.0005 } else { 0.0005 * n as f64 });
        assert!(w.iter().all(|&w| w == 1), "{:?}", &w[..10]);
    }

    #[test]
    fn a_bandwidth_bound_verdict_is_probed_again() {
        let mut p = Pacer::new(8);
        for i in 0..100 {
            let n = if i % 2 == 0 { 1 } else { 8 };
            p.record(0.0005 * n as f64, n);
        }
        assert!(p.bandwidth_bound());
        // The storage became a network filesystem: after the probe the window opens.
        for i in 0..(PROBE_EVERY + 100) {
            let n = if i % 2 == 0 { 1 } else { 8 };
            p.record(0.002, n);
        }
        assert!(!p.bandwidth_bound());
        assert_eq!(p.window(), 8);
    }

    #[test]
    fn demand_reads_count_against_the_window() {
        let mut p = Pacer::new(4);
        assert_eq!(p.window(), 1, "a probe until the storage is known");
        for i in 0..100 {
            p.record(0.001, if i % 2 == 0 { 1 } else { 4 });
        }
        assert_eq!(
            (p.window(), p.allowed(0), p.allowed(3), p.allowed(9)),
            (4, 4, 1, 0)
        );
    }

    #[test]
    fn a_window_near_the_threshold_does_not_flap() {
        // Deep-queue reads whose growth is 0.4 or 0.6 at random: the median hovers around
        // the threshold of 0.5. The window settles once and stays.
        let mut p = Pacer::new(16);
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut changes = 0;
        let mut last = p.window();
        for i in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = if i % 2 == 0 { 1 } else { 16 };
            let growth = if x.is_multiple_of(2) { 0.4 } else { 0.6 };
            p.record(0.001 * (1.0 + growth * (n - 1) as f64), n);
            if p.window() != last {
                changes += 1;
                last = p.window();
            }
        }
        // Probing (1), a deep queue once the base is known (16), then one verdict.
        assert!(changes <= 2, "{changes} changes");
    }

    #[test]
    fn prefetch_waits_for_an_epoch_that_reads_the_dataset() {
        let n = 10_000;
        // A glance, and a job well into an epoch that is no more than a shard of two.
        assert!(!may_prefetch_remaining(1, n, false));
        assert!(!may_prefetch_remaining(5000, n, false));
        assert!(!may_prefetch_remaining(5064, n, false));
        assert!(may_prefetch_remaining(5065, n, false));
        // A job that read the dataset in an epoch: from its 32nd file on.
        assert!(!may_prefetch_remaining(31, n, true));
        assert!(may_prefetch_remaining(32, n, true));
        // A small dataset: 1% of it.
        assert!(!may_prefetch_remaining(1, 500, true));
        assert!(may_prefetch_remaining(5, 500, true));
        assert!(may_prefetch_remaining(1, 50, true));
        // Rank 1 of 2 of an odd dataset reads half of it rounded up, a few more at most.
        assert!(!crate::jobs::reads_the_dataset(510, 1001, false));
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
