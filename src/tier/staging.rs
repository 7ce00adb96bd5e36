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
//! ([`Staging::retag_before`]), but for those of a file the ended epoch read (the read under
//! way of the file whose open ended it takes them). Otherwise, or when the job stops reading,
//! they are dropped and counted as "prefetched but unused" ([`Staging::drop_before`]).
//!
//! Blocks are shared between jobs. A block read for one job that the cache did not keep
//! (a demand read, or a prefetched block its job took) stays, without an owner, for the jobs
//! that will still read its file this epoch, its *needers* ([`Staging::share`]; who they are is
//! the prefetcher's call). Each needer's open takes a copy and leaves the needers; the block
//! leaves with the last one, or when its needers stop ([`Staging::forget_needer`]). When room
//! is short, a shared block gives way to one that more jobs need, or as many jobs need sooner
//! (fewest needers first; then, for blocks read in an order, the latest in it, since the jobs
//! that follow the order read them in that order; then the oldest); blocks fetched ahead for
//! a job are never pushed out. So one read of the source serves every job that reads the file
//! in the same round, within the one budget, and a member of a group that lags further
//! behind than the staging area holds reads from the source only what the others read last.
//!
//! A block needed by no other job yet, read by a job that follows an order hint, stays as a
//! *spare* while there is free room: the members of a coordinated group (one order) start
//! seconds apart, and a member that hints the order late takes the spares read in it
//! ([`Staging::join`]) instead of reading the source again. Spares are the first to give way,
//! to a prefetch or to a block a job needs, and leave when the job that read them stops.
//!
//! As a tier ([`Tier`]) it serves a reader of the job that staged a block (the claim, when a
//! prefetch landed after the open), keeps only prefetched blocks, and forgets a block a
//! reader of its job got another way (a read that joined the prefetch in flight).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{DataError, Found, Tier, Want, Why};
use crate::block::{Block, BlockSize};
use crate::cache::BlockKey;
use crate::jobs::JobKey;
use crate::namespace::{FileId, FileVersion};

#[derive(Debug)]
struct Staged {
    data: Arc<Block>,
    /// The job it was fetched ahead for, until that job takes it; None for a block kept
    /// only for the jobs that still need it.
    owner: Option<JobKey>,
    epoch: u64,
    /// Its file, when the prefetcher staged it ([`Staging::put`]).
    file: Option<FileId>,
    /// Other jobs that have not read the file in their current epoch.
    needers: Vec<JobKey>,
    /// When it was staged: of two shared blocks needed by as many jobs, the older goes first.
    seq: u64,
    /// Read by a job that follows an order: the job, and the order's digest. Jobs that join
    /// the order later need it too ([`Staging::join`]); with no owner and no needers it is a
    /// *spare*, kept for them while there is room, the first to give way.
    order: Option<(JobKey, u64)>,
    /// When the jobs that need it will read it, if their order says ([`Due`]).
    due: Due,
}

/// When a shared block will be read by the jobs that need it, as far as their orders say: its
/// position in the order it was read in, counted across epochs, or [`UNKNOWN`] without an
/// order. Room goes to the blocks needed soonest: the members of a group read one order, so the
/// block a lagging member reads next is the one read earliest in it.
pub type Due = u64;
/// The [`Due`] of a block no order places: it gives way first among those as many jobs need.
pub const UNKNOWN: Due = Due::MAX;

/// Where a shared block stands in the queue to give up room: the first goes first. Fewest
/// needers first, then the one needed latest, then the oldest.
type Rank = (usize, std::cmp::Reverse<Due>, u64, BlockKey);

impl Staged {
    /// Its place among the shared blocks (see [`Rank`]).
    fn rank(&self, key: BlockKey) -> Rank {
        (
            self.needers.len(),
            std::cmp::Reverse(self.due),
            self.seq,
            key,
        )
    }

