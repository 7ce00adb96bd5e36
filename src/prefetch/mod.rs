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
//! The [`Prefetcher`] owns what prefetch needs: the staging tier's budget and what it holds
//! per job and epoch ([`crate::tier::staging`]), the signals that wake its thread, the
//! dataset's on-disk order and the [`pacer`]. The filesystem tells it what happens: an open
//! ([`Prefetcher::on_open`]; [`Prefetcher::claim`] takes the file's staged blocks), a fetch
//! that ended ([`Prefetcher::on_fetch_done`], [`Prefetcher::record`]), the scan that
//! completed ([`Prefetcher::scanned`]). Whom to prefetch for and what next is pure
//! ([`plan`]).
//!
//! One thread wakes when something changed or every 50 ms, and for each job active in the
//! last few seconds issues fetches until `--prefetch-depth` are in flight or the staging
//! area is full. What to fetch comes from the job's order hint if it gave one for this epoch,
//! else from the dataset in inode order (on-disk order on ext4/XFS), skipping what the job
//! has read (or may have read) this epoch, what is cached, staged or already being fetched
//! ([`plan::next_candidates`]). Without a hint, a job is prefetched only once its epoch is
//! under way, and while its reads say that it reads the whole dataset or, on remote storage,
//! a cache that never evicts has room for what is fetched ([`plan::may_prefetch_remaining`]):
//! never for a glance, and for a shard only what the cache keeps.
//!
//! A job that has not opened a file for [`ACTIVE_SECS`] gets no prefetch, and what it staged
//! is released then, counted as unused: it stopped (between runs, validating, gone), and its
//! staging area would otherwise sit until `--job-idle-timeout` forgets it. When a job's epoch
//! ends, what it staged for it and did not read moves to the new epoch if the job reads the
//! whole dataset (it will read those files in the new one), and is released as unused if not.
//!
//! Jobs share what was read for one of them ([`Prefetcher::share`]): a block the cache did not
//! keep stays staged for the jobs that will still read its file this epoch
//! ([`Prefetcher::needing`]), so a file is read once a round however many jobs read it
//! (`--no-share` turns it off; see [`crate::tier::staging`]).
//!
//! A cache policy that never evicts (MinIO) may admit prefetched blocks while it has room (a
//! guess cannot push anything out); one that evicts (LRU) gets them only when they are read
//! ([`crate::cache::policy::CachePolicy::admits_prefetch`]). The rest waits in the staging
//! area until its job opens the file.

pub mod pacer;
pub mod plan;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::block::Block;
use crate::cache::BlockKey;
use crate::epoch::Step;
use crate::jobs::ledger::Ledger;
use crate::jobs::{Job, JobKey, Jobs, reads_the_dataset};
use crate::namespace::{FileId, FileVersion, Namespace};
use crate::tier::fetch::{Fetched, Origin, Report};
use crate::tier::staging::{self, Claimed};
use crate::tier::{Tiers, Want, Why};
use pacer::Pacer;
use plan::{may_prefetch_remaining, next_candidates, will_read};

/// A read whose blocks [`Prefetcher::share`] keeps for other jobs: the job, its epoch, the
/// digest of the order it followed (if any), and the files of that epoch it had opened with
/// this one (its place in the order).
#[derive(Clone, Copy, Debug)]
pub struct ReadBy {
    pub job: JobKey,
    pub round: u64,
    pub order: Option<u64>,
    pub position: u64,
}

/// How the prefetcher runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchConfig {
    pub enabled: bool,
    /// Bytes the staging area may hold, in flight included.
    pub memory: u64,
    /// Prefetch fetches in flight at once.
    pub depth: usize,
    /// Blocks read for one job stay staged for the other jobs that will read them.
    pub share: bool,
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
            share: true,
        }
    }
}

impl PrefetchConfig {
    /// The staging area's budget in bytes: nothing without prefetch.
    pub fn staging_bytes(&self) -> u64 {
        if self.enabled { self.memory } else { 0 }
    }
}

/// A job that has not opened a file for this long gets no prefetch and its staging area is
/// released: it is between runs, validating, or gone, and what it staged would sit unread.
/// Longer than a DataLoader takes to start the next epoch's workers.
pub const ACTIVE_SECS: f64 = 5.0;

/// What a job may have staged ahead while the storage is bandwidth-bound: a few files, to fill
/// the storage's idle moments without running ahead of the reader (see [`Pacer`]).
const NARROW_STAGING: u64 = 2 << 20;

