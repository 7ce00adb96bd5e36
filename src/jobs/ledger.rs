//! The books: every access, byte, stall and prefetch counted in one place.
//!
//! Each event counts three times: in the mount's counters ([`Counters`]), in the dataset-wide
//! epoch it happened in, and in the epoch of the job it happened for ([`Job`]'s log). The open
//! that reads decides which epochs those are, and its reads count there even if an epoch ends
//! meanwhile ([`Attribution`]). Bytes the prefetcher reads count in the epoch of the job it
//! reads for that will read them ([`Job::staging_epoch`]), and move with the staged blocks
//! when an epoch ends early.
//!
//! Locks: a job's lock and the dataset's epoch log are never held together here, so callers
//! may hold a job's lock around [`Ledger::open_in_job`] (the open does, from taking the file's
//! staged blocks to counting the access).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;

use super::Job;
use crate::epoch::Step;
use crate::namespace::FileId;
use crate::stats::{Counters, EpochRecord, Stats};

/// An open of a file, as the books see it.
#[derive(Clone, Copy, Debug)]
pub struct Opening {
    /// The file's dense id (None for a file the scan has not seen).
    pub file: Option<FileId>,
    pub pid: u32,
    /// Every byte of the file was cached.
    pub hit: bool,
    /// Every block of the file was staged by the prefetcher.
    pub staged: bool,
    /// ... and fetched for another job.
    pub shared: bool,
    pub size: u64,
    /// The dataset's file count, once the scan is complete.
    pub total: Option<usize>,
    /// Seconds since the mount.
    pub now: f64,
}

/// The epochs an open's reads count in: the dataset's and its job's, at the open.
#[derive(Clone, Debug)]
pub struct Attribution {
    pub epoch: u64,
    pub job: Arc<Mutex<Job>>,
    pub job_epoch: u64,
}

/// Rounds whose files read from the source are told apart: a job may lag the others by
/// this many epochs less one. A read for an older round counts as a new pair.
const ROUNDS_KEPT: usize = 4;

/// The (file, round) pairs read from the source: a bit per file for each recent round.
#[derive(Debug, Default)]
struct FileRounds {
    rounds: std::collections::BTreeMap<u64, Vec<u64>>,
    pairs: u64,
}

impl FileRounds {
    fn read(&mut self, file: FileId, round: u64) {
        if self
            .rounds
            .first_key_value()
            .is_some_and(|(&oldest, _)| round < oldest)
            && self.rounds.len() >= ROUNDS_KEPT
        {
            self.pairs += 1;
            return;
        }
        let bits = self.rounds.entry(round).or_default();
        let (word, bit) = (file as usize / 64, 1u64 << (file % 64));
        if bits.len() <= word {
            bits.resize(word + 1, 0);
        }
        if bits[word] & bit == 0 {
            bits[word] |= bit;
            self.pairs += 1;
        }
        while self.rounds.len() > ROUNDS_KEPT {
            self.rounds.pop_first();
        }
    }
}

/// The books of one mount.
#[derive(Debug, Default)]
pub struct Ledger {
    stats: Arc<Stats>,
    from_source: Mutex<FileRounds>,
    /// Processes with reads waiting for data now: how many, and since when (seconds since
    /// the mount). An entry lives only while its process waits.
    waiting: Mutex<std::collections::HashMap<u32, (u32, f64)>>,
}

impl Ledger {
    /// Books kept in `stats`.
    pub fn new(stats: Arc<Stats>) -> Self {
        Ledger {
            stats,
            from_source: Mutex::default(),
            waiting: Mutex::default(),
        }
    }

    /// The counters and the dataset's epochs, for the views and the tiers that count.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Seconds since the mount.
    pub fn now(&self) -> f64 {
        self.stats.now()
    }

    /// The dataset-wide epoch now.
    pub fn epoch(&self) -> u64 {
        self.stats.epochs.lock().tracker().epoch()
    }

    /// Counts an open in its job `j` (whose lock the caller holds): returns the job's epoch
    /// the access belongs to and what the access did to the job's epochs (None for a file
    /// the scan has not seen).
    pub fn open_in_job(&self, j: &mut Job, o: &Opening) -> (u64, Option<Step>) {
        let Some(file) = o.file else {
            return (j.epoch(), None);
        };
        j.last_access = o.now;
        let (epoch, step) = j.log.open(file, o.pid, o.hit, o.size, o.total, o.now);
        if o.staged {
            j.log.update(epoch, |r| {
                r.staging_hits += 1;
                r.shared_hits += u64::from(o.shared);
            });
        }
        (epoch, Some(step))
    }