    /// The job that read it, if it is a spare.
    fn spare_of(&self) -> Option<JobKey> {
        match self.order {
            Some((reader, _)) if self.owner.is_none() && self.needers.is_empty() => Some(reader),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    blocks: HashMap<BlockKey, Staged>,
    /// Bytes staged or reserved for fetches in flight.
    bytes: u64,
    /// Bytes staged (the memory the blocks take), per owner.
    per_job: HashMap<JobKey, u64>,
    /// Blocks each job is among the needers of.
    needed_by: HashMap<JobKey, u64>,
    /// Blocks read in an order, per job that read them.
    read_in_order: HashMap<JobKey, u64>,
    /// The jobs that joined each order ([`Staging::join`]), with the join's number, until
    /// their epoch turns: a block read in that order by a reader that looked for needers before
    /// they joined is theirs too ([`Staging::share`]'s `since`).
    joined: HashMap<u64, Vec<(JobKey, u64)>>,
    /// The blocks without an owner, by [`Rank`]: the first is the one to give up when room is
    /// short.
    shared: BTreeSet<Rank>,
    seq: u64,
}

/// Adds `delta` to `job`'s count in `counts`, forgetting a count of 0.
fn count(counts: &mut HashMap<JobKey, u64>, job: JobKey, delta: i64) {
    let n = counts.entry(job).or_default();
    *n = n.saturating_add_signed(delta);
    if *n == 0 {
        counts.remove(&job);
    }
}

impl Inner {
    /// Stages a new block (its bytes are reserved already).
    fn insert(&mut self, key: BlockKey, mut staged: Staged) {
        self.seq += 1;
        staged.seq = self.seq;
        if let Some(old) = self.detach(key) {
            self.bytes -= old.data.footprint().min(self.bytes);
        }
        self.attach(key, staged);
    }

    /// Enters a block and its books: its owner's count, or the shared index; its needers.
    fn attach(&mut self, key: BlockKey, s: Staged) {
        match s.owner {
            Some(job) => count(&mut self.per_job, job, s.data.footprint() as i64),
            None => {
                self.shared.insert(s.rank(key));
            }
        }
        for &n in &s.needers {
            count(&mut self.needed_by, n, 1);
        }
        if let Some((reader, _)) = s.order {
            count(&mut self.read_in_order, reader, 1);
        }
        self.blocks.insert(key, s);
    }

    /// Takes a block and its books out (not its bytes).
    fn detach(&mut self, key: BlockKey) -> Option<Staged> {
        let s = self.blocks.remove(&key)?;
        match s.owner {
            Some(job) => count(&mut self.per_job, job, -(s.data.footprint() as i64)),
            None => {
                self.shared.remove(&s.rank(key));
            }
        }
        for &n in &s.needers {
            count(&mut self.needed_by, n, -1);
        }
        if let Some((reader, _)) = s.order {
            count(&mut self.read_in_order, reader, -1);
        }
        Some(s)
    }

    /// Drops a block and gives back its bytes.
    fn remove(&mut self, key: &BlockKey) -> Option<Staged> {
        let s = self.detach(*key)?;
        self.bytes -= s.data.footprint().min(self.bytes);
        Some(s)
    }

    /// Re-enters a block changed by `change`, or drops it if then nobody owns or needs it
    /// and it is no spare.
    fn update(&mut self, key: BlockKey, change: impl FnOnce(&mut Staged)) {
        let Some(mut s) = self.detach(key) else {
            return;
        };
        change(&mut s);
        if s.owner.is_none() && s.needers.is_empty() && s.order.is_none() {
            self.bytes -= s.data.footprint().min(self.bytes);
        } else {
            self.attach(key, s);
        }
    }

    /// `job` got block `key` (a copy, or the block itself if it owned it): it needs it no
    /// more. A block that nobody owns or needs then leaves; one its owner took stays, without
    /// an owner, for the jobs that still need it.
    fn served(&mut self, key: BlockKey, job: JobKey) {
        self.update(key, |s| {
            if s.owner == Some(job) {
                s.owner = None;
            }
            s.needers.retain(|&n| n != job);
        });
    }

    /// See [`Staging::claim`]; `blocks` is the file's block count.
    fn claim(&mut self, version: &FileVersion, blocks: u64, job: JobKey) -> Claimed {
        let mut out = Claimed::default();
        for block in 0..blocks {
            let key = BlockKey {
                version: *version,
                block,
            };
            let Some(s) = self.blocks.get(&key) else {
                continue;
            };
            // A spare waits for other jobs: its own reader reads the file as it would without
            // it (a spare is no cache for the job that read it).
            if s.spare_of() == Some(job) {
                continue;
            }
            out.shared |= s.owner != Some(job);
            out.blocks.push((block, s.data.clone()));
            self.served(key, job);
        }
        out
    }

    /// Takes `job` out of the needers of every block (if `needers`) and of the orders it
    /// joined, and forgets the order of the blocks it read in one: its spares leave, and
    /// later joiners no longer need the others.
    fn release(&mut self, job: JobKey, needers: bool) {
        self.joined.retain(|_, jobs| {
            jobs.retain(|&(j, _)| j != job);
            !jobs.is_empty()
        });
        let needs = needers && self.needed_by.contains_key(&job);
        if !needs && !self.read_in_order.contains_key(&job) {
            return;
        }
        let kept_by = |s: &Staged| s.order.is_some_and(|(reader, _)| reader == job);
        let keys: Vec<BlockKey> = self
            .blocks
            .iter()
            .filter(|(_, s)| (needs && s.needers.contains(&job)) || kept_by(s))
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            self.update(key, |s| {
                if needs {
                    s.needers.retain(|&n| n != job);
                }
                if kept_by(s) {
                    s.order = None;
                }
            });
        }
    }

    /// Gives up shared blocks that fewer than `needers` jobs need, or as many but later than
    /// `due`, in [`Rank`] order, until `len` more bytes fit in `capacity`. True if they fit.
    fn make_room(&mut self, len: u64, needers: usize, due: Due, capacity: u64) -> bool {
        while self.bytes + len > capacity {
            let Some(&(n, std::cmp::Reverse(d), _, key)) = self.shared.first() else {
                return false;
            };
            if (n, std::cmp::Reverse(d)) >= (needers, std::cmp::Reverse(due)) {
                return false;
            }
            self.remove(&key);
        }
        true
    }
}

/// What an open took from the staging area.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The blocks, by block number.
    pub blocks: Vec<(u64, Arc<Block>)>,
    /// Some were fetched for another job.
    pub shared: bool,
}