/// How long [`Prefetcher::needing`] waits for a job's lock, which its opens and the prefetcher
/// hold for microseconds. A job whose lock stays busy counts as a needer: a block kept for a
/// job that has read it already stays staged until that job's next epoch, so guessing often
/// fills the staging area with blocks nobody reads soon. Short, since the open that shares
/// waits too: 2 ms, on 2 CPUs busy with 4 jobs, added seconds to a fast job's epochs.
const BUSY_WAIT: Duration = Duration::from_micros(200);

/// A read alone taking this long (seconds) is a remote store's (S3: 20-50 ms to the first
/// byte); local disks and nearby network filesystems answer in a few milliseconds.
pub const REMOTE_SECS: f64 = 0.010;

/// Files of a job's order hint whose first run's request is sent ahead at once
/// ([`Prefetcher::send_ahead`]): the next file of each of up to four reader processes (a
/// DataLoader's workers take the order's files in turn). Each request waits with its
/// connection and the bytes the store sent before the window closed.
pub const SEND_AHEAD: usize = 4;

/// How long the loop sleeps when nothing wakes it.
const TICK: Duration = Duration::from_millis(50);

/// What wakes the loop, and the prefetches in flight.
#[derive(Debug, Default)]
struct Signals {
    inflight: AtomicUsize,
    /// A prefetch that ends with this many or fewer still in flight wakes the loop: half the
    /// window the last round filled (0 for a window of one).
    refill_at: AtomicUsize,
    woken: Mutex<bool>,
    wake: Condvar,
}

impl Signals {
    fn wake(&self) {
        *self.woken.lock() = true;
        self.wake.notify_one();
    }

    /// A prefetch ended: the loop refills the queue once half of it is free, a batch of
    /// fetches a wake-up. Woken at every end, it was woken as often as files were read (cold
    /// small files: 190,000 switches of the prefetch thread for 200,000 files).
    fn ended(&self) {
        let left = self
            .inflight
            .fetch_sub(1, Ordering::Relaxed)
            .saturating_sub(1);
        if left <= self.refill_at.load(Ordering::Relaxed) {
            self.wake();
        }
    }
}

/// The prefetcher of one mount.
pub struct Prefetcher {
    config: PrefetchConfig,
    tiers: Tiers,
    ns: Arc<Namespace>,
    jobs: Arc<Jobs>,
    ledger: Arc<Ledger>,
    /// Every file id in inode order, set when the scan completes.
    disk_order: OnceLock<Vec<FileId>>,
    /// The memory the whole dataset takes in the cache, set when the scan completes.
    dataset_footprint: OnceLock<u64>,
    signals: Arc<Signals>,
    /// Learns from every read how deep a queue the storage takes; None without prefetch,
    /// which is all it paces.
    pacer: Option<Mutex<Pacer>>,
    /// Rounds so far: which job takes the first turn in the next one.
    turn: AtomicUsize,
    /// Told of each file a prefetch brought whole into the cache ([`WholeFile`]).
    whole_file: OnceLock<WholeFile>,
}

/// Called with a file's node, version and bytes when a prefetch brought the whole file into
/// the cache in one block: where the kernel opens files itself, its page cache takes them, and
/// the file's reader then reads it with no request at all (`crate::fs`'s `told/`).
pub type WholeFile =
    Box<dyn Fn(crate::namespace::NodeId, FileVersion, Arc<crate::block::Block>) + Send + Sync>;

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("config", &self.config)
            .field("staging", &self.tiers.staging)
            .finish_non_exhaustive()
    }
}

/// One block the prefetcher fetches: for which job's epoch, of which file, and the staging
/// memory reserved for it.
#[derive(Clone, Copy, Debug)]
struct Staged {
    job: JobKey,
    epoch: u64,
    file: FileId,
    block: u64,
    /// Bytes of the staging area reserved for it (whole pages).
    memory: u64,
}

impl Prefetcher {
    /// A prefetcher that fetches through `tiers` into their staging area for the `jobs`
    /// reading the files of `ns`, counting in `ledger`. Its thread starts with
    /// [`Prefetcher::start`].
    pub fn new(
        config: PrefetchConfig,
        tiers: Tiers,
        ns: Arc<Namespace>,
        jobs: Arc<Jobs>,
        ledger: Arc<Ledger>,
    ) -> Self {
        Prefetcher {
            pacer: config.enabled.then(|| Mutex::new(Pacer::new(config.depth))),
            turn: AtomicUsize::new(0),
            config,
            tiers,
            ns,
            jobs,
            ledger,
            disk_order: OnceLock::new(),
            dataset_footprint: OnceLock::new(),
            signals: Arc::default(),
            whole_file: OnceLock::new(),
        }
    }

