//! Jobs: who is reading, so that every training run has its own epoch clock.
//!
//! A job is one training run. A PyTorch DataLoader's worker processes are children of the
//! main process and share its process group and session, so by default (`--job-key auto`)
//! a job is a process group, falling back to the session if the group cannot be read (the
//! process already exited), except that the programs a script runs at once are a job each
//! ([`tree`]). How common launchers group:
//! - a script run from an interactive shell: the shell puts each pipeline in its own
//!   process group, so the script and everything it starts are one job;
//! - torchrun: every rank is a child of torchrun, in torchrun's process group: the ranks of
//!   one run are one job (each reads its shard; together they read the dataset once per
//!   epoch);
//! - a Jupyter notebook: the kernel process and its DataLoader workers are one job, and
//!   successive runs in one kernel are successive epochs of it;
//! - a sweep script that starts its trials in the background (one process group, no job
//!   control): each trial is a job with everything it starts. `--job-key pgid` makes the
//!   whole group one job, `sid` a session, `uid` a user's processes, `none` everybody.
//!
//! A user's live jobs are bounded ([`MAX_USER_JOBS`], and [`MAX_JOBS`] for everybody): a
//! job holds two bitmaps of the dataset's files. Past the bound a new job of the user joins
//! the user's catch-all job ([`JobKey::Uid`]), so a loop of `setsid cat` cannot grow the
//! daemon.
//!
//! Per job, an [`EpochLog`] with the [`Boundary::Coverage`] rule (every file read, or a new
//! pass over what it read: re-reads moments apart are one access; see [`crate::epoch`]),
//! per-epoch records, and the job's order hint. A job with no access for `idle_timeout` is
//! forgotten; its last records are kept, bounded, for `stats`. (Its staging area is released
//! long before, once it has not read for a few seconds: see [`crate::prefetch`].)
//!
//! What every access, byte and prefetch counts for, in the mount's, the dataset's and the
//! job's books, is decided in one place: [`ledger`].

pub mod forks;
pub mod found;
pub mod ledger;
pub mod tree;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use fixedbitset::FixedBitSet;
use parking_lot::Mutex;
use serde::Serialize;

use crate::epoch::Boundary;
use crate::namespace::FileId;
use crate::stats::{EpochLog, EpochRecord};

/// What identifies a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum JobKeyKind {
    /// The caller's process group, or its program's subtree when a script runs several at
    /// once ([`tree`]).
    #[default]
    Auto,
    /// The caller's process group (falling back to its session).
    Pgid,
    /// The caller's session.
    Sid,
    /// The caller's user id.
    Uid,
    /// One job for everybody.
    None,
}

/// How jobs are told apart and forgotten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobConfig {
    pub key: JobKeyKind,
    /// A job with no access for this long is forgotten.
    pub idle_timeout: Duration,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            key: JobKeyKind::Auto,
            // Longer than any pause between epochs (validation, checkpointing), short enough
            // that a finished run's state does not linger for the life of the mount.
            idle_timeout: Duration::from_secs(600),
        }
    }
}

/// The identity of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobKey {
    Pgid(u32),
    /// The subtree of process `pid` in process group `pgid`: a trial of a sweep.
    Proc {
        pgid: u32,
        pid: u32,
    },
    Sid(u32),
    Uid(u32),
    All,
}

impl std::fmt::Display for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobKey::Pgid(n) => write!(f, "pgid {n}"),
            JobKey::Proc { pgid, pid } => write!(f, "pgid {pgid} pid {pid}"),
            JobKey::Sid(n) => write!(f, "sid {n}"),
            JobKey::Uid(n) => write!(f, "uid {n}"),
            JobKey::All => write!(f, "all"),
        }
    }
}

/// The job of process `pid` (run by `uid`) under `kind`.
/// [`job_of`] where it can be told from the live process: None for a process that is gone
/// (where ids of the process are needed).
fn job_of_live(kind: JobKeyKind, pid: u32, uid: u32) -> Option<JobKey> {
    // SAFETY: getpgid reads another process's ids; no memory is involved.
    let alive = || unsafe { libc::getpgid(pid as libc::pid_t) } >= 0;
    match kind {
        JobKeyKind::Uid | JobKeyKind::None => Some(job_of(kind, pid, uid)),
        _ if alive() => Some(job_of(kind, pid, uid)),
        _ => None,
    }
}