/// Blocks fetched ahead of their readers.
#[derive(Debug)]
pub struct Staging {
    /// The budget, bytes: set at mount, lowered and raised again by an elastic cache budget
    /// ([`Staging::resize`]).
    capacity: AtomicU64,
    blocks: BlockSize,
    inner: Mutex<Inner>,
    /// Joins so far ([`Staging::join`]): read without the lock on every share.
    joins: AtomicU64,
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
            capacity: AtomicU64::new(capacity),
            blocks,
            inner: Mutex::new(Inner::default()),
            joins: AtomicU64::new(0),
        }
    }

    /// Reserves `len` bytes for a prefetch, if there is room (spares give way).
    pub fn reserve(&self, len: u64) -> bool {
        let mut inner = self.inner.lock();
        if !inner.make_room(len, 1, UNKNOWN, self.capacity()) {
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

    /// Stores a fetched block (of `file`, if known) under its reservation, for `job`'s epoch
    /// `epoch`. If the block was staged meanwhile (another job's read kept it for the jobs that
    /// need it), the jobs that needed or owned it still need it.
    pub fn put(
        &self,
        key: BlockKey,
        data: Arc<Block>,
        job: JobKey,
        epoch: u64,
        file: Option<FileId>,
    ) {
        let mut inner = self.inner.lock();
        let (mut needers, order, due) = match inner.blocks.get(&key) {
            Some(old) => {
                let mut needers = old.needers.clone();
                needers.extend(old.owner.filter(|o| !needers.contains(o)));
                (needers, old.order, old.due)
            }
            None => (Vec::new(), None, UNKNOWN),
        };
        needers.retain(|&n| n != job);
        inner.insert(
            key,
            Staged {
                data,
                owner: Some(job),
                epoch,
                file,
                needers,
                seq: 0,
                order,
                due,
            },
        );
    }

    /// The bytes of block `key` if it is staged, for whomever.
    pub fn peek(&self, key: &BlockKey) -> Option<Arc<Block>> {
        self.inner.lock().blocks.get(key).map(|s| s.data.clone())
    }

    /// Keeps a block that one job read, and the cache did not keep, for the `needers`: other
    /// jobs that have not read its file in their current epoch. Room is made by giving up
    /// shared blocks fewer jobs need; true if it was kept. A block staged already gains the
    /// needers (its owner keeps it). A block read by a job that follows an order (`order`:
    /// the job and the order's digest) is needed by the jobs that joined that order after
    /// join number `since` ([`Staging::joins`], read before the needers were looked for), and
    /// with no needers yet it is kept as a spare if there is free room (a spare pushes nothing
    /// out), for jobs that join the order late ([`Staging::join`]). `due` places it among the
    /// blocks as many jobs need when room is short ([`Due`]).
    pub fn share(
        &self,
        key: BlockKey,
        data: &Arc<Block>,
        mut needers: Vec<JobKey>,
        order: Option<(JobKey, u64)>,
        since: u64,
        due: Due,
    ) -> bool {
        let mut inner = self.inner.lock();
        if let Some((reader, digest)) = order
            && let Some(joined) = inner.joined.get(&digest)
        {
            for &(j, at) in joined {
                if at > since && j != reader && !needers.contains(&j) {
                    needers.push(j);
                }
            }
        }
        if needers.is_empty() && order.is_none() {
            return false;
        }
        if inner.blocks.contains_key(&key) {
            inner.update(key, |s| {
                for n in needers {
                    if !s.needers.contains(&n) && s.owner != Some(n) {
                        s.needers.push(n);
                    }
                }
                s.order = s.order.or(order);
                s.due = s.due.min(due);
            });
            return true;
        }
        let len = data.footprint();
        if !inner.make_room(len, needers.len(), due, self.capacity()) {
            return false;
        }
        inner.bytes += len;
        inner.insert(
            key,
            Staged {
                data: data.clone(),
                owner: None,
                epoch: 0,
                file: None,
                needers,
                seq: 0,
                order,
                due,
            },
        );
        true
    }

    /// `job` starts an epoch in the order of digest `order` (it has read none of its files
    /// yet): the blocks read in that order by other jobs, spares or kept for others, are now
    /// needed by it too, and so are those read in it later. Returns how many there were.
    pub fn join(&self, order: u64, job: JobKey) -> u64 {
        let mut inner = self.inner.lock();
        // Numbered under the lock, so that a share that reads the joined lists sees this join
        // if it counted it.
        let at = self.joins.fetch_add(1, Ordering::SeqCst) + 1;
        let joined = inner.joined.entry(order).or_default();
        joined.retain(|&(j, _)| j != job);
        joined.push((job, at));
        let keys: Vec<BlockKey> = inner
            .blocks
            .iter()
            .filter(|(_, s)| {
                s.order
                    .is_some_and(|(reader, d)| d == order && reader != job)
                    && s.owner != Some(job)
                    && !s.needers.contains(&job)
            })
            .map(|(k, _)| *k)
            .collect();
        for &key in &keys {
            inner.update(key, |s| s.needers.push(job));
        }
        keys.len() as u64
    }

    /// The number of joins so far ([`Staging::join`]).
    pub fn joins(&self) -> u64 {
        self.joins.load(Ordering::SeqCst)
    }

    /// `job` will not read what it was kept for (it stopped, or reads no whole epochs): it
    /// is no longer among any block's needers, shared blocks nobody else needs leave, and so
    /// do the spares it read (a job that joins its order later would be far behind).
    pub fn forget_needer(&self, job: JobKey) {
        self.inner.lock().release(job, true);
    }

    /// `job`'s epoch turned: the spares it read in the last one's order leave (a job that
    /// hints that order now would be an epoch behind), and it follows that order no more.
    pub fn drop_spares(&self, job: JobKey) {
        self.inner.lock().release(job, false);
    }

    /// Blocks `job` is among the needers of.
    pub fn needed_by(&self, job: JobKey) -> u64 {
        self.inner.lock().needed_by.get(&job).copied().unwrap_or(0)
    }

    /// The staged blocks of `version` are needed by `job` too: it will read the file this
    /// epoch, and its prefetcher found them staged for others (kept for other jobs, or a
    /// spare of another job's order). They stay until `job` reads them or stops, instead of
    /// leaving with the others' needs while `job` counts on them. Returns true if every block
    /// of the file is staged and held for `job` now (the prefetcher need not fetch it).
    pub fn adopt(&self, version: &FileVersion, job: JobKey) -> bool {
        let mut inner = self.inner.lock();
        let mut held = true;
        for block in 0..self.blocks.count(version.size) {
            let key = BlockKey {
                version: *version,
                block,
            };
            let Some(s) = inner.blocks.get(&key) else {
                held = false;
                continue;
            };
            if s.spare_of() == Some(job) {
                // Its own spare is not for the job that read it (see claim).
                held = false;
            } else if s.owner != Some(job) && !s.needers.contains(&job) {
                inner.update(key, |s| s.needers.push(job));
            }
        }
        held
    }

    /// True if `key` is staged.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.inner.lock().blocks.contains_key(key)
    }

    /// The staged blocks of `version` for an open by `job`, by block number: those `job`
    /// staged leave the staging area with it unless other jobs still need them; of the
    /// others `job` gets a copy, and a shared block leaves once no job needs it.
    pub fn claim(&self, version: &FileVersion, job: JobKey) -> Claimed {
        self.inner
            .lock()
            .claim(version, self.blocks.count(version.size), job)
    }

    /// Drops `key` if `job` staged it (its reader got the bytes another way).
    pub fn discard(&self, key: &BlockKey, job: JobKey) {
        let mut inner = self.inner.lock();
        if inner.blocks.get(key).is_some_and(|s| s.owner == Some(job)) {
            inner.served(*key, job);
        }
    }

    /// Applies `each` to every block of `job` staged for an epoch before `epoch`, under the
    /// lock, and returns those for which it returned true, tallied by the epoch they were
    /// staged for.
    fn each_stale(
        &self,
        job: JobKey,
        epoch: u64,
        mut each: impl FnMut(&mut Inner, BlockKey) -> bool,
    ) -> HashMap<u64, Dropped> {
        let mut inner = self.inner.lock();
        let mut tally: HashMap<u64, Dropped> = HashMap::new();
        if !inner.per_job.contains_key(&job) {
            return tally;
        }
        let stale: Vec<(BlockKey, u64, u64, u64)> = inner
            .blocks
            .iter()
            .filter(|(_, s)| s.owner == Some(job) && s.epoch < epoch)
            .map(|(k, s)| (*k, s.epoch, s.data.footprint(), s.data.len() as u64))
            .collect();
        let mut files = std::collections::HashSet::new();
        for (key, at, footprint, len) in stale {
            if !each(&mut inner, key) {
                continue;
            }
            let d = tally.entry(at).or_default();
            d.blocks += 1;
            d.bytes += footprint;
            d.read += len;
            if files.insert((at, key.version)) {
                d.files += 1;
            }
        }
        tally
    }

    /// Drops what `job` staged for epochs before `epoch`, and returns it, by epoch. A block
    /// other jobs still need stays for them, and is not counted.
    pub fn drop_before(&self, job: JobKey, epoch: u64) -> HashMap<u64, Dropped> {
        self.each_stale(job, epoch, |inner, key| {
            let needed = inner
                .blocks
                .get(&key)
                .is_some_and(|s| !s.needers.is_empty());
            inner.served(key, job);
            !needed
        })
    }

    /// Moves what `job` staged for epochs before `epoch` to `epoch`, but for the blocks of a
    /// file `f` staged for an epoch `e` that `stays(e, f)` (the job read the file in that
    /// epoch: a read of it under way takes them), and returns what moved, by the epoch it was
    /// staged for.
    pub fn retag_before(
        &self,
        job: JobKey,
        epoch: u64,
        stays: impl Fn(u64, FileId) -> bool,
    ) -> HashMap<u64, Dropped> {
        self.each_stale(job, epoch, |inner, key| {
            let Some(s) = inner.blocks.get_mut(&key) else {
                return false;
            };
            if s.file.is_some_and(|f| stays(s.epoch, f)) {
                return false;
            }
            s.epoch = epoch;
            true
        })
    }

    /// The memory of the blocks `job` has staged and not taken yet (not those kept for it).
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
        self.capacity.load(Ordering::Relaxed)
    }

    /// From now on the staging area may hold `capacity` bytes. Shared blocks and spares give
    /// way at once (in [`Rank`] order) until what it holds fits; blocks fetched ahead for a
    /// job stay until their job takes them or its epoch ends. Returns the bytes given up.
    pub fn resize(&self, capacity: u64) -> u64 {
        self.capacity.store(capacity, Ordering::Relaxed);
        let mut inner = self.inner.lock();
        let before = inner.bytes;
        inner.make_room(0, usize::MAX, 0, capacity);
        before - inner.bytes
    }
}

