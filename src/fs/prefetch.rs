//! The prefetcher's loop: for every job that is reading, fetch what it will read next.
//!
//! One thread wakes when something changed (an open, a fetch that ended, the scan that
//! completed) or every 50 ms, and for each job active in the last few seconds issues fetches
//! until `--prefetch-depth` are in flight or the staging area is full. What to fetch comes
//! from the job's order hint if it gave one for this epoch, else from the dataset in inode
//! order (on-disk order on ext4/XFS), skipping what the job has read (or may have read) this
//! epoch, what is cached, staged or already being fetched
//! ([`crate::prefetch::plan::next_candidates`]). Without a hint, a job is prefetched only while its
//! reads say that it reads the whole dataset and its epoch is under way
//! ([`crate::prefetch::plan::may_prefetch_remaining`]): never for a glance, never for a shard.
//!
//! A job that has not opened a file for [`ACTIVE_SECS`] gets no prefetch, and what it staged
//! is released then, counted as unused: it stopped (between runs, validating, gone), and its
//! staging area would otherwise sit until `--job-idle-timeout` forgets it. When a job's epoch
//! ends, what it staged for it and did not read moves to the new epoch if the job reads the
//! whole dataset (it will read those files in the new one), and is released as unused if not.
//!
//! A cache policy that never evicts (MinIO) may admit prefetched blocks while it has room (a
//! guess cannot push anything out); one that evicts (LRU) gets them only when they are read
//! ([`crate::cache::policy::CachePolicy::admits_prefetch`]). The rest waits in the staging
//! area until its job opens the file.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::DatasetFs;
use crate::block::Block;
use crate::cache::BlockKey;
use crate::jobs::{Job, JobKey, reads_the_dataset};
use crate::namespace::{FileId, FileVersion};
use crate::prefetch::PrefetchConfig;
use crate::prefetch::pacer::Pacer;
use crate::prefetch::plan::{may_prefetch_remaining, next_candidates};
use crate::stats::Counters;
use crate::tier::fetch::{Fetched, Report};
use crate::tier::{Tier, Want, Why};

/// A job that has not opened a file for this long gets no prefetch and its staging area is
/// released: it is between runs, validating, or gone, and what it staged would sit unread.
/// Longer than a DataLoader takes to start the next epoch's workers.
const ACTIVE_SECS: f64 = 5.0;

/// The staging area's size while the storage is bandwidth-bound: a few files, to fill the
/// storage's idle moments without running ahead of the reader (see [`crate::prefetch::pacer::Pacer`]).
const NARROW_STAGING: u64 = 2 << 20;

/// How long the loop sleeps when nothing wakes it.
const TICK: Duration = Duration::from_millis(50);

/// The prefetcher's shared state.
#[derive(Debug)]
pub(super) struct PrefetchState {
    /// Every file id in inode order, set when the scan completes.
    pub disk_order: OnceLock<Vec<FileId>>,
    signals: Arc<Signals>,
    /// Learns from every read how deep a queue the storage takes (see [`Pacer`]); None
    /// without prefetch, which is all it paces.
    pacer: Option<Arc<Mutex<Pacer>>>,
}

impl PrefetchState {
    pub(super) fn new(config: PrefetchConfig) -> Self {
        PrefetchState {
            disk_order: OnceLock::new(),
            signals: Arc::default(),
            pacer: config
                .enabled
                .then(|| Arc::new(Mutex::new(Pacer::new(config.depth)))),
        }
    }

    /// What wakes the loop, for code that runs off the core (fetch completions).
    pub(super) fn signals(&self) -> Arc<Signals> {
        self.signals.clone()
    }

    /// Tells the pacer how a read went, for the report of every fetch.
    pub(super) fn pacer(&self) -> Option<Arc<Mutex<Pacer>>> {
        self.pacer.clone()
    }

    /// True once the storage was judged bandwidth-bound (see [`Pacer`]).
    fn bandwidth_bound(&self) -> bool {
        self.pacer
            .as_ref()
            .is_some_and(|p| p.lock().bandwidth_bound())
    }