    /// Counts an open in the mount's counters and the dataset's epochs; returns the dataset's
    /// epoch it belongs to.
    pub fn open_in_dataset(&self, o: &Opening) -> u64 {
        let counters = &self.stats.counters;
        Counters::add(&counters.bytes_read, o.size);
        if o.hit {
            Counters::add(&counters.bytes_from_cache, o.size);
        }
        if o.staged {
            Counters::add(&counters.staging_hits, 1);
        }
        if o.shared {
            Counters::add(&counters.shared_hits, 1);
        }
        let mut log = self.stats.epochs.lock();
        count_access(counters, o.hit);
        let epoch = match o.file {
            Some(file) => log.open(file, o.pid, o.hit, o.size, o.total, o.now).0,
            None => log.tracker().epoch(),
        };
        if o.staged {
            log.update(epoch, |r| {
                r.staging_hits += 1;
                r.shared_hits += u64::from(o.shared);
            });
        }
        epoch
    }

    /// `n` bytes served from the cache to an open that did not count them when it opened.
    pub fn served_from_cache(&self, a: &Attribution, n: u64) {
        Counters::add(&self.stats.counters.bytes_from_cache, n);
        self.update(a, |r| r.bytes_from_cache += n);
    }

    /// An open, which counted its whole file as read, read all but `unread` bytes of it (a
    /// reader that reads a part, as random access into one big file does): they are taken
    /// back from the bytes read, and from the cache's if the open is still a hit.
    pub fn read_in_part(&self, a: &Attribution, unread: u64, hit: bool) {
        let c = &self.stats.counters;
        let take_back = |r: &mut EpochRecord| {
            r.bytes_read = r.bytes_read.saturating_sub(unread);
            if hit {
                r.bytes_from_cache = r.bytes_from_cache.saturating_sub(unread);
            }
        };
        // With the epoch's record, so that no snapshot shows the mount's bytes taken back and
        // the epoch's not yet.
        self.update_and(a, take_back, || {
            c.bytes_read.fetch_sub(unread, Ordering::Relaxed);
            if hit {
                c.bytes_from_cache.fetch_sub(unread, Ordering::Relaxed);
            }
        });
    }

    /// An open counted as a hit of a file of `size` bytes needs the source after all (LRU
    /// evicted part of the file since): it becomes a miss, so that hits never include reads
    /// of the source.
    pub fn hit_became_miss(&self, a: &Attribution, size: u64) {
        let c = &self.stats.counters;
        {
            // Under the epochs lock, as they are counted (see `count_access`).
            let _log = self.stats.epochs.lock();
            c.hits.fetch_sub(1, Ordering::Relaxed);
            Counters::add(&c.misses, 1);
        }
        c.bytes_from_cache.fetch_sub(size, Ordering::Relaxed);
        self.update(a, |r| r.hit_became_miss(size));
    }

    /// `n` bytes a fetch for an open read from the source (the source tier counted them for
    /// the mount).
    pub fn fetched_for(&self, a: &Attribution, n: u64) {
        self.update(a, |r| {
            r.bytes_from_source += n;
            r.source_reads += 1;
        });
    }

    /// A block of `n` bytes a fetch for an open read from another member of the cluster.
    pub fn fetched_from_peer(&self, a: &Attribution, n: u64) {
        self.update(a, |r| {
            r.bytes_from_peers += n;
            r.peer_hits += 1;
        });
    }

    /// A fetch for an open read the source because the member that owns the file did not
    /// serve it.
    pub fn peer_fell_back(&self, a: &Attribution) {
        self.update(a, |r| r.peer_fallbacks += 1);
    }

    /// The first block of `file` was read from the source for a job's epoch `round` (for a
    /// reader, or ahead of one).
    pub fn file_from_source(&self, file: Option<FileId>, round: u64) {
        Counters::add(&self.stats.counters.source_file_reads, 1);
        if let Some(file) = file {
            self.from_source.lock().read(file, round);
        }
    }

    /// Distinct (file, round) pairs read from the source: what one read per file and round
    /// would have cost.
    pub fn file_rounds_from_source(&self) -> u64 {
        self.from_source.lock().pairs
    }

    /// `n` bytes read straight from an open's descriptor (its file changed while open).
    pub fn read_directly(&self, a: &Attribution, n: u64) {
        Counters::add(&self.stats.counters.bytes_from_source, n);
        self.update(a, |r| r.bytes_from_source += n);
    }

    /// A read of process `pid` begins to wait for a fetch.
    pub fn wait_begins(&self, pid: u32) {
        self.wait_begins_at(pid, self.now());
    }