pub fn job_of(kind: JobKeyKind, pid: u32, uid: u32) -> JobKey {
    // SAFETY: getpgid and getsid read another process's ids; no memory is involved.
    // They answer -1 when the process is gone; 0 is a real answer (a process in the
    // kernel's own session or group, as under some container runtimes and CI runners).
    let pgid = || unsafe { libc::getpgid(pid as libc::pid_t) };
    // SAFETY: as for getpgid.
    let sid = || unsafe { libc::getsid(pid as libc::pid_t) };
    match kind {
        JobKeyKind::Auto | JobKeyKind::Pgid => match pgid() {
            g if g >= 0 => JobKey::Pgid(g as u32),
            _ => match sid() {
                s if s >= 0 => JobKey::Sid(s as u32),
                _ => JobKey::Pgid(pid),
            },
        },
        JobKeyKind::Sid => match sid() {
            s if s >= 0 => JobKey::Sid(s as u32),
            _ => JobKey::Sid(pid),
        },
        JobKeyKind::Uid => JobKey::Uid(uid),
        JobKeyKind::None => JobKey::All,
    }
}

/// The order a job said it will read its files in.
///
/// One process's order, or the orders of several processes of the job joined into one: each
/// DataLoader worker of a WebDataset job, or each rank under torchrun, hands the order of its
/// own shards, and together they are the job's epoch ([`Job::set_hint`]).
#[derive(Clone, Debug, Default)]
pub struct Hint {
    /// File ids, in reading order.
    pub order: Arc<Vec<FileId>>,
    /// The same files as a set, one bit a file id up to the largest: which files the job
    /// reads, for a job that reads a shard of the dataset.
    pub files: Arc<FixedBitSet>,
    /// The job's epoch the order is for; None until the job starts it.
    pub epoch: Option<u64>,
    /// The hint memory the orders hold, given back when the hint goes.
    pub charges: Vec<Arc<HintCharge>>,
    /// The processes whose orders it holds.
    pub givers: Vec<u32>,
    /// [`order_digest`] of `order`.
    pub digest: u64,
}

impl Hint {
    fn new(order: Vec<FileId>, charge: HintCharge, pid: u32) -> Self {
        Hint {
            files: Arc::new(order_files(&order)),
            digest: order_digest(&order),
            order: Arc::new(order),
            epoch: None,
            charges: vec![Arc::new(charge)],
            givers: vec![pid],
        }
    }

    /// True if `order`, from process `pid`, is another part of this hint's epoch: another
    /// process's order, of none of its files.
    fn joins(&self, order: &[FileId], pid: u32) -> bool {
        !self.givers.contains(&pid) && !order.iter().any(|&f| self.files.contains(f as usize))
    }

    /// Takes `part` in: its files interleaved with those of the order from position `from`
    /// on (the prefetcher is past the ones before), as the processes read side by side.
    fn join(&mut self, part: Hint, from: usize) {
        let from = from.min(self.order.len());
        let mut order = self.order[..from].to_vec();
        order.extend(interleave(&self.order[from..], &part.order));
        let mut files = (*self.files).clone();
        files.union_with(&part.files);
        self.digest = order_digest(&order);
        self.order = Arc::new(order);
        self.files = Arc::new(files);
        self.charges.extend(part.charges);
        self.givers.extend(part.givers);
    }
}

/// `a` and `b` taken in turn, one from each, then the rest of the longer.
fn interleave(a: &[FileId], b: &[FileId]) -> Vec<FileId> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.iter(), b.iter());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return out,
            (x, y) => out.extend(x.into_iter().chain(y)),
        }
    }
}

/// The files of an order as a set ([`Hint::files`]).
fn order_files(order: &[FileId]) -> FixedBitSet {
    let mut files = FixedBitSet::with_capacity(order_files_bits(order));
    files.extend(order.iter().map(|&f| f as usize));
    files
}

/// The bits of [`order_files`]: one a file id up to the largest in `order`. The hint memory
/// an order holds is its ids and these bits.
pub fn order_files_bits(order: &[FileId]) -> usize {
    order.iter().max().map_or(0, |&f| f as usize + 1)
}