    /// Prefetch reads that may be in flight now, with `demand` reads of readers in flight:
    /// what the pacer allows beside them (none without prefetch).
    pub(super) fn allowed(&self, demand: usize) -> usize {
        self.pacer.as_ref().map_or(0, |p| p.lock().allowed(demand))
    }
}

/// Records how a fetch went in `pacer`.
pub(super) fn record(pacer: &Mutex<Pacer>, fetched: &Fetched) {
    let mut pacer = pacer.lock();
    let before = pacer.window();
    pacer.record(fetched.took.as_secs_f64(), fetched.crowd);
    if pacer.window() != before {
        tracing::debug!(
            "prefetch window {} -> {} ({})",
            before,
            pacer.window(),
            pacer.describe()
        );
    }
}

/// What fetch completions (on I/O threads) tell the loop.
#[derive(Debug, Default)]
pub(super) struct Signals {
    inflight: AtomicUsize,
    woken: Mutex<bool>,
    wake: Condvar,
}

impl Signals {
    /// Wakes the loop.
    pub(super) fn wake(&self) {
        *self.woken.lock() = true;
        self.wake.notify_one();
    }
}

impl DatasetFs {
    /// Wakes the prefetcher: something it plans from has changed.
    pub(super) fn wake_prefetcher(&self) {
        self.prefetcher.signals.wake();
    }

    /// Takes the staged blocks of file `version` for an open by `job` (see
    /// [`crate::tier::staging::Staging::claim`]). A policy that was not offered them when they
    /// arrived (LRU) is offered them now, as it is offered whatever is read.
    pub(super) fn claim_staged(
        &self,
        version: &FileVersion,
        job: JobKey,
    ) -> Vec<(u64, Arc<Block>)> {
        if !self.prefetch.enabled {
            return Vec::new();
        }
        let claimed = self.staging.claim(version, job);
        self.took_from_staging(version, job, &claimed);
        claimed
    }

    /// Offers blocks a reader of `job` took from the staging area to the tiers that keep
    /// what is read: the cache, if its policy was not offered them when they arrived, else
    /// the recent blocks, where a second open moments from now finds them.
    pub(super) fn took_from_staging(
        &self,
        version: &FileVersion,
        job: JobKey,
        claimed: &[(u64, Arc<Block>)],
    ) {
        for (block, data) in claimed {
            let want = Want {
                key: BlockKey {
                    version: *version,
                    block: *block,
                },
                rel: std::path::Path::new(""),
                job,
                epoch: 0,
                why: Why::Claimed,
            };
            if !self.cache.admit(&want, data) {
                self.recent.admit(&want, data);
            }
        }
    }

    /// Refills the staging area for `job` right away, on the caller's thread. Called when an
    /// open took staged blocks: waiting for the prefetch thread to wake would leave the
    /// storage idle for that long after every staged hit once the staging area is full
    /// (measured: 10% of a bandwidth-bound epoch).
    pub(super) fn refill_staging(&self, job: &Arc<Mutex<Job>>) {
        if let Some(disk_order) = self.prefetcher.disk_order.get() {
            self.prefetch_for(job, disk_order);
        }
    }

    /// The files in the dataset, for the prefetcher's rules (0 until the scan completes).
    fn prefetch_total(&self) -> usize {
        self.prefetcher.disk_order.get().map_or(0, |o| o.len())
    }

    /// `job`'s epoch turned to `current`. What it staged for the epochs before moves to the
    /// new one if the job reads the whole dataset (it will read those files in this epoch),
    /// with the bytes read for them; otherwise it is dropped and counted as unused.
    pub(super) fn staging_after_epoch(&self, job: &Arc<Mutex<Job>>, key: JobKey, current: u64) {
        let keep = {
            let j = job.lock();
            let t = j.log.tracker();
            reads_the_dataset(
                t.last_epoch_files(),
                self.prefetch_total(),
                t.covered_dataset(),
            )
        };
        if !keep {
            return self.drop_unused_staging(job, key, current);
        }
        let moved = self.staging.retag_before(key, current);
        if moved.is_empty() {
            return;
        }
        let mut j = job.lock();
        for (epoch, m) in moved {
            j.log.update(epoch, |r| {
                r.bytes_from_source -= m.read.min(r.bytes_from_source);
                r.prefetched_files -= m.files.min(r.prefetched_files);
            });
            j.log.update(current, |r| {
                r.bytes_from_source += m.read;
                r.prefetched_files += m.files;
            });
            tracing::debug!(
                "{key}: {} staged blocks of epoch {epoch} kept for epoch {current}",
                m.blocks
            );
        }
    }