impl Tier for Staging {
    fn name(&self) -> &'static str {
        "staging"
    }

    fn get(&self, want: &Want<'_>) -> Result<Option<Found<'_>>, DataError> {
        let mut inner = self.inner.lock();
        if !inner.blocks.contains_key(&want.key) {
            return Ok(None);
        }
        let version = want.key.version;
        let claimed = inner.claim(&version, self.blocks.count(version.size), want.job);
        if claimed.blocks.is_empty() {
            return Ok(None); // only the job's own spares
        }
        Ok(Some(Found::File(claimed.blocks)))
    }

    fn admit(&self, want: &Want<'_>, data: &Arc<Block>) -> bool {
        if want.why != Why::Prefetch {
            return false;
        }
        self.put(want.key, data.clone(), want.job, want.epoch, None);
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
        s.put(key(1, 0), block(0), JobKey::All, 1, None);
        s.unreserve(P);
        assert!(s.reserve(P));
        assert_eq!(s.bytes(), 2 * P);
    }

    #[test]
    fn a_smaller_budget_sheds_shared_blocks_and_keeps_those_fetched_for_a_job() {
        let s = Staging::new(10 * P, BLOCKS);
        let (a, b) = (JobKey::Pgid(1), JobKey::Pgid(2));
        assert!(s.reserve(P));
        s.put(key(1, 0), block(1), a, 1, None);
        assert!(s.share(key(2, 0), &block(2), vec![b], None, 0, UNKNOWN));
        assert!(s.share(key(3, 0), &block(3), vec![a, b], None, 0, UNKNOWN));
        assert_eq!(s.bytes(), 3 * P);
        // The block fewer jobs need goes first; a's prefetch stays over the budget.
        assert_eq!(s.resize(2 * P), P);
        assert!(!s.contains(&key(2, 0)) && s.contains(&key(3, 0)));
        assert_eq!(s.resize(0), P);
        assert!(s.contains(&key(1, 0)) && s.bytes() == P);
        assert!(!s.reserve(P), "no room for a new prefetch");
        assert_eq!(s.claim(&key(1, 0).version, a).blocks.len(), 1);
        // Grown again, it takes prefetches.
        assert_eq!(s.resize(2 * P), 0);
        assert_eq!(s.capacity(), 2 * P);
        assert!(s.reserve(P) && s.reserve(P) && !s.reserve(P));
    }

    #[test]
    fn claims_take_own_blocks_and_share_others() {
        let s = Staging::new(10 * P, BLOCKS);
        let (a, b) = (JobKey::Pgid(1), JobKey::Pgid(2));
        for (k, job) in [(key(1, 0), a), (key(1, 1), a), (key(2, 0), b)] {
            assert!(s.reserve(P));
            s.put(k, block(k.block as u8), job, 1, None);
        }
        let got = s.claim(&key(1, 0).version, a);
        assert_eq!(
            got.blocks.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert!(!got.shared);
        assert_eq!(s.bytes(), P);
        let shared = s.claim(&key(2, 0).version, a);
        assert_eq!((shared.blocks.len(), shared.shared), (1, true));
        assert!(s.contains(&key(2, 0)), "job a must not take job b's block");
        s.discard(&key(2, 0), a);
        assert!(s.contains(&key(2, 0)));
        s.discard(&key(2, 0), b);
        assert_eq!((s.blocks(), s.bytes()), (0, 0));
    }

    #[test]
    fn a_block_read_for_one_job_stays_until_every_job_that_needs_it_took_it() {
        let s = Staging::new(10 * P, BLOCKS);
        let (a, b, c) = (JobKey::Pgid(1), JobKey::Pgid(2), JobKey::Pgid(3));
        // Read by a (not staged for it), needed by b and c.
        assert!(s.share(key(1, 0), &block(1), vec![b, c], None, 0, UNKNOWN));
        assert_eq!((s.needed_by(b), s.needed_by(c), s.bytes()), (1, 1, P));
        let got = s.claim(&key(1, 0).version, b);
        assert_eq!((got.blocks.len(), got.shared), (1, true));
        assert!(s.contains(&key(1, 0)), "c still needs it");
        assert_eq!(
            s.claim(&key(1, 0).version, a).blocks.len(),
            1,
            "a copy for anyone"
        );
        assert!(s.contains(&key(1, 0)));
        s.claim(&key(1, 0).version, c);
        assert_eq!((s.blocks(), s.bytes(), s.needed_by(c)), (0, 0, 0));
        // Prefetched for a and needed by b: a takes it, and it stays for b.
        assert!(s.reserve(P));
        s.put(key(2, 0), block(2), a, 1, None);
        assert!(s.share(key(2, 0), &block(2), vec![b, a], None, 0, UNKNOWN));
        assert_eq!(s.bytes(), P, "shared again, not copied");
        assert!(!s.claim(&key(2, 0).version, a).shared);
        assert_eq!((s.held_by(a), s.needed_by(b), s.blocks()), (0, 1, 1));
        // b stops: nobody needs it any more.
        s.forget_needer(b);
        assert_eq!((s.blocks(), s.bytes(), s.needed_by(b)), (0, 0, 0));
    }

    #[test]
    fn a_prefetch_that_lands_on_a_block_kept_for_others_keeps_them() {
        let s = Staging::new(10 * P, BLOCKS);
        let (a, b, c) = (JobKey::Pgid(1), JobKey::Pgid(2), JobKey::Pgid(3));
        // c's read kept the block for a and b while a's prefetch of it was being issued.
        assert!(s.share(key(1, 0), &block(1), vec![a, b], Some((c, 9)), 0, UNKNOWN));
        assert!(s.reserve(P));
        s.put(key(1, 0), block(1), a, 1, None);
        assert_eq!(s.bytes(), P, "one copy");
        assert_eq!((s.held_by(a), s.needed_by(a), s.needed_by(b)), (P, 0, 1));
        // a takes it, and it stays for b (and as c's spare after that).
        assert!(!s.claim(&key(1, 0).version, a).shared);
        assert!(s.claim(&key(1, 0).version, b).shared);
        assert_eq!((s.needed_by(b), s.blocks()), (0, 1));
        // Another job's prefetch owned it: that job needs it still.
        assert!(s.reserve(P));
        s.put(key(2, 0), block(2), b, 1, None);
        assert!(s.reserve(P));
        s.put(key(2, 0), block(2), a, 1, None);
        assert_eq!((s.held_by(a), s.held_by(b), s.needed_by(b)), (P, 0, 1));
        assert_eq!(s.peek(&key(2, 0)).map(|d| d[0]), Some(2));
    }

    #[test]
    fn room_goes_to_the_blocks_more_jobs_need() {
        let s = Staging::new(3 * P, BLOCKS);
        let jobs: Vec<JobKey> = (1..=4).map(JobKey::Pgid).collect();
        assert!(s.share(key(1, 0), &block(1), jobs[..1].to_vec(), None, 0, UNKNOWN));
        assert!(s.share(key(2, 0), &block(2), jobs[..3].to_vec(), None, 0, UNKNOWN));
        assert!(s.share(key(3, 0), &block(3), jobs[..2].to_vec(), None, 0, UNKNOWN));
        // Full: a block two jobs need pushes out the one one job needs, not the others.
        assert!(s.share(key(4, 0), &block(4), jobs[..2].to_vec(), None, 0, UNKNOWN));
        assert!(!s.contains(&key(1, 0)));
        assert!(s.contains(&key(2, 0)) && s.contains(&key(3, 0)));
        // One needed by two is not worth one needed by two (the older stays) or by three.
        assert!(!s.share(key(5, 0), &block(5), jobs[..2].to_vec(), None, 0, UNKNOWN));
        // Blocks staged ahead of their job are never pushed out.
        s.claim(&key(3, 0).version, jobs[0]);
        s.claim(&key(3, 0).version, jobs[1]);
        assert!(s.reserve(P));
        s.put(key(6, 0), block(6), jobs[3], 1, None);
        assert!(s.share(key(7, 0), &block(7), jobs.clone(), None, 0, UNKNOWN));
        assert!(
            !s.contains(&key(4, 0)),
            "needed by two, given up for one needed by four"
        );
        assert!(s.contains(&key(6, 0)) && s.contains(&key(2, 0)));
        // A prefetch pushes nothing out.
        assert!(!s.reserve(P), "key 2 (three jobs) and key 7 (four) stay");
        assert!(s.share(key(8, 0), &block(8), jobs.clone(), None, 0, UNKNOWN));
        assert!(!s.contains(&key(2, 0)));
        assert!(
            !s.share(key(9, 0), &block(9), jobs.clone(), None, 0, UNKNOWN),
            "nothing needed less is left"
        );
        assert_eq!(s.bytes(), 3 * P);
    }

    #[test]
    fn of_blocks_as_many_jobs_need_the_one_needed_latest_gives_way() {
        let s = Staging::new(3 * P, BLOCKS);
        let (a, b, c) = (JobKey::Pgid(1), JobKey::Pgid(2), JobKey::Pgid(3));
        let order = Some((a, 7));
        // a leads a group in one order; b and c lag. Read at positions 10, 30 and 20.
        assert!(s.share(key(1, 0), &block(1), vec![b, c], order, 0, 10));
        assert!(s.share(key(2, 0), &block(2), vec![b, c], order, 0, 30));
        assert!(s.share(key(3, 0), &block(3), vec![b, c], order, 0, 20));
        // Full. Read at 40, needed after all three: not kept, nothing pushed out.
        assert!(!s.share(key(4, 0), &block(4), vec![b, c], order, 0, 40));
        assert!((1..=3).all(|k| s.contains(&key(k, 0))));
        // Read at 15 (a member that was ahead read it late): the one at 30 gives way.
        assert!(s.share(key(5, 0), &block(5), vec![b, c], order, 0, 15));
        assert!(!s.contains(&key(2, 0)));
        // A block no order places gives way before them, and takes the place of none.
        assert!(!s.share(key(6, 0), &block(6), vec![b, c], None, 0, UNKNOWN));
        // One that more jobs need takes room whatever its place: the one at 20 goes.
        assert!(s.share(key(7, 0), &block(7), vec![a, b, c], None, 0, UNKNOWN));
        assert!(!s.contains(&key(3, 0)));
        assert!(s.contains(&key(1, 0)) && s.contains(&key(5, 0)));
        // A claim leaves the needers: the block at 10, now needed by c alone, goes first.
        s.claim(&key(1, 0).version, b);
        assert!(s.share(key(8, 0), &block(8), vec![b, c], order, 0, 50));
        assert!(!s.contains(&key(1, 0)) && s.contains(&key(5, 0)));
    }

    #[test]
    fn spares_wait_for_jobs_that_join_the_order_and_give_way_first() {
        let s = Staging::new(4 * P, BLOCKS);
        let (a, b, c) = (JobKey::Pgid(1), JobKey::Pgid(2), JobKey::Pgid(3));
        let (order, other) = (7, 8);
        assert!(
            !s.share(key(1, 0), &block(1), vec![], None, 0, UNKNOWN),
            "no order, no needer"
        );
        // Read by a in order 7, needed by nobody yet: spares, for others than a.
        assert!(s.share(key(1, 0), &block(1), vec![], Some((a, order)), 0, UNKNOWN));
        assert!(s.share(key(2, 0), &block(2), vec![], Some((a, order)), 0, UNKNOWN));
        assert_eq!((s.blocks(), s.needed_by(b)), (2, 0));
        assert!(s.claim(&key(1, 0).version, a).blocks.is_empty());
        // b joins another order, then a's: the blocks read in order 7 are b's to read.
        assert_eq!(s.join(other, b), 0);
        assert_eq!(s.join(order, b), 2);
        assert_eq!(s.needed_by(b), 2);
        let got = s.claim(&key(1, 0).version, b);
        assert_eq!((got.blocks.len(), got.shared), (1, true));
        assert_eq!(s.needed_by(b), 1);
        assert!(s.contains(&key(1, 0)), "a spare again, for later joiners");
        // Read in order 7 by a, which looked for needers before b joined: b's too. Had it
        // looked after, b would have been among the needers it found, or had read the file.
        assert!(s.share(key(3, 0), &block(3), vec![], Some((a, order)), 1, UNKNOWN));
        assert_eq!(s.needed_by(b), 2);
        assert!(s.share(
            key(4, 0),
            &block(4),
            vec![],
            Some((a, order)),
            s.joins(),
            UNKNOWN
        ));
        assert_eq!(s.needed_by(b), 2, "a spare");
        // a's epoch turns: its spare goes (a job hinting order 7 now would be an epoch
        // behind); what b needs stays. b's turns: it follows order 7 no more.
        s.drop_spares(a);
        s.drop_spares(b);
        assert!(!s.contains(&key(1, 0)));
        assert_eq!((s.needed_by(b), s.bytes()), (2, 2 * P));
        assert_eq!(s.join(order, c), 0, "nothing is read in order 7 any more");
        // Spares take free room only, and give way to a prefetch and to a needed block.
        assert!(s.share(key(5, 0), &block(5), vec![], Some((b, other)), 0, UNKNOWN));
        assert!(s.share(key(6, 0), &block(6), vec![], Some((b, other)), 0, UNKNOWN));
        assert!(
            !s.share(key(7, 0), &block(7), vec![], Some((b, other)), 0, UNKNOWN),
            "full"
        );
        assert!(s.reserve(P), "the oldest spare gave way");
        assert!(!s.contains(&key(5, 0)) && s.contains(&key(6, 0)));
        s.unreserve(P);
        assert!(s.share(key(7, 0), &block(7), vec![c], None, 0, UNKNOWN));
        assert!(s.share(key(8, 0), &block(8), vec![c], None, 0, UNKNOWN));
        assert!(!s.contains(&key(6, 0)));
        // Jobs that stop leave what they needed.
        s.forget_needer(c);
        s.forget_needer(b);
        assert_eq!((s.blocks(), s.bytes()), (0, 0));
    }

    #[test]
    fn a_job_adopts_blocks_staged_for_others_and_they_wait_for_it() {
        let s = Staging::new(8 * P, BLOCKS);
        let (a, b, c) = (JobKey::Pgid(1), JobKey::Pgid(2), JobKey::Pgid(3));
        // File 1, both blocks: spares of a's order (nobody needed them when a read them).
        // File 2: its first block only, kept for c.
        for block_no in 0..2 {
            assert!(s.share(
                key(1, block_no),
                &block(1),
                vec![],
                Some((a, 7)),
                0,
                UNKNOWN
            ));
        }
        assert!(s.share(key(2, 0), &block(2), vec![c], None, 0, UNKNOWN));
        let (spare, kept) = (key(1, 0).version, key(2, 0).version);
        // a's own spares are not for a. b takes on file 1 whole, and file 2's block, which
        // is not the whole file: b's prefetcher still fetches it.
        assert!(!s.adopt(&spare, a));
        assert!(s.adopt(&spare, b));
        assert!(!s.adopt(&kept, b));
        assert!(!s.adopt(&key(3, 0).version, b), "not staged");
        assert_eq!(s.needed_by(b), 3);
        // a's epoch turns (its spares would leave) and c reads its block: all stay, for b.
        s.drop_spares(a);
        assert!(s.claim(&kept, c).shared);
        assert_eq!(s.blocks(), 3);
        // b reads them; then they leave.
        assert_eq!(s.claim(&spare, b).blocks.len(), 2);
        assert_eq!(s.claim(&kept, b).blocks.len(), 1);
        assert_eq!((s.needed_by(b), s.blocks()), (0, 0));
    }

    #[test]
    fn stale_blocks_are_dropped_and_counted_by_epoch() {
        let s = Staging::new(10 * P, BLOCKS);
        let job = JobKey::All;
        for (ino, epoch) in [(1, 1), (2, 1), (3, 2)] {
            assert!(s.reserve(P));
            s.put(key(ino, 0), block(0), job, epoch, None);
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
        assert_eq!((s.blocks(), s.bytes(), s.held_by(job)), (1, P, P));
        assert_eq!(s.held_by(JobKey::Pgid(9)), 0);
    }

    #[test]
    fn blocks_of_an_ended_epoch_can_move_to_the_next() {
        let s = Staging::new(10 * P, BLOCKS);
        let (a, b) = (JobKey::Pgid(1), JobKey::Pgid(2));
        for (ino, job, epoch) in [(1, a, 1), (2, a, 2), (3, b, 1)] {
            assert!(s.reserve(P));
            s.put(key(ino, 0), block(0), job, epoch, None);
        }
        let moved = s.retag_before(a, 3, |_, _| false);
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
        assert_eq!((s.held_by(a), s.held_by(b), s.bytes()), (0, P, P));
    }

    #[test]
    fn blocks_of_a_file_read_in_the_ended_epoch_stay_in_it() {
        // Files 1 and 2 staged for epoch 1; the job read file 2 in it (a read under way takes
        // the block, and its bytes are that epoch's).
        let s = Staging::new(10 * P, BLOCKS);
        let a = JobKey::Pgid(1);
        for ino in [1, 2] {
            assert!(s.reserve(P));
            s.put(key(ino, 0), block(0), a, 1, Some(ino as FileId));
        }
        let moved = s.retag_before(a, 2, |epoch, f| epoch == 1 && f == 2);
        assert_eq!(moved[&1].files, 1);
        assert_eq!(moved[&1].read, 100);
        let left = s.drop_before(a, 2);
        assert_eq!((left[&1].blocks, left[&1].files), (1, 1));
        assert_eq!(s.claim(&key(1, 0).version, a).blocks.len(), 1);
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