    fn wait_begins_at(&self, pid: u32, now: f64) {
        let mut waiting = self.waiting.lock();
        let (reads, since) = waiting.entry(pid).or_insert((0, now));
        if *reads == 0 {
            *since = now;
        }
        *reads += 1;
    }

    /// A read of process `pid`, of an open attributed to `a`, waited `waited` for a fetch
    /// (begun with [`Ledger::wait_begins`]): the fetch stall. When it was the process's last
    /// read waiting, the time since its first began counts as the process's data wait.
    pub fn stalled(&self, a: &Attribution, pid: u32, waited: Duration) {
        self.stalled_at(a, pid, waited, self.now());
    }

    fn stalled_at(&self, a: &Attribution, pid: u32, waited: Duration, now: f64) {
        Counters::add(
            &self.stats.counters.fetch_stall_us,
            waited.as_micros() as u64,
        );
        let span = {
            let mut waiting = self.waiting.lock();
            match waiting.get_mut(&pid) {
                Some((reads, since)) if *reads <= 1 => {
                    let span = (now - *since).max(0.0);
                    waiting.remove(&pid);
                    span
                }
                Some((reads, _)) => {
                    *reads -= 1;
                    0.0
                }
                None => 0.0,
            }
        };
        Counters::add(&self.stats.counters.data_wait_us, (span * 1e6) as u64);
        let secs = waited.as_secs_f64();
        self.update(a, |r| {
            r.fetch_stall_seconds += secs;
            r.data_wait_seconds += span;
        });
    }

    /// The prefetcher issued a fetch of a block.
    pub fn prefetch_issued(&self) {
        Counters::add(&self.stats.counters.prefetched_blocks, 1);
    }

    /// A prefetch for `job`'s epoch `epoch` of file `f` read `n` bytes: they count in the
    /// dataset's epoch now and in the job's epoch that will read them, in a dataset of
    /// `total` files.
    pub fn prefetched(&self, job: &Mutex<Job>, epoch: u64, f: FileId, total: usize, n: u64) {
        self.prefetch_update(job, epoch, f, total, |r| {
            r.bytes_from_source += n;
            r.source_reads += 1;
        });
    }

    /// The prefetcher fetched a block of `n` bytes of file `f` for `job`'s epoch `epoch`
    /// from another member of the cluster (`peer`), or read the source since that member
    /// did not serve it (`!peer`).
    pub fn prefetched_via_peer(
        &self,
        job: &Mutex<Job>,
        epoch: u64,
        f: FileId,
        total: usize,
        n: u64,
        peer: bool,
    ) {
        self.prefetch_update(job, epoch, f, total, |r| {
            if peer {
                r.bytes_from_peers += n;
                r.peer_hits += 1;
            } else {
                r.peer_fallbacks += 1;
            }
        });
    }

    /// Applies `change` to the mount's current epoch and to the epoch of `job` that a
    /// prefetch of file `f` for its epoch `epoch` is for.
    fn prefetch_update(
        &self,
        job: &Mutex<Job>,
        epoch: u64,
        f: FileId,
        total: usize,
        change: impl Fn(&mut EpochRecord),
    ) {
        let change = |r: &mut EpochRecord| {
            change(r);
            r.count_bytes();
        };
        let mut log = self.stats.epochs.lock();
        let current = log.tracker().epoch();
        log.update(current, change);
        drop(log);
        let mut j = job.lock();
        let target = j.staging_epoch(epoch, f, total);
        j.log.update(target, change);
    }

    /// The prefetcher fetched blocks of a file for `job`'s epoch `epoch`.
    pub fn prefetched_file(&self, job: &Mutex<Job>, epoch: u64) {
        job.lock().log.update(epoch, |r| r.prefetched_files += 1);
    }

    /// `blocks` blocks staged for job `j`'s epoch `epoch` were dropped unread.
    pub fn staging_unused(&self, j: &mut Job, epoch: u64, blocks: u64) {
        Counters::add(&self.stats.counters.prefetched_unused, blocks);
        j.log.update(epoch, |r| r.prefetched_unused += blocks);
    }

    /// Blocks of `files` files staged for job `j`'s epoch `from`, read with `read` bytes,
    /// now wait for its epoch `to`: the bytes and files move with them.
    pub fn staging_moved(&self, j: &mut Job, from: u64, to: u64, read: u64, files: u64) {
        j.log.update(from, |r| {
            r.bytes_from_source -= read.min(r.bytes_from_source);
            r.prefetched_files -= files.min(r.prefetched_files);
            r.count_bytes();
        });
        j.log.update(to, |r| {
            r.bytes_from_source += read;
            r.prefetched_files += files;
            r.count_bytes();
        });
    }