    /// Drops what `job` staged for epochs before `current` and counts it as unused.
    pub(super) fn drop_unused_staging(&self, job: &Arc<Mutex<Job>>, key: JobKey, current: u64) {
        let dropped = self.staging.drop_before(key, current);
        if dropped.is_empty() {
            return;
        }
        let mut j = job.lock();
        for (epoch, d) in dropped {
            Counters::add(&self.stats.counters.prefetched_unused, d.blocks);
            j.log.update(epoch, |r| r.prefetched_unused += d.blocks);
            tracing::debug!("{key}: {} staged blocks of epoch {epoch} unused", d.blocks);
        }
    }

    /// Starts the prefetch thread. It holds the core weakly and ends when the core is gone.
    pub fn start_prefetcher(self: &Arc<Self>) -> std::io::Result<()> {
        let weak: Weak<DatasetFs> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("coorfs-prefetch".into())
            .spawn(move || {
                loop {
                    let Some(fs) = weak.upgrade() else { break };
                    fs.prefetch_round();
                    let signals = fs.prefetcher.signals.clone();
                    drop(fs);
                    let mut woken = signals.woken.lock();
                    if !*woken {
                        signals.wake.wait_for(&mut woken, TICK);
                    }
                    *woken = false;
                }
            })?;
        Ok(())
    }

    /// One pass: forget idle jobs, then fetch ahead for every active one.
    fn prefetch_round(&self) {
        let now = self.stats.now();
        for job in self.jobs.expire(now) {
            let key = job.lock().key;
            self.drop_unused_staging(&job, key, u64::MAX);
        }
        if !self.prefetch.enabled {
            return;
        }
        let Some(disk_order) = self.prefetcher.disk_order.get() else {
            return;
        };
        for job in self.jobs.live() {
            let (idle, key) = {
                let j = job.lock();
                (now - j.last_access > ACTIVE_SECS, j.key)
            };
            if idle {
                // Released, and again if a fetch in flight then lands.
                if self.staging.held_by(key) > 0 {
                    self.drop_unused_staging(&job, key, u64::MAX);
                }
                continue;
            }
            self.prefetch_for(&job, disk_order);
        }
    }

    /// Issues fetches for `job` until the queue or the staging area is full, or nothing is
    /// left to fetch this epoch.
    fn prefetch_for(&self, job: &Arc<Mutex<Job>>, disk_order: &[FileId]) {
        loop {
            let inflight = self.prefetcher.signals.inflight.load(Ordering::Relaxed);
            let allowed = self.prefetcher.allowed(self.fetcher.demand_in_flight());
            if inflight >= allowed {
                return;
            }
            let (key, epoch, picked) = {
                let mut j = job.lock();
                let hinted = j.active_order();
                let t = j.log.tracker();
                // Without an order for it, only what the job's reads say it will read: a
                // glance, a shard, a job that stopped after its last epoch must not leave a
                // staging area full of files nobody will read.
                if hinted.is_none()
                    && !may_prefetch_remaining(
                        t.read_in_epoch(),
                        disk_order.len(),
                        t.covered_dataset(),
                    )
                {
                    return;
                }
                let order: &[FileId] = hinted.as_deref().map_or(disk_order, |v| v.as_slice());
                let (picked, cursor) =
                    next_candidates(order, j.prefetch_cursor, allowed - inflight, |f| {
                        !t.may_have_read(f) && self.worth_prefetching(f)
                    });
                j.prefetch_cursor = cursor;
                (j.key, j.epoch(), picked)
            };
            if picked.is_empty() {
                return;
            }
            for (position, file) in picked {
                if !self.prefetch_file(job, key, epoch, file) {
                    // Staging is full: come back to this file when there is room.
                    let mut j = job.lock();
                    if j.epoch() == epoch {
                        j.prefetch_cursor = j.prefetch_cursor.min(position);
                    }
                    return;
                }
            }
        }
    }