    /// From now on, `told` hears of each file a prefetch brings whole into the cache.
    pub fn tell_whole_files(&self, told: WholeFile) {
        let _ = self.whole_file.set(told);
    }

    /// Starts the prefetch thread. It holds the prefetcher weakly and ends when it is gone.
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let weak: Weak<Prefetcher> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("coorfs-prefetch".into())
            .spawn(move || {
                loop {
                    let Some(prefetcher) = weak.upgrade() else {
                        break;
                    };
                    prefetcher.round();
                    let signals = prefetcher.signals.clone();
                    drop(prefetcher);
                    let mut woken = signals.woken.lock();
                    if !*woken {
                        signals.wake.wait_for(&mut woken, TICK);
                    }
                    *woken = false;
                }
            })?;
        Ok(())
    }

    /// Wakes the loop: something it plans from has changed.
    pub fn wake(&self) {
        self.signals.wake();
    }

    /// The scan of the source completed: `disk_order` is every file id in inode order.
    pub fn scanned(&self, disk_order: Vec<FileId>) {
        let memory = &self.tiers.memory;
        let footprint = (disk_order.iter())
            .filter_map(|&f| self.ns.file_node(f).and_then(|n| self.ns.info(n)))
            .map(|info| memory.file_footprint(info.version.size))
            .sum();
        let _ = self.dataset_footprint.set(footprint);
        let _ = self.disk_order.set(disk_order);
        self.wake();
    }

    /// Takes the staged blocks of file `version` (at `rel`) for an open by `job` (see
    /// [`crate::tier::staging::Staging::claim`]), and offers them to the tiers that keep
    /// what is read ([`Tiers::took_from_staging`]).
    pub fn claim(&self, rel: &Path, version: &FileVersion, job: JobKey) -> Claimed {
        if !self.config.enabled {
            return Claimed::default();
        }
        let claimed = self.tiers.staging.claim(version, job);
        let want = Want {
            key: BlockKey {
                version: *version,
                block: 0,
            },
            rel,
            job,
            epoch: 0,
            why: Why::Claimed,
            stream: true,
        };
        self.tiers.took_from_staging(&want, &claimed.blocks);
        claimed
    }

    /// The active jobs other than `except` (whose epoch is `round`) that will read file `f`
    /// soon as far as their reads and orders show ([`will_read`]). A job whose lock is busy
    /// counts: a block kept for a job that does not need it costs room until its epoch turns,
    /// a block not kept costs a read of the source.
    pub fn needing(&self, f: FileId, except: JobKey, round: u64) -> Vec<JobKey> {
        if !self.config.enabled || !self.config.share {
            return Vec::new();
        }
        let now = self.ledger.now();
        let total = self.total();
        let mut out = Vec::new();
        for (key, job) in self.jobs.live_keyed() {
            if key == except {
                continue;
            }
            let Some(j) = job.try_lock_for(BUSY_WAIT) else {
                out.push(key);
                continue;
            };
            if now - j.last_access > ACTIVE_SECS {
                continue;
            }
            if will_read(&j, f, round, total) {
                out.push(key);
            }
        }
        out
    }

    /// Keeps `blocks` of file `f` (at `version`), which `by.job` read and the cache did not
    /// keep, in the staging area for the other jobs that will read the file
    /// ([`Prefetcher::needing`]). Needed by nobody yet, they stay as spares if the job follows
    /// an order: for the jobs that will follow it too and have not started (a group's members
    /// start seconds apart: Python, torch, the DataLoader's workers). Read in an order, they
    /// are due where the reader was in it: the others in that order read them in that order.
    pub fn share(
        &self,
        f: FileId,
        by: ReadBy,
        version: &FileVersion,
        blocks: &[(u64, Arc<Block>)],
    ) {
        let ReadBy {
            job,
            round,
            order,
            position,
        } = by;
        if !self.config.enabled || !self.config.share || blocks.is_empty() {
            return;
        }
        // Jobs that join the order from now on are not among the needers looked for here.
        let since = self.tiers.staging.joins();
        let needers = self.needing(f, job, round);
        let order = order.map(|digest| (job, digest));
        if needers.is_empty() && order.is_none() {
            return;
        }
        // Epochs in one order follow each other: a place in epoch 3 comes after all of epoch 2.
        let due = match order {
            Some(_) => round
                .saturating_mul(self.total() as u64 + 1)
                .saturating_add(position),
            None => staging::UNKNOWN,
        };
        for (block, data) in blocks {
            let key = BlockKey {
                version: *version,
                block: *block,
            };
            if !self.tiers.memory.contains(&key) {
                self.tiers
                    .staging
                    .share(key, data, needers.clone(), order, since, due);
            }
        }
    }

    /// `job` follows the order of digest `order` from now on (a hint for its epoch under way):
    /// the spares read in that order by the jobs ahead are kept for it.
    pub fn joined(&self, order: u64, job: JobKey) {
        if !self.config.enabled || !self.config.share {
            return;
        }
        let n = self.tiers.staging.join(order, job);
        if n > 0 {
            tracing::debug!("{job}: joins order {order:016x}, {n} spare blocks kept for it");
        }
    }

    /// `job` opened a file: the access did `step` to its epoch (None for a file the scan has
    /// not seen), the file was wholly `staged` by the prefetcher, or a `hit` in the cache.
    pub fn on_open(
        self: &Arc<Self>,
        job: &Arc<Mutex<Job>>,
        step: Option<Step>,
        staged: bool,
        hit: bool,
    ) {
        if step.is_some_and(Step::began_epoch) {
            let (key, current) = {
                let j = job.lock();
                (j.key, j.epoch())
            };
            self.after_epoch(job, key, current);
            self.wake();
        }
        // A staged hit freed room: refill it now, on this thread, taking turns with the
        // other jobs (this one's order would take every slot). Waiting for the prefetch
        // thread to wake would leave the storage idle for that long after every staged hit
        // once the staging area is full (measured: 10% of a bandwidth-bound epoch). A miss
        // may leave the prefetcher work (and it should see a job become active) where the
        // queue has room; a full queue wakes it as it drains (`Signals::ended`). A hit
        // changes nothing it plans from, and waking a thread per open costs CPU that a hot
        // epoch needs.
        if staged {
            if let Some(disk_order) = self.disk_order.get() {
                self.take_turns(self.active_jobs(self.ledger.now()), disk_order);
            }
        } else if !hit && self.queue_has_room() {
            self.wake();
        }
    }

    /// A fetch ended (any fetch, by the caller that started it): the pacer learns from it.
    pub fn record(&self, fetched: &Fetched) {
        // The pacer learns how the storage answers: a read of the local disk tier says
        // nothing of it.
        let Some(pacer) = self
            .pacer
            .as_ref()
            .filter(|_| fetched.origin != Origin::Disk)
        else {
            return;
        };
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

    /// A reader's fetch ended and its reader has its bytes. The storage may be idle now: on
    /// bandwidth-bound storage, that is when the prefetcher may read. Otherwise (or with the
    /// queue full) the wake-up would only cost CPU.
    pub fn on_fetch_done(&self) {
        if self.queue_has_room() {
            self.wake();
        }
    }

    /// Bytes staged or reserved now.
    pub fn staging_bytes(&self) -> u64 {
        self.tiers.staging.bytes()
    }

    /// The staging area's budget.
    pub fn staging_capacity(&self) -> u64 {
        self.tiers.staging.capacity()
    }

    /// True once the storage was judged bandwidth-bound (see [`Pacer`]).
    fn bandwidth_bound(&self) -> bool {
        self.pacer
            .as_ref()
            .is_some_and(|p| p.lock().bandwidth_bound())
    }

    /// Prefetch reads that may be in flight now: what the pacer allows beside the readers'
    /// reads in flight (none without prefetch).
    fn allowed(&self) -> usize {
        let demand = self.tiers.fetcher.demand_in_flight();
        self.pacer.as_ref().map_or(0, |p| p.lock().allowed(demand))
    }

    /// True if fewer prefetches are in flight than the pacer allows now.
    fn queue_has_room(&self) -> bool {
        self.signals.inflight.load(Ordering::Relaxed) < self.allowed()
    }

    /// The files in the dataset, for the rules (0 until the scan completes).
    fn total(&self) -> usize {
        self.disk_order.get().map_or(0, |o| o.len())
    }

    /// True if job `j`, without an order, reads in a way the prefetcher follows: what its reads
    /// say it will read. A glance, a shard, a job that stopped after its last epoch must not
    /// leave a staging area full of files nobody will read.
    fn reads_remaining_ahead(&self, j: &Job) -> bool {
        let t = j.log.tracker();
        self.disk_order.get().is_some()
            && may_prefetch_remaining(
                t.read_in_epoch(),
                self.total(),
                t.covered_dataset(),
                self.keeps_guesses(),
            )
    }

    /// True if a guess (a file a job may not read this epoch) costs nothing worth a read's
    /// wait and lands in the cache, which never evicts, rather than in staging: what the
    /// cache keeps is a hit of a later epoch (or of another job's). Where
    /// - the storage is remote (a read alone takes [`REMOTE_SECS`] or more, and reads do not
    ///   queue behind each other), every file a job waits for costs tens of milliseconds;
    ///   while the cache (or the disk tier: a guess it keeps is a local read later) has room
    ///   for a whole window of blocks.
    /// - reads do not queue behind each other (latency-bound, see [`Pacer`]) and the whole
    ///   dataset fits in the cache, a guess takes neither a read's turn nor room a file the
    ///   job reads would have had, and the epoch is prefetched from its start rather than
    ///   from its middle. Cold small files on a local disk: 42% of the first epoch's files
    ///   were prefetched without it, 69-80% with it.
    fn keeps_guesses(&self) -> bool {
        let memory = &self.tiers.memory;
        if let Some(window) = self.remote_window() {
            let bytes = memory.blocks().get() * window as u64;
            return memory.has_room_for(bytes)
                || (self.tiers.disk.as_ref()).is_some_and(|d| d.has_room_for(bytes));
        }
        // The whole dataset fits, so what is in flight does too (whatever the block size):
        // `has_room_for(0)` asks only that the cache keep prefetched blocks.
        let latency_bound = (self.pacer.as_ref()).is_some_and(|p| {
            let p = p.lock();
            p.base().is_some() && !p.bandwidth_bound()
        });
        latency_bound && memory.has_room_for(0) && self.dataset_fits()
    }

    /// True if every file of the dataset fits in the cache at its current size (an elastic
    /// budget's changes).
    fn dataset_fits(&self) -> bool {
        (self.dataset_footprint.get()).is_some_and(|&f| f <= self.tiers.memory.capacity())
    }

    /// The pacer's window of reads in flight, if the storage is remote: a read alone takes
    /// [`REMOTE_SECS`] or more, and reads do not queue behind each other.
    fn remote_window(&self) -> Option<usize> {
        let p = self.pacer.as_ref()?.lock();
        let remote = p.base().is_some_and(|b| b >= REMOTE_SECS) && !p.bandwidth_bound();
        remote.then(|| p.window())
    }

    /// `job`'s epoch turned to `current`. What it staged for the epochs before moves to the
    /// new one if the job reads the whole dataset (it will read those files in this epoch),
    /// with the bytes read for them; otherwise it is dropped and counted as unused.
    fn after_epoch(&self, job: &Arc<Mutex<Job>>, key: JobKey, current: u64) {
        self.tiers.staging.drop_spares(key);
        let keep = {
            let j = job.lock();
            let t = j.log.tracker();
            reads_the_dataset(t.last_epoch_files(), self.total(), t.covered_dataset())
        };
        if !keep {
            self.tiers.staging.forget_needer(key);
            return self.drop_unused(job, key, current);
        }
        // Not the blocks of a file the job read in the epoch they were staged for: a read of
        // it under way (the last file's, whose open turned the epoch) takes them, and their
        // bytes stay that epoch's.
        let mut j = job.lock();
        let total = self.total();
        let moved = (self.tiers.staging).retag_before(key, current, |epoch, f| {
            j.staging_epoch(epoch, f, total) != current
        });
        for (epoch, m) in moved {
            self.ledger
                .staging_moved(&mut j, epoch, current, m.read, m.files);
            tracing::debug!(
                "{key}: {} staged blocks of epoch {epoch} kept for epoch {current}",
                m.blocks
            );
        }
    }

    /// Drops what `job` staged for epochs before `current` and counts it as unused.
    fn drop_unused(&self, job: &Arc<Mutex<Job>>, key: JobKey, current: u64) {
        let dropped = self.tiers.staging.drop_before(key, current);
        if dropped.is_empty() {
            return;
        }
        let mut j = job.lock();
        for (epoch, d) in dropped {
            self.ledger.staging_unused(&mut j, epoch, d.blocks);
            tracing::debug!("{key}: {} staged blocks of epoch {epoch} unused", d.blocks);
        }
    }

    /// One pass: forget idle jobs, then fetch ahead for every active one.
    fn round(self: &Arc<Self>) {
        let now = self.ledger.now();
        for job in self.jobs.expire(now) {
            let key = job.lock().key;
            self.drop_unused(&job, key, u64::MAX);
            self.tiers.staging.forget_needer(key);
        }
        if !self.config.enabled {
            return;
        }
        let Some(disk_order) = self.disk_order.get() else {
            return;
        };
        let mut active = Vec::new();
        for job in self.jobs.live() {
            let (idle, key) = {
                let j = job.lock();
                (now - j.last_access > ACTIVE_SECS, j.key)
            };
            if idle {
                // Released, and again if a fetch in flight then lands.
                if self.tiers.staging.held_by(key) > 0 {
                    self.drop_unused(&job, key, u64::MAX);
                }
                self.tiers.staging.forget_needer(key);
                continue;
            }
            active.push(job);
        }
        for job in &active {
            self.send_ahead(job);
        }
        self.take_turns(active, disk_order);
    }

    /// Sends ahead the first run's request of each of the next [`SEND_AHEAD`] files of
    /// `job`'s order hint that the prefetcher leaves to their readers (big objects read in
    /// parts, see [`Prefetcher::worth_prefetching`]): each is read at its reader's pace as
    /// before, but its open finds the request's wait behind it ([`Fetcher::send_ahead`]).
    /// Nothing without a hint: a guess would be a request sent for nothing.
    fn send_ahead(&self, job: &Arc<Mutex<Job>>) {
        let (key, epoch, next) = {
            let mut j = job.lock();
            let Some(order) = j.active_order() else {
                return;
            };
            let t = j.log.tracker();
            let mut at = j.send_cursor;
            while at < order.len() && t.may_have_read(order[at]) {
                at += 1;
            }
            let next: Vec<FileId> = (order[at..].iter())
                .filter(|&&f| !t.may_have_read(f))
                .take(SEND_AHEAD)
                .copied()
                .collect();
            j.send_cursor = at;
            (j.key, j.epoch(), next)
        };
        for f in next {
            let Some(node) = self.ns.file_node(f) else {
                continue;
            };
            let (Some(info), Some(rel)) = (self.ns.info(node), self.ns.path(node)) else {
                continue;
            };
            let fetcher = &self.tiers.fetcher;
            if !fetcher.prefetch_block_by_block(info.version.size) {
                continue;
            }
            fetcher.send_ahead(&Want {
                key: BlockKey {
                    version: info.version,
                    block: 0,
                },
                rel: &rel,
                job: key,
                epoch,
                why: Why::Prefetch,
                stream: true,
            });
        }
    }

    /// The jobs that opened a file within [`ACTIVE_SECS`] of `now`.
    fn active_jobs(&self, now: f64) -> Vec<Arc<Mutex<Job>>> {
        let mut jobs = self.jobs.live();
        jobs.retain(|job| now - job.lock().last_access <= ACTIVE_SECS);
        jobs
    }

    /// Fetches ahead for `jobs` until the queue or the staging area is full, or nothing is
    /// left to fetch. The jobs take turns, a file each, and each call starts with the next
    /// job: the queue is shared. Served one after the other, the first job's order took every
    /// slot that came free and the others read from the source (two torchrun ranks: one
    /// prefetched 16 files of its 100-file epoch, the other all of its own).
    fn take_turns(self: &Arc<Self>, mut jobs: Vec<Arc<Mutex<Job>>>, disk_order: &[FileId]) {
        if jobs.is_empty() {
            return;
        }
        let first = self.turn.fetch_add(1, Ordering::Relaxed) % jobs.len();
        jobs.rotate_left(first);
        while !jobs.is_empty() {
            jobs.retain(|job| self.prefetch_one(job, disk_order));
        }
        (self.signals.refill_at).store(self.allowed() / 2, Ordering::Relaxed);
    }

    /// Fetches the next file of `job`'s epoch: `job`'s turn. Returns true if it may take
    /// another: neither the queue nor the staging area is full, and there may be more to
    /// fetch for the job this epoch.
    fn prefetch_one(self: &Arc<Self>, job: &Arc<Mutex<Job>>, disk_order: &[FileId]) -> bool {
        if !self.queue_has_room() {
            return false;
        }
        let (key, epoch, picked) = {
            let mut j = job.lock();
            let hinted = j.active_order();
            let t = j.log.tracker();
            if hinted.is_none() && !self.reads_remaining_ahead(&j) {
                return false;
            }
            let order: &[FileId] = hinted.as_deref().map_or(disk_order, |v| v.as_slice());
            let (picked, cursor) = next_candidates(order, j.prefetch_cursor, 1, |f| {
                !t.may_have_read(f) && self.worth_prefetching(f, j.key)
            });
            j.prefetch_cursor = cursor;
            (j.key, j.epoch(), picked)
        };
        let Some(&(position, file)) = picked.first() else {
            return false;
        };
        if !self.prefetch_file(job, key, epoch, file) {
            // Staging is full: come back to this file when there is room.
            let mut j = job.lock();
            if j.epoch() == epoch {
                j.prefetch_cursor = j.prefetch_cursor.min(position);
            }
            return false;
        }
        true
    }

    /// True if file `f` is not cached, not staged for `job` and not being fetched already.
    /// Blocks of it staged for other jobs are kept for `job` too ([`staging::Staging::adopt`]):
    /// skipped as staged, they left with the others' needs (a spare of another rank's order
    /// when that rank's epoch turned) and `job` read the file from the source.
    fn worth_prefetching(&self, f: FileId, job: JobKey) -> bool {
        let Some(info) = self.ns.file_node(f).and_then(|n| self.ns.info(n)) else {
            return false;
        };
        let key = BlockKey {
            version: info.version,
            block: 0,
        };
        // A big object read block by block would cost a GET a block beside the readers' own
        // parts, which read it ahead themselves: 32 shards from S3 in a 384 MiB pod with an
        // order hint took 323-360 GETs an epoch against 175-241 without, and epochs 2-3 ran
        // 1.6-1.7 s paced against 1.3-1.5 s.
        if info.version.size == 0
            || self
                .tiers
                .fetcher
                .prefetch_block_by_block(info.version.size)
            || self.tiers.memory.holds_file(&info.version)
            || self.tiers.fetcher.in_flight(&key)
        {
            return false;
        }
        // Under --no-share a job reads what it misses itself: it adopts nothing.
        !(self.tiers.staging.contains(&key)
            && (!self.config.share || self.tiers.staging.adopt(&info.version, job)))
    }

    /// Fetches the blocks of file `f` for `job`'s epoch `epoch`. Returns false if the
    /// staging area had no room for them.
    fn prefetch_file(
        self: &Arc<Self>,
        job: &Arc<Mutex<Job>>,
        key: JobKey,
        epoch: u64,
        f: FileId,
    ) -> bool {
        let Some(node) = self.ns.file_node(f) else {
            return true;
        };
        let (Some(info), Some(rel)) = (self.ns.info(node), self.ns.path(node)) else {
            return true;
        };
        let rel: Arc<Path> = Arc::from(rel);
        let version = info.version;
        let mut issued = false;
        let blocks = self.tiers.memory.blocks();
        for block in 0..blocks.count(version.size) {
            let bkey = BlockKey { version, block };
            if self.tiers.memory.contains(&bkey)
                || self.tiers.staging.contains(&bkey)
                || self.tiers.fetcher.in_flight(&bkey)
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
            let staging = &self.tiers.staging;
            // What this job has staged ahead, not what is kept for other jobs: blocks kept
            // for the members of a group that lag are no reason to stop reading ahead.
            if self.bandwidth_bound() && staging.held_by(key) + memory > NARROW_STAGING {
                return issued;
            }
            if !staging.reserve(memory) {
                return issued;
            }
            issued = true;
            let staged = Staged {
                job: key,
                epoch,
                file: f,
                block,
                memory,
            };
            self.issue(job, &rel, version, staged);
            drop(j);
        }
        if issued {
            self.ledger.prefetched_file(job, epoch);
        }
        true
    }

    /// Issues the prefetch of block `staged.block` of the file at `rel` (of `version`): into
    /// the staging area it reserved `staged.memory` in, counted for `job`. Called under the
    /// job's lock (see [`Prefetcher::prefetch_file`]).
    fn issue(
        self: &Arc<Self>,
        job: &Arc<Mutex<Job>>,
        rel: &Arc<Path>,
        version: FileVersion,
        staged: Staged,
    ) {
        let Staged {
            job: key,
            epoch,
            file: f,
            block,
            memory,
        } = staged;
        let bkey = BlockKey { version, block };
        self.signals.inflight.fetch_add(1, Ordering::Relaxed);
        self.ledger.prefetch_issued();
        let total = self.total();
        let report = self.report(job, staged, total);
        let (cache, staging) = (self.tiers.memory.clone(), self.tiers.staging.clone());
        let (signals, owner, at) = (self.signals.clone(), job.clone(), rel.clone());
        // A file of one block: once the cache has it whole, the kernel may take it too (from a
        // cache that never evicts: the kernel's pages then stand for blocks the cache holds).
        let whole = (block == 0
            && self.tiers.memory.blocks().count(version.size) == 1
            && !self.tiers.memory.evicts())
        .then(|| self.clone());
        // On remote storage a block the disk tier takes from the source waits there for its
        // reader (a local read, not tens of milliseconds), not in the staging area: staging
        // then bounds what is in flight, not what was fetched ahead.
        let into_disk = (self.tiers.disk.clone())
            .filter(|d| !d.takes_block(rel, &bkey) && self.remote_window().is_some());
        let want = Want {
            key: bkey,
            rel,
            job: key,
            epoch,
            why: Why::Prefetch,
            stream: true,
        };
        // Another job's read may have left the block in the cache or staged it since it
        // was looked for above: then it is this job's with no second read.
        let tiers = &self.tiers;
        self.tiers.fetcher.fetch(
            rel.clone(),
            &want,
            &|| {
                tiers
                    .memory
                    .copy_of(&bkey)
                    .or_else(|| tiers.staging.peek(&bkey))
            },
            Box::new(move |r| {
                // Staged even if the epoch turned meanwhile: for the new epoch if the
                // job will read the file in it, else for the old one, and then a reader
                // that joined this fetch discards it right after (it comes first among
                // the waiters), and anything else is counted as unused when the epoch is
                // cleaned up.
                let kept = cache.contains(&bkey)
                    || into_disk
                        .as_ref()
                        .is_some_and(|d| d.takes_block(&at, &bkey));
                match r {
                    Ok(data) if !kept => {
                        let target = owner.lock().staging_epoch(epoch, f, total);
                        staging.put(bkey, data, key, target, Some(f));
                    }
                    Ok(data) => {
                        staging.unreserve(memory);
                        if let Some(this) = whole
                            && let Some(told) = this.whole_file.get()
                            && let Some(node) = this.ns.file_node(f)
                        {
                            told(node, version, data);
                        }
                    }
                    Err(_) => staging.unreserve(memory),
                }
                signals.ended();
            }),
            report,
        );
    }

    /// What the ledger is told of a prefetched block's fetch, once it ends.
    fn report(self: &Arc<Self>, job: &Arc<Mutex<Job>>, staged: Staged, total: usize) -> Report {
        let Staged { epoch, file: f, .. } = staged;
        let (this, accounted) = (self.clone(), job.clone());
        Box::new(move |fetched| {
            this.record(fetched);
            match fetched.bytes {
                Some(_) if fetched.origin == Origin::Disk => {}
                Some(n) if fetched.origin == Origin::Source => {
                    this.ledger.prefetched(&accounted, epoch, f, total, n);
                    if fetched.fallback {
                        this.ledger
                            .prefetched_via_peer(&accounted, epoch, f, total, n, false);
                    }
                    if fetched.first_block {
                        this.ledger.file_from_source(Some(f), epoch);
                    }
                }
                Some(n) => this
                    .ledger
                    .prefetched_via_peer(&accounted, epoch, f, total, n, true),
                None => {}
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn woken(s: &Signals) -> bool {
        std::mem::replace(&mut *s.woken.lock(), false)
    }

    #[test]
    fn prefetches_that_end_wake_the_loop_once_half_the_queue_is_free() {
        let s = Signals::default();
        s.inflight.store(16, Ordering::Relaxed);
        s.refill_at.store(8, Ordering::Relaxed);
        for left in (9..16).rev() {
            s.ended();
            assert!(!woken(&s), "woken with {left} still in flight");
        }
        s.ended();
        assert!(woken(&s), "not woken with 8 in flight");
        assert_eq!(s.inflight.load(Ordering::Relaxed), 8);
        // A window of one: every end wakes it.
        s.inflight.store(1, Ordering::Relaxed);
        s.refill_at.store(0, Ordering::Relaxed);
        s.ended();
        assert!(woken(&s));
        assert_eq!(s.inflight.load(Ordering::Relaxed), 0);
    }
}