    /// An order hint was accepted or rejected.
    pub fn hint(&self, accepted: bool) {
        let c = &self.stats.counters;
        Counters::add(
            if accepted {
                &c.hints_accepted
            } else {
                &c.hints_rejected
            },
            1,
        );
    }

    /// Applies `change` to the records of the dataset epoch and the job epoch of an open.
    fn update(&self, a: &Attribution, change: impl Fn(&mut EpochRecord)) {
        self.update_and(a, change, || {});
    }

    /// [`Ledger::update`], running `also` (a change of the mount's counters) under the epochs
    /// lock with the dataset epoch's change: a snapshot, which holds that lock, sees both or
    /// neither.
    fn update_and(&self, a: &Attribution, change: impl Fn(&mut EpochRecord), also: impl FnOnce()) {
        let change = |r: &mut EpochRecord| {
            change(r);
            r.count_bytes();
        };
        {
            let mut log = self.stats.epochs.lock();
            also();
            log.update(a.epoch, change);
        }
        a.job.lock().log.update(a.job_epoch, change);
    }
}

/// Counts an access in `reads`, and in `hits` or `misses`. The caller holds the epochs lock
/// (`Stats::epochs`), which a snapshot holds while it reads the three (`fs/views.rs`), so that
/// `hits + misses = reads` in every snapshot: read one by one while an open counted them one
/// by one, 2 of 3,687 snapshots under load did not add up.
fn count_access(c: &Counters, hit: bool) {
    Counters::add(&c.reads, 1);
    Counters::add(if hit { &c.hits } else { &c.misses }, 1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{JobConfig, Jobs};

    fn opening(file: FileId, hit: bool, staged: bool) -> Opening {
        Opening {
            file: Some(file),
            pid: 7,
            hit,
            staged,
            shared: false,
            size: 100,
            total: Some(4),
            now: 1.0,
        }
    }

    /// Opens `(file, hit, staged)` each in turn, all the first of epoch 1, in the job and the
    /// dataset; their attributions.
    fn open_all(
        ledger: &Ledger,
        job: &Arc<Mutex<Job>>,
        opens: &[(FileId, bool, bool)],
    ) -> Vec<Attribution> {
        let mut att = Vec::new();
        for &(file, hit, staged) in opens {
            let o = opening(file, hit, staged);
            let (job_epoch, step) = ledger.open_in_job(&mut job.lock(), &o);
            assert_eq!((job_epoch, step), (1, Some(Step::First)));
            let epoch = ledger.open_in_dataset(&o);
            att.push(Attribution {
                epoch,
                job: job.clone(),
                job_epoch,
            });
        }
        att
    }

    fn record(job: &Mutex<Job>, epoch: u64) -> EpochRecord {
        let j = job.lock();
        j.log
            .records()
            .iter()
            .find(|r| r.epoch == epoch)
            .unwrap()
            .clone()
    }

    #[test]
    fn an_open_and_its_reads_count_in_the_mount_the_dataset_and_the_job() {
        let ledger = Ledger::default();
        let job = Jobs::new(JobConfig::default()).get(7, 0, 0.0);
        let att = open_all(
            &ledger,
            &job,
            &[(0, true, false), (1, false, true), (2, false, false)],
        );
        ledger.served_from_cache(&att[1], 40);
        ledger.fetched_for(&att[2], 100);
        ledger.read_directly(&att[2], 5);
        ledger.wait_begins(7);
        ledger.stalled(&att[2], 7, Duration::from_millis(3));
        ledger.hit_became_miss(&att[0], 100);
        let c = &ledger.stats().counters;
        let got = [
            Counters::get(&c.reads),
            Counters::get(&c.hits),
            Counters::get(&c.misses),
            Counters::get(&c.staging_hits),
            Counters::get(&c.bytes_from_cache),
            Counters::get(&c.bytes_from_source),
            Counters::get(&c.fetch_stall_us),
        ];
        assert_eq!(got, [3, 0, 3, 1, 40, 5, 3000]);
        let r = record(&job, 1);
        assert_eq!((r.reads, r.hits, r.misses, r.staging_hits), (3, 0, 3, 1));
        assert_eq!((r.bytes_from_cache, r.bytes_from_source), (40, 105));
        let d = ledger.stats().epochs.lock().records()[0].clone();
        assert_eq!((d.reads, d.misses, d.bytes_from_source), (3, 3, 105));
    }

    #[test]
    fn an_open_that_read_part_of_its_file_takes_back_the_rest_from_bytes_read() {
        let ledger = Ledger::default();
        let job = Jobs::new(JobConfig::default()).get(7, 0, 0.0);
        // A hit and a miss of 100 bytes each, counted whole at their opens.
        let att = open_all(&ledger, &job, &[(0, true, false), (1, false, false)]);
        ledger.fetched_for(&att[1], 100);
        ledger
            .stats()
            .counters
            .bytes_from_source
            .fetch_add(100, Ordering::Relaxed);
        // The hit's reader read 30 bytes, the miss's 25.
        ledger.read_in_part(&att[0], 70, true);
        ledger.read_in_part(&att[1], 75, false);
        let c = &ledger.stats().counters;
        let got = [
            Counters::get(&c.bytes_read),
            Counters::get(&c.bytes_from_cache),
        ];
        assert_eq!(got, [55, 30]);
        for r in [
            record(&job, 1),
            ledger.stats().epochs.lock().records()[0].clone(),
        ] {
            assert_eq!(
                (r.bytes_read, r.bytes_from_cache, r.bytes_from_source),
                (55, 30, 100)
            );
            // More from the source than was read: no byte was a hit's, as far as bytes go.
            assert_eq!(r.byte_hit_rate, 0.0);
        }
    }

    #[test]
    fn staged_bytes_move_with_their_blocks_and_unused_ones_are_counted() {
        let ledger = Ledger::default();
        let job = Jobs::new(JobConfig::default()).get(7, 0, 0.0);
        // Epoch 1 reads both files of a dataset of two; epoch 2 begins.
        for file in [0, 1] {
            let o = Opening {
                total: Some(2),
                ..opening(file, false, false)
            };
            ledger.open_in_job(&mut job.lock(), &o);
        }
        assert_eq!(job.lock().epoch(), 2);
        ledger.prefetched(&job, 1, 1, 2, 100);
        ledger.prefetched_file(&job, 1);
        ledger.staging_moved(&mut job.lock(), 1, 2, 60, 1);
        let (r1, r2) = (record(&job, 1), record(&job, 2));
        // Prefetched for epoch 1, which read the file after all: its bytes counted there.
        assert_eq!((r1.bytes_from_source, r1.prefetched_files), (40, 0));
        assert_eq!((r2.bytes_from_source, r2.prefetched_files), (60, 1));
        ledger.staging_unused(&mut job.lock(), 2, 3);
        assert_eq!(record(&job, 2).prefetched_unused, 3);
        let c = &ledger.stats().counters;
        assert_eq!(Counters::get(&c.prefetched_unused), 3);
        ledger.prefetch_issued();
        ledger.hint(true);
        ledger.hint(false);
        ledger.hint(false);
        let got = [
            Counters::get(&c.prefetched_blocks),
            Counters::get(&c.hints_accepted),
            Counters::get(&c.hints_rejected),
        ];
        assert_eq!(got, [1, 1, 2]);
    }

    #[test]
    fn a_process_waits_once_however_many_of_its_reads_wait_at_once() {
        let ledger = Ledger::new(Arc::new(Stats::default()));
        let job = Jobs::new(JobConfig::default()).get(7, 0, 0.0);
        let o = opening(0, false, false);
        let (job_epoch, _) = ledger.open_in_job(&mut job.lock(), &o);
        let a = Attribution {
            epoch: ledger.open_in_dataset(&o),
            job: job.clone(),
            job_epoch,
        };
        let ms = Duration::from_millis;
        // Process 7: two reads, waiting over 10.0-10.3 and 10.1-10.5; process 8: 10.2-10.4.
        ledger.wait_begins_at(7, 10.0);
        ledger.wait_begins_at(7, 10.1);
        ledger.wait_begins_at(8, 10.2);
        ledger.stalled_at(&a, 7, ms(300), 10.3);
        ledger.stalled_at(&a, 8, ms(200), 10.4);
        ledger.stalled_at(&a, 7, ms(400), 10.5);
        // A wait that never began (a read of an open before a restart of the books) adds none.
        ledger.stalled_at(&a, 9, ms(100), 10.6);
        let r = record(&job, 1);
        assert!((r.fetch_stall_seconds - 1.0).abs() < 1e-9, "{r:?}");
        // 0.5 s for process 7, 0.2 s for process 8.
        assert!((r.data_wait_seconds - 0.7).abs() < 1e-9, "{r:?}");
        let c = &ledger.stats().counters;
        assert_eq!(Counters::get(&c.data_wait_us), 700_000);
        assert!(ledger.waiting.lock().is_empty());
        assert_eq!(r.readers, 1, "one process opened a file");
    }
}