    /// True if file `f` is not cached and not staged or being fetched already.
    fn worth_prefetching(&self, f: FileId) -> bool {
        let Some(info) = self.ns.file_node(f).and_then(|n| self.ns.info(n)) else {
            return false;
        };
        let key = BlockKey {
            version: info.version,
            block: 0,
        };
        info.version.size > 0
            && !self.cache.holds_file(&info.version)
            && !self.staging.contains(&key)
            && !self.fetcher.in_flight(&key)
    }

    /// Fetches the blocks of file `f` for `job`'s epoch `epoch`. Returns false if the
    /// staging area had no room for them.
    fn prefetch_file(&self, job: &Arc<Mutex<Job>>, key: JobKey, epoch: u64, f: FileId) -> bool {
        let Some(node) = self.ns.file_node(f) else {
            return true;
        };
        let (Some(info), Some(rel)) = (self.ns.info(node), self.ns.path(node)) else {
            return true;
        };
        let rel: Arc<std::path::Path> = Arc::from(rel);
        let version = info.version;
        let mut issued = false;
        let blocks = self.cache.blocks();
        for block in 0..blocks.count(version.size) {
            let bkey = BlockKey { version, block };
            if self.cache.contains(&bkey)
                || self.staging.contains(&bkey)
                || self.fetcher.in_flight(&bkey)
            {
                continue;
            }
            // Staging counts the memory a block takes: whole pages.
            let memory = Block::footprint_for(blocks.len(version.size, block) as usize);
            // Checked and issued under the job's lock, which its opens take to mark a file
            // read: either the job opened the file first and it is skipped, or the fetch is
            // in flight before the job's read can start another.
            let j = job.lock();
            if j.epoch() != epoch || j.log.tracker().may_have_read(f) {
                return true;
            }
            if self.prefetcher.bandwidth_bound() && self.staging.bytes() + memory > NARROW_STAGING {
                return issued;
            }
            if !self.staging.reserve(memory) {
                return issued;
            }
            issued = true;
            self.prefetcher
                .signals
                .inflight
                .fetch_add(1, Ordering::Relaxed);
            Counters::add(&self.stats.counters.prefetched_blocks, 1);
            let stats = self.stats.clone();
            let total = self.prefetch_total();
            let accounted = job.clone();
            let pacer = self.prefetcher.pacer();
            let report: Report = Box::new(move |fetched| {
                if let Some(pacer) = &pacer {
                    record(pacer, fetched);
                }
                let Some(n) = fetched.bytes else {
                    return;
                };
                let mut log = stats.epochs.lock();
                let current = log.tracker().epoch();
                log.update(current, |r| r.bytes_from_source += n);
                drop(log);
                let mut j = accounted.lock();
                let target = j.staging_epoch(epoch, f, total);
                j.log.update(target, |r| r.bytes_from_source += n);
            });
            let (cache, staging) = (self.cache.clone(), self.staging.clone());
            let signals = self.prefetcher.signals.clone();
            let owner = job.clone();
            let want = Want {
                key: bkey,
                rel: &rel,
                job: key,
                epoch,
                why: Why::Prefetch,
            };
            self.fetcher.fetch(
                rel.clone(),
                &want,
                Box::new(move |r| {
                    // Staged even if the epoch turned meanwhile: for the new epoch if the
                    // job will read the file in it, else for the old one, and then a reader
                    // that joined this fetch discards it right after (it comes first among
                    // the waiters), and anything else is counted as unused when the epoch is
                    // cleaned up.
                    match r {
                        Ok(data) if !cache.contains(&bkey) => {
                            let target = owner.lock().staging_epoch(epoch, f, total);
                            let want = Want {
                                key: bkey,
                                rel: std::path::Path::new(""),
                                job: key,
                                epoch: target,
                                why: Why::Prefetch,
                            };
                            staging.admit(&want, &data);
                        }
                        _ => staging.unreserve(memory),
                    }
                    signals.inflight.fetch_sub(1, Ordering::Relaxed);
                    signals.wake();
                }),
                report,
            );
            drop(j);
        }
        if issued {
            job.lock().log.update(epoch, |r| r.prefetched_files += 1);
        }
        true
    }
}