/// A hash of an order, the same in every run (FNV-1a over the file ids): jobs that hand the
/// mount the same order (a coordinated group, the same seed) have the same one.
pub fn order_digest(order: &[FileId]) -> u64 {
    order.iter().fold(0xcbf2_9ce4_8422_2325, |h, &f| {
        (h ^ u64::from(f)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Bytes of hint memory: every user's share of it, and the total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HintLimits {
    /// Bytes all users' hints may hold together.
    pub total: u64,
    /// Bytes one user's hints may hold.
    pub per_user: u64,
}

impl HintLimits {
    /// Limits of `total` bytes, half of it for any one user: two users can always hint at
    /// once, and no user can take it all.
    pub fn of_total(total: u64) -> Self {
        HintLimits {
            total,
            per_user: total / 2,
        }
    }
}

impl Default for HintLimits {
    /// 256 MiB: an ImageNet order (1.28 M paths of about 40 bytes) is about 50 MB while it
    /// is written and 5 MB once accepted, so several jobs of several users fit.
    fn default() -> Self {
        HintLimits::of_total(256 << 20)
    }
}

#[derive(Debug, Default)]
struct Usage {
    total: u64,
    by_user: HashMap<u32, u64>,
}

/// The memory that hints hold, per user and in total.
#[derive(Debug)]
pub struct HintBudget {
    limits: HintLimits,
    usage: Arc<Mutex<Usage>>,
}

/// Bytes of hint memory held by one user's hint; given back when dropped.
#[derive(Debug)]
pub struct HintCharge {
    usage: Arc<Mutex<Usage>>,
    limits: HintLimits,
    uid: u32,
    bytes: u64,
}

impl HintBudget {
    pub fn new(limits: HintLimits) -> Self {
        HintBudget {
            limits,
            usage: Default::default(),
        }
    }

    /// A charge of nothing yet, for `uid`.
    pub fn charge(&self, uid: u32) -> HintCharge {
        HintCharge {
            usage: self.usage.clone(),
            limits: self.limits,
            uid,
            bytes: 0,
        }
    }

    /// Bytes held by all hints now.
    pub fn used(&self) -> u64 {
        self.usage.lock().total
    }
}

impl HintCharge {
    /// Grows or shrinks the charge to `bytes`; false (and unchanged) if the user's share or
    /// the total would pass its limit.
    pub fn resize(&mut self, bytes: u64) -> bool {
        let mut usage = self.usage.lock();
        let mine = usage.by_user.get(&self.uid).copied().unwrap_or(0);
        let (mine, total) = (mine - self.bytes + bytes, usage.total - self.bytes + bytes);
        if bytes > self.bytes && (mine > self.limits.per_user || total > self.limits.total) {
            return false;
        }
        usage.total = total;
        if mine == 0 {
            usage.by_user.remove(&self.uid);
        } else {
            usage.by_user.insert(self.uid, mine);
        }
        self.bytes = bytes;
        true
    }
}

impl Drop for HintCharge {
    fn drop(&mut self) {
        self.resize(0);
    }
}

/// True if a job that has read `read` distinct files in its epoch, of a dataset of `total`,
/// reads the whole dataset every epoch as far as its reads show: one of its epochs read
/// (99% of) every file (`covered`), or this one read clearly more than half of them. A shard
/// of two ranks reads half, rounded up, and at the start of its next epoch it may read a few
/// files more (new ones) before its re-reads show that a new pass began: never
/// [`crate::epoch::SPAN`] of them.
pub fn reads_the_dataset(read: usize, total: usize, covered: bool) -> bool {
    covered || read > total.div_ceil(2) + crate::epoch::SPAN as usize
}

/// One job's state.
#[derive(Debug)]
pub struct Job {
    pub key: JobKey,
    pub log: EpochLog,
    /// Seconds since the mount of the last access.
    pub last_access: f64,
    /// The order hint of the current epoch, if the job gave one.
    pub hint: Option<Hint>,
    /// The order hint for the job's next epoch, handed while the current one is under way.
    pub next: Option<Hint>,
    /// Where the prefetcher is in the job's hint or in the on-disk order, this epoch.
    pub prefetch_cursor: usize,
    /// Where the job's hint is read up to, as far as the prefetcher's requests sent ahead
    /// know (`crate::prefetch`'s `send_ahead`): the files before it are read this epoch.
    pub send_cursor: usize,
    /// The hash of the last order the job gave ([`order_digest`]).
    pub order_digest: Option<u64>,
    /// Its last read of a big file's start came in large pieces: its next big misses are
    /// read with direct I/O (`crate::fs`'s `plan.rs`, `DaemonRead::DirectStream`).
    pub reads_large: bool,
}

impl Job {
    fn new(key: JobKey, now: f64) -> Self {
        Job {
            key,
            log: EpochLog::new(Boundary::Coverage),
            last_access: now,
            hint: None,
            next: None,
            prefetch_cursor: 0,
            send_cursor: 0,
            order_digest: None,
            reads_large: false,
        }
    }

    /// The job's current epoch.
    pub fn epoch(&self) -> u64 {
        self.log.tracker().epoch()
    }

    /// The active order of the current epoch, if the job gave one for it.
    pub fn active_order(&self) -> Option<Arc<Vec<FileId>>> {
        self.current_hint().map(|h| h.order.clone())
    }

    /// The digest of the order the job follows this epoch, if it gave one for it.
    pub fn following(&self) -> Option<u64> {
        self.current_hint().map(|h| h.digest)
    }

    fn current_hint(&self) -> Option<&Hint> {
        self.hint.as_ref().filter(|h| h.epoch == Some(self.epoch()))
    }

    /// Takes a new order from process `pid` of the job: another process's part of the
    /// current epoch's order (none of its files in it) joins it; else it is for the current
    /// epoch if the job has read nothing in it yet (and the epoch ends once its files were
    /// read), else for the next one, where parts from other processes join it likewise. The
    /// current order stays while other processes may still read by it; the next order of the
    /// one process that gave it ends it (a loop broken off: it reads the new order next).
    /// Returns the epoch it is for and whether it joined the orders of other processes.
    pub fn set_hint(&mut self, order: Vec<FileId>, charge: HintCharge, pid: u32) -> (u64, bool) {
        let part = Hint::new(order, charge, pid);
        let cursor = self.prefetch_cursor;
        let epoch = self.epoch();
        match (&mut self.hint, &mut self.next) {
            (Some(h), _) if h.epoch == Some(epoch) && h.joins(&part.order, pid) => {
                h.join(part, cursor);
                self.send_cursor = 0;
                self.order_digest = Some(h.digest);
                let files = h.files.clone();
                self.log.plan(Some(files));
                (epoch, true)
            }
            _ if self.log.tracker().files_in_epoch() == 0 => {
                self.order_digest = Some(part.digest);
                self.log.plan(Some(part.files.clone()));
                self.hint = Some(Hint {
                    epoch: Some(epoch),
                    ..part
                });
                self.next = None;
                self.prefetch_cursor = 0;
                self.send_cursor = 0;
                (epoch, false)
            }
            (_, Some(n)) if n.joins(&part.order, pid) => {
                n.join(part, 0);
                self.order_digest = Some(n.digest);
                (epoch + 1, true)
            }
            _ => {
                if self.hint.as_ref().is_some_and(|h| h.givers == [pid]) {
                    self.hint = None;
                }
                self.order_digest = Some(part.digest);
                self.next = Some(part);
                (epoch + 1, false)
            }
        }
    }

    /// The epoch that a block of `file` prefetched for epoch `fetched_for` belongs to, with a
    /// dataset of `total` files: `fetched_for` if that is the current epoch, or if it read the
    /// file after all (a read that joined the prefetch in flight, maybe the read that ended
    /// it); else the current epoch if the job reads the whole dataset (it will read the file
    /// in it).
    pub fn staging_epoch(&self, fetched_for: u64, file: FileId, total: usize) -> u64 {
        let t = self.log.tracker();
        let read_then = fetched_for + 1 == self.epoch() && t.read_in_last_epoch(file);
        if self.epoch() != fetched_for
            && !read_then
            && reads_the_dataset(t.last_epoch_files(), total, t.covered_dataset())
        {
            self.epoch()
        } else {
            fetched_for
        }
    }

    /// Called when the job's epoch changed: a waiting hint becomes the new epoch's (and says
    /// which files end it), and the prefetcher starts over.
    pub fn epoch_changed(&mut self) {
        let epoch = self.epoch();
        if let Some(next) = self.next.take() {
            self.hint = Some(Hint {
                epoch: Some(epoch),
                ..next
            });
        } else if self.hint.as_ref().is_some_and(|h| h.epoch < Some(epoch)) {
            // The order was for an epoch that is over.
            self.hint = None;
        }
        // The new epoch reads the files of its order.
        let files = self.current_hint().map(|h| h.files.clone());
        self.log.plan(files);
        self.prefetch_cursor = 0;
        self.send_cursor = 0;
    }
}

/// What `stats` shows of a job.
#[derive(Clone, Debug, Serialize)]
pub struct JobSummary {
    #[serde(skip)]
    pub key: JobKey,
    pub job: String,
    pub epoch: u64,
    /// Seconds since the job's last access.
    pub idle_seconds: f64,
    /// Files in the job's active order hint (0 without one).
    pub hint_files: u64,
    /// The hash (16 hex digits) of the last order the job gave, if any: jobs reading in the
    /// same order show the same.
    pub order_digest: Option<String>,
    /// Blocks the staging area keeps for the job: read for other jobs, not yet by this one.
    pub kept_blocks: u64,
    /// Bytes the prefetcher staged ahead for the job, now (filled in by the mount).
    pub staged_bytes: u64,
    /// False once the job was forgotten for being idle.
    pub active: bool,
    pub epochs: Vec<EpochRecord>,
}

/// How many forgotten jobs `stats` keeps showing.
const PAST_JOBS: usize = 16;

/// Live jobs of one user at most (a sweep of 32 trials); past it the user's catch-all job.
pub const MAX_USER_JOBS: usize = 32;
/// Live jobs of everybody at most.
pub const MAX_JOBS: usize = 128;

/// Each live job, with the user whose process began it.
type LiveJobs = HashMap<JobKey, (u32, Arc<Mutex<Job>>)>;

/// The jobs of a mount.
#[derive(Debug)]
pub struct Jobs {
    config: JobConfig,
    live: Mutex<LiveJobs>,
    past: Mutex<VecDeque<JobSummary>>,
    tree: tree::Tree,
    found: Arc<found::Found>,
}

impl Jobs {
    /// No jobs yet.
    pub fn new(config: JobConfig) -> Self {
        Jobs {
            config,
            live: Mutex::new(HashMap::new()),
            past: Mutex::new(VecDeque::new()),
            tree: tree::Tree::default(),
            found: Arc::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> JobConfig {
        self.config
    }

    /// The job of a caller, created on its first access (see the module header for the
    /// bounds).
    pub fn get(&self, pid: u32, uid: u32, now: f64) -> Arc<Mutex<Job>> {
        self.get_after(pid, uid, now, None)
    }

    /// [`Jobs::get`] for an open told after the fact (`crate::fs`'s `told/`): a process
    /// gone by then is placed by what was found of it or of its parents while they ran
    /// ([`found`]), its parents named by `forks` (see [`forks`]).
    pub fn get_after(
        &self,
        pid: u32,
        uid: u32,
        now: f64,
        forks: Option<&forks::Forks>,
    ) -> Arc<Mutex<Job>> {
        let mut at = pid;
        let parent = |at| forks.and_then(|f| f.parent(at));
        // A few generations: a worker of a job's process, forked by a shell.
        for _ in 0..4 {
            let live = match self.config.key {
                JobKeyKind::Auto => self.tree.job(&tree::ProcFs, at, now),
                kind => job_of_live(kind, at, uid),
            };
            if let Some(key) = live {
                if at == pid {
                    self.found.found(pid, key, || parent(pid));
                }
                return self.join(key, uid, now);
            }
            if let Some(key) = self.found.job(at) {
                return self.join(key, uid, now);
            }
            match parent(at) {
                Some(parent) => at = parent,
                None => break,
            }
        }
        self.join(job_of(self.config.key, pid, uid), uid, now)
    }

    /// What was found of processes, for [`forks::Forks::listen`].
    pub fn found(&self) -> Arc<found::Found> {
        self.found.clone()
    }

    /// Job `key`, begun by `uid` if it is new: the user's catch-all job if the user or
    /// everybody has as many live jobs as may be.
    fn join(&self, key: JobKey, uid: u32, now: f64) -> Arc<Mutex<Job>> {
        let mut live = self.live.lock();
        if let Some((_, job)) = live.get(&key) {
            return job.clone();
        }
        let key = match live.len() >= MAX_JOBS
            || live.values().filter(|(u, _)| *u == uid).count() >= MAX_USER_JOBS
        {
            true => JobKey::Uid(uid),
            false => key,
        };
        live.entry(key)
            .or_insert_with(|| (uid, Arc::new(Mutex::new(Job::new(key, now)))))
            .1
            .clone()
    }

    /// The live jobs with their keys.
    pub fn live_keyed(&self) -> Vec<(JobKey, Arc<Mutex<Job>>)> {
        self.live
            .lock()
            .iter()
            .map(|(k, (_, j))| (*k, j.clone()))
            .collect()
    }

    /// The live jobs.
    pub fn live(&self) -> Vec<Arc<Mutex<Job>>> {
        self.live.lock().values().map(|(_, j)| j.clone()).collect()
    }

    /// Forgets jobs idle for longer than the timeout; returns them.
    pub fn expire(&self, now: f64) -> Vec<Arc<Mutex<Job>>> {
        let timeout = self.config.idle_timeout.as_secs_f64();
        let mut gone = Vec::new();
        self.live.lock().retain(|_, (_, job)| {
            let idle = now - job.lock().last_access > timeout;
            if idle {
                gone.push(job.clone());
            }
            !idle
        });
        let mut past = self.past.lock();
        for job in &gone {
            past.push_back(summary(&job.lock(), now, false));
            if past.len() > PAST_JOBS {
                past.pop_front();
            }
        }
        gone
    }

    /// Every job, live first (by key), then the forgotten ones.
    pub fn summaries(&self, now: f64) -> Vec<JobSummary> {
        let mut live: Vec<_> = self
            .live()
            .iter()
            .map(|j| summary(&j.lock(), now, true))
            .collect();
        live.sort_by(|a, b| a.job.cmp(&b.job));
        live.extend(self.past.lock().iter().cloned());
        live
    }
}

fn summary(job: &Job, now: f64, active: bool) -> JobSummary {
    JobSummary {
        key: job.key,
        job: job.key.to_string(),
        epoch: job.epoch(),
        idle_seconds: (now - job.last_access).max(0.0),
        hint_files: job.active_order().map(|o| o.len() as u64).unwrap_or(0),
        order_digest: job.order_digest.map(|d| format!("{d:016x}")),
        kept_blocks: 0,
        staged_bytes: 0,
        active,
        epochs: job.log.records().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hint_memory_is_bounded_per_user_and_in_total_and_given_back() {
        let budget = HintBudget::new(HintLimits {
            total: 100,
            per_user: 60,
        });
        let mut a = budget.charge(1);
        assert!(a.resize(60));
        assert!(!a.resize(61), "past the user's share");
        let mut b = budget.charge(1);
        assert!(!b.resize(1), "the user's share is taken");
        let mut c = budget.charge(2);
        assert!(!c.resize(41), "past the total");
        assert!(c.resize(40));
        assert_eq!(budget.used(), 100);
        assert!(a.resize(10), "shrinking always works");
        drop(c);
        assert_eq!(budget.used(), 10);
        assert!(b.resize(50));
        drop(a);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn keys_follow_the_configured_kind() {
        let me = std::process::id();
        // SAFETY: reads our own process group and session.
        let (pgid, sid) = unsafe { (libc::getpgid(0) as u32, libc::getsid(0) as u32) };
        assert_eq!(job_of(JobKeyKind::Pgid, me, 5), JobKey::Pgid(pgid));
        assert_eq!(job_of(JobKeyKind::Sid, me, 5), JobKey::Sid(sid));
        assert_eq!(job_of(JobKeyKind::Uid, me, 5), JobKey::Uid(5));
        assert_eq!(job_of(JobKeyKind::None, me, 5), JobKey::All);
        // A process that does not exist falls back to its own pid.
        assert_eq!(
            job_of(JobKeyKind::Pgid, 0x7fff_fff0, 0),
            JobKey::Pgid(0x7fff_fff0)
        );
    }

    #[test]
    fn a_job_that_follows_an_order_will_read_the_files_in_it() {
        use crate::prefetch::plan::will_read;
        let budget = HintBudget::new(HintLimits::default());
        let total = 100;
        let read = |job: &mut Job, files: &[FileId]| {
            for &f in files {
                job.log.open(f, 1, false, 1, Some(total), 0.0);
            }
        };
        // A rank's shard: the even files, in its epoch 1; it read 0 and 2.
        let mut job = Job::new(JobKey::All, 0.0);
        job.set_hint((0..100).step_by(2).collect(), budget.charge(0), 1);
        read(&mut job, &[0, 2]);
        assert!(will_read(&job, 4, 1, total));
        assert!(!will_read(&job, 2, 1, total), "read already");
        assert!(!will_read(&job, 5, 1, total), "the other rank's");
        assert!(
            !will_read(&job, 5, 2, total),
            "a round behind, its next order is another shard: maybe, maybe not"
        );
        // Its next order, handed over before the last one was read to its end (a loop broken
        // off): what it reads next.
        job.set_hint(vec![3, 2, 1], budget.charge(0), 1);
        assert!(will_read(&job, 1, 1, total) && !will_read(&job, 4, 1, total));
        assert!(
            !will_read(&job, 2, 1, total),
            "read in this epoch, in the same round"
        );
        assert!(
            will_read(&job, 2, 2, total),
            "a round behind: it reads it next"
        );
        // An order of the whole dataset, a round behind: every file.
        let mut job = Job::new(JobKey::All, 0.0);
        job.set_hint((0..100).rev().collect(), budget.charge(0), 1);
        read(&mut job, &[99, 98]);
        assert!(will_read(&job, 98, 2, total) && !will_read(&job, 98, 1, total));
        // No order: a job well into an epoch, for the files it has not read.
        let mut job = Job::new(JobKey::All, 0.0);
        read(&mut job, &(0..40).collect::<Vec<_>>());
        assert!(will_read(&job, 50, 1, total) && !will_read(&job, 5, 1, total));
        // A glance at a big dataset needs nothing, even a round behind.
        let mut job = Job::new(JobKey::All, 0.0);
        job.log.open(1, 1, false, 1, Some(10_000), 0.0);
        assert!(!will_read(&job, 50, 1, 10_000) && !will_read(&job, 50, 2, 10_000));
    }

    #[test]
    fn a_hint_waits_for_the_next_epoch_once_reading_began() {
        let budget = HintBudget::new(HintLimits::default());
        let mut job = Job::new(JobKey::All, 0.0);
        // Orders of the whole dataset, told apart by their first file.
        let order =
            |first: FileId| -> Vec<FileId> { (0..100).map(|f| (f + first) % 100).collect() };
        job.set_hint(order(2), budget.charge(0), 1);
        assert_eq!(job.active_order().unwrap()[0], 2);
        // Epoch 1 read, then a new hint while epoch 2 has not begun.
        let total = Some(100);
        for f in 0..100 {
            job.log.open(f, 1, false, 1, total, 0.0);
        }
        job.epoch_changed();
        assert!(job.active_order().is_none(), "the epoch-1 order is over");
        // The second open of the last file belongs to epoch 1: epoch 2 has not begun.
        job.log.open(99, 1, false, 1, total, 0.0);
        job.set_hint(order(1), budget.charge(0), 1);
        assert_eq!(job.active_order().unwrap()[0], 1);
        // A hint in the middle of an epoch applies to the next one.
        for f in 0..50 {
            job.log.open(f, 2, false, 1, total, 0.0);
        }
        assert_eq!(job.set_hint(order(0), budget.charge(0), 1), (3, false));
        assert!(job.active_order().is_none(), "its one process moved on");
        for f in 50..100 {
            job.log.open(f, 2, false, 1, total, 0.0);
        }
        assert_eq!(job.epoch(), 3);
        job.epoch_changed();
        assert_eq!(job.active_order().unwrap()[0], 0);
    }

    #[test]
    fn interleave_takes_turns_then_the_rest() {
        assert_eq!(interleave(&[1, 3, 5, 7], &[2, 4]), vec![1, 2, 3, 4, 5, 7]);
        assert_eq!(interleave(&[], &[2, 4]), vec![2, 4]);
        assert_eq!(interleave(&[1], &[]), vec![1]);
    }

    #[test]
    fn orders_of_several_processes_of_a_job_join_into_its_epoch() {
        let budget = HintBudget::new(HintLimits::default());
        let mut job = Job::new(JobKey::All, 0.0);
        let total = Some(8);
        // Two workers, each with its own shards: the even and the odd files.
        assert_eq!(
            job.set_hint(vec![6, 0, 4, 2], budget.charge(0), 10),
            (1, false)
        );
        job.log.open(6, 10, false, 1, total, 0.0);
        job.prefetch_cursor = 2;
        // The second worker's order comes after the first read: it joins, after the cursor.
        assert_eq!(
            job.set_hint(vec![1, 7, 5, 3], budget.charge(0), 11),
            (1, true)
        );
        assert_eq!(*job.active_order().unwrap(), vec![6, 0, 4, 1, 2, 7, 5, 3]);
        assert_eq!(
            job.following(),
            Some(order_digest(&[6, 0, 4, 1, 2, 7, 5, 3]))
        );
        // A worker's next order is the next epoch's, and the current one stays; its partner's
        // joins it there.
        assert_eq!(
            job.set_hint(vec![2, 4, 0, 6], budget.charge(0), 10),
            (2, false)
        );
        assert_eq!(job.set_hint(vec![3, 5], budget.charge(0), 11), (2, true));
        assert_eq!(job.active_order().unwrap().len(), 8);
        // The epoch ends when both workers' files were read, not one's.
        for f in [0, 4, 2] {
            job.log.open(f, 10, false, 1, total, 0.0);
        }
        assert_eq!(job.epoch(), 1);
        for f in [1, 7, 5, 3] {
            job.log.open(f, 11, false, 1, total, 0.0);
        }
        assert_eq!(job.epoch(), 2);
        job.epoch_changed();
        assert_eq!(*job.active_order().unwrap(), vec![2, 3, 4, 5, 0, 6]);
        // Another process's order that shares files with the current one is not a part of it:
        // it waits for the next epoch.
        job.log.open(4, 10, false, 1, total, 100.0);
        assert_eq!(job.set_hint(vec![3, 2], budget.charge(0), 12), (3, false));
        assert_eq!(job.active_order().unwrap().len(), 6);
    }

    #[test]
    fn a_worker_gone_with_its_parent_is_placed_where_its_siblings_were_found() {
        // The last worker of a job's last epoch: its opens are counted after it and the
        // job's main process exited. Pids above the kernel's limit never run.
        let (init, trial, worker) = (1, 0x7fff_0001, 0x7fff_0002);
        let me = std::process::id();
        // SAFETY: reads our own process group.
        let group = JobKey::Pgid(unsafe { libc::getpgid(0) } as u32);
        for key in [JobKeyKind::Pgid, JobKeyKind::Auto] {
            let jobs = Jobs::new(JobConfig {
                key,
                ..JobConfig::default()
            });
            let forks = forks::Forks::new(jobs.found());
            forks.forked(trial, init);
            forks.forked(me, trial);
            // A sibling seen while it ran (this test's process, as a worker of `trial`).
            let mine = jobs.get_after(me, 0, 0.0, Some(&forks)).lock().key;
            if key == JobKeyKind::Pgid {
                assert_eq!(mine, group);
            }
            forks.forked(worker, trial);
            assert_eq!(
                jobs.get_after(worker, 0, 0.0, Some(&forks)).lock().key,
                mine,
                "{key:?}: placed through the living init, the job would be init's"
            );
            assert_eq!(jobs.live_keyed().len(), 1);
            // A new process of the trial's pid: what was found of the old one is forgotten.
            forks.forked(trial, init);
            forks.forked(worker + 1, trial);
            let other = jobs.get_after(worker + 1, 0, 0.0, Some(&forks)).lock().key;
            assert_ne!(other, mine, "{key:?}");
        }
    }

    #[test]
    fn idle_jobs_are_forgotten_but_summarised() {
        let jobs = Jobs::new(JobConfig {
            key: JobKeyKind::Uid,
            idle_timeout: Duration::from_secs(10),
        });
        jobs.get(1, 100, 0.0).lock().last_access = 0.0;
        jobs.get(1, 200, 5.0).lock().last_access = 5.0;
        assert_eq!(jobs.expire(12.0).len(), 1);
        let s = jobs.summaries(12.0);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].job.as_str(), s[0].active), ("uid 200", true));
        assert_eq!((s[1].job.as_str(), s[1].active), ("uid 100", false));
    }

    #[test]
    fn live_jobs_are_bounded_per_user_and_in_total() {
        let jobs = Jobs::new(JobConfig::default());
        for n in 0..MAX_USER_JOBS as u32 + 8 {
            jobs.join(JobKey::Pgid(n), 7, 0.0);
        }
        let keys = |uid| -> Vec<JobKey> {
            let mut k: Vec<_> = jobs
                .live
                .lock()
                .iter()
                .filter(|(_, (u, _))| *u == uid)
                .map(|(key, _)| *key)
                .collect();
            k.sort();
            k
        };
        let mine = keys(7);
        assert_eq!(mine.len(), MAX_USER_JOBS + 1);
        assert_eq!(mine.last(), Some(&JobKey::Uid(7)));
        // A job that exists is still found, and other users still get jobs of their own.
        assert_eq!(
            jobs.join(JobKey::Pgid(3), 7, 0.0).lock().key,
            JobKey::Pgid(3)
        );
        for uid in 100..100 + (MAX_JOBS / MAX_USER_JOBS) as u32 {
            for n in 0..MAX_USER_JOBS as u32 {
                jobs.join(JobKey::Sid(uid * 1000 + n), uid, 0.0);
            }
        }
        // Once everybody's bound is reached, each user has its catch-all job on top: 128
        // jobs (user 7's catch-all among them), then those of users 102 and 103.
        assert_eq!(jobs.live().len(), MAX_JOBS + 2);
        assert_eq!(keys(103), vec![JobKey::Uid(103)]);
        assert_eq!(
            jobs.join(JobKey::Pgid(999), 5, 0.0).lock().key,
            JobKey::Uid(5)
        );
    }
}
