//! One fetch per block: how a block that no tier on the FUSE thread holds is read from the
//! tiers behind it: the local disk (`--cache-dir`), the cluster's peers, then the source.
//!
//! A fetch runs on the I/O pool, so a slow tier cannot hold up hits; a small block a reader
//! waits for runs on the asking thread instead while the storage answers fast
//! ([`INLINE_MAX_BYTES`]). Concurrent fetches of one block are merged ([`Inflight`]): a
//! reader that finds a prefetch (or another reader) already fetching the block waits for that
//! fetch instead of reading again. The tiers behind the fetch are asked nearest first and fail
//! open ([`super::look_up`]) but for the last, the source, whose fault is the readers'.
//!
//! A fetched block is offered to the memory tier (as the policy takes blocks wanted for that
//! reason), then, if a reader asked and the cache did not keep it, to the recent blocks
//! ([`super::recent`]) before the waiters run, so that a second open of the file right after
//! finds it; then it is handed to every waiter. The caller that started the fetch hears how
//! it went ([`Fetched`]): the bytes to account, the latency for the prefetcher's pacer. A
//! fetch whose read panics still ends: its waiters get EIO ([`DataError::Panicked`]) and the
//! block is no longer in flight. A failed fetch hands every waiter the same [`DataError`],
//! cause and all; the fetch logs it only at debug level: the reader's one log line is the
//! FUSE adapter's ([`super::error`]).
//!
//! # Parts of big objects
//! On an object store a request costs tens of milliseconds before its first byte, so a big
//! object is read in parts (`--part-size`, a whole number of blocks): a fetch that reaches the
//! source claims the blocks after its own to the end of its part (those no tier holds, no
//! fetch is reading and, for a block read for the first time in a while, no run read moments
//! ago: see [`Landed`]) and reads them all in one ranged GET. That is for a reader streaming
//! through the object ([`super::Want::stream`]), or while the cache has room to keep the
//! part; a reader that seeks (a Parquet footer, an index's random records) past that gets
//! the blocks its READs asked for, in one GET. Each block of the run is handed
//! over as soon as the body has filled it: offered to the cache and the disk tier as a block of
//! its own, then to the readers waiting for it (the kernel's readahead asks for the next blocks
//! while the GET runs); the rest wait in the readahead buffer ([`super::ahead`]) for the reader
//! that streams through the file. The part's last block is handed over once the fetch has
//! reported its bytes ([`ReadOut::last`]). A reader that begins a part has the next two read at
//! once ([`Fetcher::read_ahead`]), while the readahead buffer has room for them. A block a
//! tier in front of the source holds (the disk tier) ends the run: it is read from there. So a
//! big object read once costs one GET per part, about three in flight for each reader; where
//! one stream of the store brings more than a part in a request's wait (a server nearby), a
//! run spans several parts ([`parts_per_run`]). A directory source reads block by
//! block.
//!
//! # Small files in batches
//! A prefetch of a whole small file from a source that reads such files together (a
//! directory's, through io_uring) does not take a thread of its own: it waits for a batch
//! ([`batch`]), and a drainer reads up to 8 at once and ends each fetch as `run` does.
//!
//! Memory: a fetch holds one block-sized buffer until its waiters are done (a part's run: the
//! part), so the bytes in flight are bounded by the I/O threads times the block size (64 x 1
//! MiB by default), or the part size with parts.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod batch;
mod parts;

pub use parts::{
    LANDED_FOR, LANDED_MAX, PARTS_IN_FLIGHT, PARTS_IN_FLIGHT_MIN, parts_in_flight, parts_per_run,
};
use parts::{Landed, Stream};

use super::ahead::Ahead;
use super::inflight::{Inflight, Waiter};
use super::recent::RecentBlocks;
use super::{DataError, Found, Tier, Want, look_up};
use crate::block::{Block, BlockSize};
use crate::cache::{BlockCache, BlockKey};
use crate::stats::{Counters, Stats};

/// The bytes of a fetched block, or why the fetch failed.
pub type FetchResult = Result<Arc<Block>, DataError>;

/// How a fetch went, told to the caller that started it.
#[derive(Clone, Copy, Debug)]
pub struct Fetched {
    /// Bytes read, if the fetch succeeded.
    pub bytes: Option<u64>,
    /// The tier that read them (or failed to).
    pub origin: Origin,
    /// A tier in front of the source failed to (a peer), so the source read them.
    pub fallback: bool,
    /// From the read's start, on the thread that ran it, to its end: not the wait for that
    /// thread, which on a busy machine grows with the reads queued as a busy disk's latency
    /// would, and would make the prefetcher's pacer take the CPUs for the storage.
    pub took: Duration,
    /// Reads in flight when it started, itself included.
    pub crowd: usize,
    /// The read began at the file's first block (with it, or in its part's run): the file
    /// was read from the source this round.
    pub first_block: bool,
}

/// Where a fetched block came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The local disk tier (`--cache-dir`).
    Disk,
    /// The member of the cluster that owns the file.
    Peer,
    /// The source (also when a fetch fails).
    Source,
}

/// Called once by the fetch that a caller started, before its waiters run.
pub type Report = Box<dyn FnOnce(&Fetched) + Send>;

/// Reads blocks from the tiers behind the fetch, for the cache and its readers.
pub struct Fetcher {
    /// The tiers behind the fetch, nearest first; the last is the source.
    below: Vec<Arc<dyn Tier>>,
    memory: Arc<BlockCache>,
    recent: Arc<RecentBlocks>,
    /// Blocks of a part read with the one asked for, that no reader waited for yet.
    ahead: Arc<Ahead>,
    /// Blocks a source read may span: the part size over the block size (1: block by block).
    part_blocks: u64,
    /// With parts: held while a fetch begins and claims its part's run, so that of the
    /// fetches of one part started together, the first to begin takes the others' blocks
    /// (see [`Fetcher::claim_part`]).
    claiming: parking_lot::Mutex<()>,
    /// Blocks a part's run read moments ago, which a later run does not reach over.
    landed: Landed,
    /// The store's stream as the last runs of parts measured it ([`Stream`]): its
    /// bandwidth-delay product sets how many parts a run spans ([`Fetcher::run_blocks`]).
    stream: Stream,
    /// Runs of a part being read now (at most `parts_max`, see [`parts_in_flight`]).
    parts_in_flight: AtomicUsize,
    /// The most runs of a part read at once so far.
    parts_peak: AtomicUsize,
    /// Parts read ahead of their reader now ([`Fetcher::read_ahead`]).
    ahead_in_flight: AtomicUsize,
    /// Blocks beyond a part of the parts read ahead in flight that run longer (see
    /// [`Fetcher::run_blocks`]).
    ahead_extra: AtomicU64,
    /// At most, by readers and by the prefetcher ([`parts_in_flight`]).
    parts_max: (usize, usize),
    blocks: BlockSize,
    stats: Arc<Stats>,
    inflight: Inflight<BlockKey, FetchResult>,
    io: tokio::runtime::Handle,
    /// Reads in flight, all and those readers wait for.
    reading: AtomicUsize,
    demand: AtomicUsize,
    /// Smoothed latency of demand reads, in microseconds (see [`INLINE_BELOW_US`]).
    demand_latency_us: AtomicU64,
    /// Prefetches of small files waiting to be read together ([`batch`]).
    batches: batch::Batches,
}

/// A demand read of a block of at most this many bytes runs on the FUSE thread that asked
/// for it, instead of being handed to the I/O pool, while demand reads take less than
/// [`INLINE_BELOW_US`] on average. A handoff costs two thread wake-ups per read: on a
/// 2-CPU machine, 128,000 files of 200-600 B read cold by 2 processes (no prefetch) took
/// 20.0-22.5 s inline against 26.1-29.0 s handed off. Slow storage (network filesystems,
/// milliseconds a read) keeps the pool, so that a FUSE thread never waits long on it.
pub const INLINE_MAX_BYTES: u64 = 64 << 10;
/// See [`INLINE_MAX_BYTES`].
pub const INLINE_BELOW_US: u64 = 1_000;

/// The average of demand reads before the first: none, and the storage is not taken for fast
/// until a read says so (no demand read runs inline, no prefetch waits for a batch). An
/// average that began at 0 took six reads of 2 ms storage to reach 1 ms, and the prefetches
/// issued meanwhile were batched, each batch ending with its slowest file.
pub const UNMEASURED: u64 = u64::MAX;

/// The average of demand read latencies after a read that took `took_us`: mostly the last
/// eight reads; the first read's own time after none ([`UNMEASURED`]).
pub fn smoothed(avg_us: u64, took_us: u64) -> u64 {
    if avg_us == UNMEASURED {
        return took_us.min(UNMEASURED - 1);
    }
    (avg_us * 7 + took_us) / 8
}

/// True if a demand read of a block of `len` bytes runs on the asking thread, demand reads
/// taking `avg_us` on average (see [`INLINE_MAX_BYTES`]).
pub fn runs_inline(len: u64, avg_us: u64) -> bool {
    len <= INLINE_MAX_BYTES && avg_us < INLINE_BELOW_US
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("inflight", &self.inflight)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// A fetcher that reads from `below` (nearest first, the source last) on the `io` pool,
    /// runs of up to `part_blocks` blocks at once from the source, and offers what it read to
    /// `memory`, what that does not keep of reads to `recent`, and the rest of a part that no
    /// reader waits for to `ahead`.
    pub fn new(
        below: Vec<Arc<dyn Tier>>,
        memory: Arc<BlockCache>,
        recent: Arc<RecentBlocks>,
        (ahead, part_blocks, parts_max): (Arc<Ahead>, u64, (usize, usize)),
        stats: Arc<Stats>,
        io: tokio::runtime::Handle,
    ) -> Self {
        assert!(!below.is_empty(), "a fetch needs a tier to read from");
        Fetcher {
            below,
            blocks: memory.blocks(),
            memory,
            recent,
            ahead,
            part_blocks: part_blocks.max(1),
            claiming: Default::default(),
            landed: Landed::default(),
            stream: Stream::default(),
            parts_in_flight: AtomicUsize::new(0),
            parts_peak: AtomicUsize::new(0),
            ahead_in_flight: AtomicUsize::new(0),
            ahead_extra: AtomicU64::new(0),
            parts_max,
            stats,
            inflight: Inflight::default(),
            io,
            reading: AtomicUsize::new(0),
            demand: AtomicUsize::new(0),
            demand_latency_us: AtomicU64::new(UNMEASURED),
            batches: Default::default(),
        }
    }

    /// The memory the parts in flight held at their most, less what they hold now, and the
    /// room left in the readahead buffer: what the elastic budget leaves free for them (as
    /// for the staging area). A part's blocks are allocated as its GET's body reaches them and
    /// handed out when full, so a part holds at most the block being filled, its fetch's own
    /// block (until the fetch's waiters have it) and a MiB of the body.
    pub fn parts_unfilled(&self) -> u64 {
        if self.part_blocks <= 1 {
            return 0;
        }
        let now = self.parts_in_flight.load(Ordering::Relaxed);
        let peak = self.parts_peak.load(Ordering::Relaxed);
        let part = 2 * self.blocks.get() + (1 << 20);
        let ahead = self.ahead.capacity().saturating_sub(self.ahead.bytes());
        peak.saturating_sub(now) as u64 * part + ahead
    }

    /// Reads in flight that readers wait for.
    pub fn demand_in_flight(&self) -> usize {
        self.demand.load(Ordering::Relaxed)
    }

    /// Hands block `want.key` of the file at `rel` to `waiter`, fetching it unless a fetch is
    /// in flight. If this call starts the fetch, `report` hears how it went, and the block is
    /// offered to the cache as its policy takes blocks wanted for `want.why`.
    ///
    /// `landed` looks once more, in the tiers the caller looked in before, once this call is
    /// the one to fetch: a fetch of the block that was in flight when the caller looked may
    /// have ended since and left the block there (a prefetch stages it before the block leaves
    /// flight). What it finds goes to the waiters with no read and no report.
    pub fn fetch(
        self: &Arc<Self>,
        rel: Arc<Path>,
        want: &Want<'_>,
        landed: &dyn Fn() -> Option<Arc<Block>>,
        waiter: Waiter<FetchResult>,
        report: Report,
    ) {
        let (key, why) = (want.key, want.why);
        if !self.inflight.join(&key, waiter) {
            return;
        }
        let demand = why.is_read();
        if let Some(block) = landed() {
            self.hand_over_landed(key, block, demand);
            return;
        }
        let inline = demand
            && runs_inline(
                self.blocks.len(key.version.size, key.block),
                self.demand_latency_us.load(Ordering::Relaxed),
            );
        self.start(rel, want, false, inline, report);
    }

    /// A demand read took `us`: into the average over the last few reads, where a slow one
    /// alone does not move it far.
    pub(super) fn demand_read_took(&self, us: u64) {
        let _ =
            (self.demand_latency_us).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |avg| {
                Some(smoothed(avg, us))
            });
    }

    /// Starts reading the part of a big object that begins at block `want.key`, ahead of the
    /// reader streaming through the object, unless the cache or the readahead buffer holds
    /// the block or a fetch reads it. Its blocks go where a part's go; the first, like the
    /// rest, waits in the readahead buffer unless the cache kept it or a reader's READ joined
    /// the fetch meanwhile. `report` hears how it went, as for a reader's fetch.
    ///
    /// Why: the kernel's readahead asks for a part's blocks only as its window reaches them,
    /// so a reader streaming an object had one part in flight at a time, about one
    /// connection's speed; with the next two read while this one is, three. (A shard of 24
    /// MiB from a store paced at 100 MiB/s a connection: 0.20 s with one part ahead, 0.13 s
    /// with two.)
    ///
    /// It leaves the readers' last part slot to their own READs: with no slot a fetch reads its
    /// block alone, and a part read ahead that way took two GETs, a reader's READ that way
    /// too. And it waits for room for this part and those read ahead already
    /// ([`Fetcher::room_ahead`]): where the cache keeps no more, a part waits in the readahead
    /// buffer for its reader, and one that did not fit would push out blocks read ahead and
    /// not read yet.
    pub fn read_ahead(self: &Arc<Self>, rel: Arc<Path>, want: &Want<'_>, report: Report) {
        let part = self.part_blocks * self.blocks.get();
        if self.part_blocks <= 1
            || self.parts_in_flight.load(Ordering::Acquire) + 1 >= self.parts_max.0
            || !self.room_ahead(part)
            || self.memory.contains(&want.key)
            || self.ahead.contains(&want.key)
            || !self.inflight.claim(&want.key)
        {
            return;
        }
        self.ahead_in_flight.fetch_add(1, Ordering::AcqRel);
        self.start(rel, want, true, false, report);
    }

    /// True if a part of `part` bytes read ahead has room to wait for its reader: in the
    /// readahead buffer beside what waits there or will, or in the cache, which keeps a part's
    /// blocks while it has room for them (they then never wait in the buffer), with a buffer's
    /// worth to spare for the runs in flight that it may keep first. Counted against the
    /// buffer alone, the parts read ahead at the start of epoch 1 (a cache with room, no run
    /// measured yet: runs of one part) left a second reader's first shard its third part to
    /// read when it got there: 32 shards of 24 MiB from S3 (20 ms a request) in a 384 MiB pod,
    /// 2 readers: that shard took 92-109 ms against 70-77 ms for the first reader's; the
    /// epoch 0.90-1.01 s (median 0.93) against 0.88-1.08 s (0.97), 5 rounds alternated, and
    /// paced at 100 MiB/s 2.16-2.27 s against 2.29-2.43 s.
    fn room_ahead(&self, part: u64) -> bool {
        let waiting = self.ahead_waiting();
        let buffer = self.ahead.capacity();
        waiting + part <= buffer || self.memory.has_room_for(waiting + part + buffer)
    }

    /// Runs the fetch of `want` that this caller is to start, on the I/O pool or `inline`;
    /// `ahead`: its block is read ahead of its reader ([`Fetcher::read_ahead`]).
    fn start(
        self: &Arc<Self>,
        rel: Arc<Path>,
        want: &Want<'_>,
        ahead: bool,
        inline: bool,
        report: Report,
    ) {
        let (key, job, epoch, why) = (want.key, want.job, want.epoch, want.why);
        let crowd = self.reading.fetch_add(1, Ordering::Relaxed) + 1;
        if why.is_read() {
            self.demand.fetch_add(1, Ordering::Relaxed);
        }
        let started = Started {
            rel,
            key,
            job,
            epoch,
            why,
            stream: want.stream,
            ahead,
            issued: Instant::now(),
            crowd,
            parent: tracing::Span::current(),
        };
        if self.batchable(want, ahead, inline) {
            self.queue_for_batch(started, report);
            return;
        }
        let this = self.clone();
        let work = move || this.run(started, report);
        if inline {
            // A panic in the read is the pool's to contain when it runs there; here, the
            // FUSE thread's. Its readers get EIO either way (`Running`).
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        } else {
            self.io.spawn_blocking(work);
        }
    }

    /// Hands `block`, which a fetch that was in flight left in a tier meanwhile, to the
    /// waiters of `key`, with no read and no report. They run where a fetch's would: a
    /// reader's here, the prefetcher's on the pool (it issues fetches holding its job's lock,
    /// which its waiter takes).
    fn hand_over_landed(self: &Arc<Self>, key: BlockKey, block: Arc<Block>, demand: bool) {
        tracing::trace!(
            "block {} of inode {} landed meanwhile",
            key.block,
            key.version.ino
        );
        if demand {
            self.inflight.complete(&key, Ok(block));
        } else {
            let this = self.clone();
            self.io
                .spawn_blocking(move || this.inflight.complete(&key, Ok(block)));
        }
    }

    /// The fetch `started`, from its read to its waiters: reads the block from the tiers,
    /// learns the demand reads' latency, tells `report`, keeps a read block among the recent
    /// ones, and hands the result to the waiters.
    fn run(&self, started: Started, report: Report) {
        let pace = Pace::Since(Instant::now());
        self.run_with(started, report, pace, |this, want, ahead| {
            this.read(want, ahead)
        });
    }

    /// [`Fetcher::run`], with the read done by `read` (of a batch, see [`batch`], done
    /// before), its time and crowd for the pacer as `pace` says.
    fn run_with(
        &self,
        started: Started,
        report: Report,
        pace: Pace,
        read: impl FnOnce(&Self, &Want<'_>, bool) -> Option<ReadOut>,
    ) {
        let want = started.want();
        let Started {
            ref rel,
            key,
            why,
            ahead,
            issued,
            crowd,
            ref parent,
            ..
        } = started;
        let demand = why.is_read();
        // A part read ahead holds its room in the readahead buffer until it has ended.
        let _room = ahead.then(|| Counted(&self.ahead_in_flight));
        let mut running = Running {
            fetcher: self,
            key,
            demand,
            counted: true,
            done: false,
        };
        // At debug level the log has a line for each fetch as it ends: the file, the block,
        // why, the tier that had it and the bytes read (a part's with it), and its time.
        let span = tracing::debug_span!(
            parent: parent,
            "fetch",
            file = %rel.display(),
            block = key.block,
            why = ?why,
            tier = tracing::field::Empty,
            bytes = tracing::field::Empty,
        )
        .entered();
        let Some(out) = read(self, &want, ahead) else {
            // Another fetch took this block into its part's run: it hands it to the waiters,
            // and reports the bytes.
            running.uncount();
            running.done = true;
            return;
        };
        let ReadOut {
            result,
            origin,
            fallback,
            bytes: read_bytes,
            first_block,
            handed,
            last,
        } = out;
        span.record("tier", tracing::field::debug(origin));
        span.record("bytes", read_bytes);
        if let Err(e) = &result {
            tracing::debug!(errno = e.errno(), "fetch failed: {e}");
        }
        drop(span);
        let took = issued.elapsed();
        let (read_took, crowd) = match pace {
            Pace::Since(began) => (began.elapsed(), crowd),
            Pace::Batch { took, crowd } => (took, crowd),
        };
        if demand {
            self.demand_read_took(took.as_micros().min(u128::from(u32::MAX)) as u64);
        }
        running.uncount();
        report(&Fetched {
            bytes: result.as_ref().ok().map(|_| read_bytes),
            origin,
            fallback,
            took: read_took,
            crowd,
            first_block,
        });
        if let Some((key, data, kept)) = last {
            self.leave_for_reader(key, &data, kept);
            self.inflight.complete(&key, Ok(data));
        }
        if handed {
            // Its waiters had it as it arrived.
            running.done = true;
            return;
        }
        if let Ok(bytes) = &result {
            self.keep_own(&want, bytes, ahead);
        }
        running.complete(result);
    }

    /// True if block `key` is being fetched.
    pub fn in_flight(&self, key: &BlockKey) -> bool {
        self.inflight.contains(key)
    }

    /// Reads `want` from the tiers behind the fetch, nearest first, and offers what it found
    /// to the cache (through the tier that found it, which may decline for it), then what the
    /// source read to the tiers in front of the source that keep blocks (the disk tier),
    /// telling them if the cache kept it; says which tier read it, if the source did
    /// because a tier in front of it failed, the bytes read (with the rest of a part), and if
    /// the read began at the file's first block. None if another fetch took the block into its
    /// part's run before this one began (see [`Fetcher::claim_part`]).
    fn read(&self, want: &Want<'_>, ahead: bool) -> Option<ReadOut> {
        let (source, nearer) = self.below.split_last().expect("a tier to read from");
        // With parts, a fetch that no tier in front of the source may serve begins and claims
        // its part's run in one hold of `claiming`: of the fetches of one part that start
        // together (the kernel's readahead sends several READs at once), the first to begin
        // takes the others' blocks into its run and they wait for its GET.
        let mut run = None;
        if self.part_blocks > 1 {
            let _claiming = self.claiming.lock();
            if !self.inflight.begin(&want.key) {
                return None;
            }
            if !nearer.iter().any(|t| t.may_find(want)) {
                run = Some(self.claim_part(want, ahead));
            }
        }
        let faults = AtomicU64::new(0);
        let mut found = None;
        if run.is_none() {
            for tier in nearer {
                if let Some(f) = look_up([&**tier], want, &faults) {
                    found = Some((f, Some(tier)));
                    break;
                }
            }
        }
        let faults = faults.into_inner();
        Counters::add(&self.stats.counters.tier_errors, faults);
        let fallback = faults > 0;
        Some(match found {
            Some((found, finder)) => self.landed(want, found, finder, fallback),
            None => {
                let (lo, hi) = run.unwrap_or_else(|| {
                    let _claiming = self.claiming.lock();
                    self.claim_part(want, ahead)
                });
                if hi - lo > 1 {
                    return Some(self.read_part(want, (lo, hi), ahead, fallback));
                }
                self.sourced(want, source.get(want), fallback)
            }
        })
    }

    /// What the source's read of `want` came to (`got`), as [`Fetcher::read`] says it.
    fn sourced(
        &self,
        want: &Want<'_>,
        got: Result<Option<Found<'_>>, DataError>,
        fallback: bool,
    ) -> ReadOut {
        let source = self.below.last().expect("a tier to read from");
        match got {
            Ok(Some(found)) => self.landed(want, found, None, fallback),
            Ok(None) => {
                ReadOut::failed(DataError::Missing(source.name()), Origin::Source, fallback)
            }
            Err(e) => ReadOut::failed(e, Origin::Source, fallback),
        }
    }

    /// Block `want.key` as `finder` found it (None: the source), offered to the cache as
    /// [`Fetcher::read`] says.
    fn landed(
        &self,
        want: &Want<'_>,
        found: Found<'_>,
        finder: Option<&Arc<dyn Tier>>,
        fallback: bool,
    ) -> ReadOut {
        let (source, nearer) = self.below.split_last().expect("a tier to read from");
        let origin = finder.map_or(Origin::Source, |tier| tier.origin());
        let Some(block) = owned(found, want.key.block) else {
            let name = finder.map_or(source.name(), |tier| tier.name());
            return ReadOut::failed(DataError::Missing(name), origin, fallback);
        };
        match finder {
            Some(tier) => {
                tier.offer_to_memory(want, &block, &self.memory);
            }
            None => {
                let kept = self.memory.admit(want, &block);
                for tier in nearer {
                    tier.admit_behind(want, &block, &self.memory, kept);
                }
            }
        }
        ReadOut {
            bytes: block.len() as u64,
            result: Ok(block),
            origin,
            fallback,
            first_block: want.key.block == 0,
            handed: false,
            last: None,
        }
    }
}

/// One of a count, given back when dropped.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Block `block` of what a tier found, as a block of its own.
fn owned(found: Found<'_>, block: u64) -> Option<Arc<Block>> {
    match found {
        Found::Block(data) => Some(data),
        Found::File(blocks) => blocks
            .into_iter()
            .find(|(b, _)| *b == block)
            .map(|(_, d)| d),
        Found::Lent(bytes) => Block::copy_of(&bytes).ok().map(Arc::new),
    }
}

/// What a fetch's read came to ([`Fetcher::read`]).
struct ReadOut {
    result: FetchResult,
    /// The tier that read it.
    origin: Origin,
    /// A tier in front of the source failed, and the source read it.
    fallback: bool,
    /// Bytes read, a part's with its block.
    bytes: u64,
    /// The read began at the file's first block.
    first_block: bool,
    /// The fetch's waiters were handed its block as the part arrived.
    handed: bool,
    /// The last block of a part, not the fetch's own, kept from its waiters until the fetch
    /// has reported (with the cache's answer: kept).
    last: Option<(BlockKey, Arc<Block>, bool)>,
}

/// What a fetch tells the pacer of its read ([`Fetched::took`] and [`Fetched::crowd`]).
enum Pace {
    /// The read began then, with the reads in flight when the fetch started.
    Since(Instant),
    /// Set by a batch ([`batch`]): its first file carries the batch's time and the batches
    /// in flight, the others a zero time, which the pacer takes for no sample.
    Batch { took: Duration, crowd: usize },
}

impl Started {
    /// What it reads, for whom and why.
    fn want(&self) -> Want<'_> {
        Want {
            key: self.key,
            rel: &self.rel,
            job: self.job,
            epoch: self.epoch,
            why: self.why,
            stream: self.stream,
        }
    }
}

impl ReadOut {
    /// A read that failed with `error`.
    fn failed(error: DataError, origin: Origin, fallback: bool) -> ReadOut {
        ReadOut {
            result: Err(error),
            origin,
            fallback,
            bytes: 0,
            first_block: false,
            handed: false,
            last: None,
        }
    }
}

/// A fetch that [`Fetcher::fetch`] or [`Fetcher::read_ahead`] started: what it reads, for
/// whom, since when, and how many reads were in flight with it.
struct Started {
    rel: Arc<Path>,
    key: BlockKey,
    job: crate::jobs::JobKey,
    epoch: u64,
    why: super::Why,
    /// [`Want::stream`].
    stream: bool,
    /// Read ahead of its reader ([`Fetcher::read_ahead`]).
    ahead: bool,
    issued: Instant,
    crowd: usize,
    /// The span of what started it (a FUSE request's, for a read): the fetch's is its child,
    /// and holding it keeps the request's span open until the fetch has ended.
    parent: tracing::Span,
}

/// A fetch on the I/O pool, from its start to the end of its waiters. However the closure
/// ends, dropping this releases the key: if the read panicked (a bug in a source), the
/// waiters get EIO instead of waiting forever, and a later read of the block fetches again.
struct Running<'a> {
    fetcher: &'a Fetcher,
    key: BlockKey,
    demand: bool,
    /// Still counted among the reads in flight.
    counted: bool,
    /// The waiters have been handed a result.
    done: bool,
}

impl Running<'_> {
    /// The read is over: it no longer counts among the reads in flight.
    fn uncount(&mut self) {
        if std::mem::take(&mut self.counted) {
            self.fetcher.reading.fetch_sub(1, Ordering::Relaxed);
            if self.demand {
                self.fetcher.demand.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Hands `result` to the waiters and releases the key.
    fn complete(mut self, result: FetchResult) {
        self.done = true;
        self.fetcher.inflight.complete(&self.key, result);
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.uncount();
        if !self.done {
            Counters::add(&self.fetcher.stats.counters.source_errors, 1);
            tracing::error!(
                "the fetch of block {} of inode {} panicked; its readers get EIO",
                self.key.block,
                self.key.version.ino
            );
            self.fetcher
                .inflight
                .complete(&self.key, Err(DataError::Panicked));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_demand_reads_run_inline_only_while_the_storage_answers_fast() {
        // Nothing is fast before a read says so; the first read's time is the average.
        let mut avg = UNMEASURED;
        assert!(!runs_inline(4096, avg));
        assert_eq!(smoothed(avg, 2_000), 2_000, "2 ms storage is slow at once");
        // A local disk: 100-300 us a read, forever inline.
        avg = smoothed(avg, 100);
        for took in (0..1000).map(|i| 100 + (i % 3) * 100) {
            assert!(runs_inline(4096, avg), "after {took} us");
            avg = smoothed(avg, took);
        }
        assert!(!runs_inline(INLINE_MAX_BYTES + 1, avg), "a big block");
        // Network storage: 3 ms a read. The pool takes over within a few reads, and one
        // fast read among slow ones does not bring a FUSE thread back to waiting on it.
        let mut reads = 0;
        while runs_inline(4096, avg) {
            avg = smoothed(avg, 3_000);
            reads += 1;
        }
        assert!(reads <= 4, "{reads} reads of 3 ms ran inline");
        for _ in 0..20 {
            avg = smoothed(avg, 3_000);
        }
        avg = smoothed(avg, 100);
        assert!(!runs_inline(4096, avg));
    }

    /// What [`fetcher`] makes: its directory, the fetcher, its source, the want of the file's
    /// one block, and the I/O runtime.
    type TestFetcher = (
        tempfile::TempDir,
        Arc<Fetcher>,
        Arc<crate::source::FaultySource<crate::source::LocalSource>>,
        Want<'static>,
        tokio::runtime::Runtime,
    );

    /// A fetcher over `nearer` tiers in front of a source holding file `f` of 100,000 bytes
    /// of 7s (too large to be read inline) read with `delay`, with a MinIO cache, and the
    /// want of its one block.
    fn fetcher(nearer: Vec<Arc<dyn Tier>>, delay: Duration) -> TestFetcher {
        fetcher_with(nearer, delay, (1, (1, 0)))
    }

    /// [`fetcher`], reading parts of `part_blocks` blocks, `parts_max` at once.
    fn fetcher_with(
        nearer: Vec<Arc<dyn Tier>>,
        delay: Duration,
        parts: (u64, (usize, usize)),
    ) -> TestFetcher {
        rig(nearer, delay, parts, &Rig::default())
    }

    /// The file, the cache and the readahead buffer of a test fetcher.
    pub(super) struct Rig {
        pub(super) bytes: Vec<u8>,
        pub(super) block: u64,
        pub(super) cache: u64,
        pub(super) ahead: u64,
        /// Threads of the I/O pool (0: tokio's default).
        pub(super) pool: usize,
    }

    impl Default for Rig {
        /// 100,000 bytes of 7s, one block of a MiB, a cache of a MiB, no readahead buffer.
        fn default() -> Self {
            Rig {
                bytes: vec![7; 100_000],
                block: 1 << 20,
                cache: 1 << 20,
                ahead: 0,
                pool: 0,
            }
        }
    }

    /// [`fetcher_with`] over the file, cache and readahead buffer of `r`.
    fn rig(
        nearer: Vec<Arc<dyn Tier>>,
        delay: Duration,
        (part_blocks, parts_max): (u64, (usize, usize)),
        r: &Rig,
    ) -> TestFetcher {
        use crate::source::{Creds, DatasetSource, FaultySource, LocalSource};
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), &r.bytes).unwrap();
        let local = LocalSource::new(dir.path().to_path_buf(), false).unwrap();
        let version = local
            .metadata(Path::new("f"), &Creds::DAEMON)
            .unwrap()
            .version;
        let source = Arc::new(FaultySource::new(local));
        *source.read_delay.lock() = delay;
        let (f, io) = fetcher_over(source.clone(), nearer, (part_blocks, parts_max), r);
        let mut want = crate::tier::tests::want(0, 0, 0, super::super::Why::Read);
        want.key.version = version;
        (dir, f, source, want, io)
    }

    /// A fetcher over `nearer` tiers in front of `source`, with the block size, cache,
    /// readahead buffer and pool of `r`, and its I/O runtime.
    pub(super) fn fetcher_over(
        source: Arc<dyn crate::source::DatasetSource>,
        nearer: Vec<Arc<dyn Tier>>,
        (part_blocks, parts_max): (u64, (usize, usize)),
        r: &Rig,
    ) -> (Arc<Fetcher>, tokio::runtime::Runtime) {
        let memory = Arc::new(
            BlockCache::new(crate::cache::CacheConfig {
                policy: crate::cache::PolicyKind::MinIo,
                capacity: r.cache,
                ceiling: None,
                block_size: std::num::NonZeroU64::new(r.block).unwrap(),
            })
            .unwrap(),
        );
        let stats = Arc::new(Stats::default());
        let tier = super::super::source::SourceTier::new(source, memory.blocks(), stats.clone());
        let mut below = nearer;
        below.push(Arc::new(tier));
        let mut io = tokio::runtime::Builder::new_multi_thread();
        io.worker_threads(1);
        if r.pool > 0 {
            io.max_blocking_threads(r.pool);
        }
        let io = io.build().unwrap();
        let recent = Arc::new(RecentBlocks::new(true));
        let ahead = Arc::new(Ahead::new(r.ahead, stats.clone()));
        let f = Fetcher::new(
            below,
            memory,
            recent,
            (ahead, part_blocks, parts_max),
            stats,
            io.handle().clone(),
        );
        (Arc::new(f), io)
    }

    /// Fetches `want` with `n` waiters at once; returns what each got.
    fn fetch_all(f: &Arc<Fetcher>, want: &Want<'_>, n: usize) -> Vec<FetchResult> {
        let (tx, rx) = std::sync::mpsc::channel();
        let reports = Arc::new(AtomicUsize::new(0));
        for _ in 0..n {
            let (tx, reports) = (tx.clone(), reports.clone());
            f.fetch(
                Arc::from(Path::new("f")),
                want,
                &|| None,
                Box::new(move |r| tx.send(r).unwrap()),
                Box::new(move |fetched| {
                    assert_eq!(fetched.bytes, Some(100_000));
                    reports.fetch_add(1, Ordering::Relaxed);
                }),
            );
        }
        let got = (0..n).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(
            reports.load(Ordering::Relaxed),
            1,
            "the fetch that started reports"
        );
        got
    }

    #[test]
    fn a_fetch_reports_the_time_of_its_read_not_its_wait_for_a_thread() {
        // One I/O thread and two reads of 50 ms issued at once: the second waits 50 ms for
        // the thread, which is no latency of the storage's (the pacer would take it for reads
        // queueing on the storage, and prefetch one at a time).
        let r = Rig {
            block: 64 << 10,
            pool: 1,
            ..Rig::default()
        };
        let (_dir, f, _source, mut want, _io) =
            rig(vec![], Duration::from_millis(50), (1, (1, 0)), &r);
        want.why = super::super::Why::Prefetch;
        let (tx, rx) = std::sync::mpsc::channel();
        for block in [0, 1] {
            want.key.block = block;
            let tx = tx.clone();
            f.fetch(
                Arc::from(Path::new("f")),
                &want,
                &|| None,
                Box::new(|_| {}),
                Box::new(move |fetched| tx.send(fetched.took).unwrap()),
            );
        }
        for _ in 0..2 {
            let took = rx.recv().unwrap();
            assert!(
                took >= Duration::from_millis(50) && took < Duration::from_millis(90),
                "{took:?}"
            );
        }
    }

    #[test]
    fn concurrent_misses_of_a_block_read_it_once_and_the_cache_takes_it() {
        let (_dir, f, source, want, _io) = fetcher(Vec::new(), Duration::from_millis(50));
        let got = fetch_all(&f, &want, 4);
        assert!(
            got.iter()
                .all(|r| r.as_ref().is_ok_and(|b| b[..] == [7; 100_000]))
        );
        assert_eq!(source.reads(), 1);
        assert!(f.memory.contains(&want.key));
        // The block leaves the in-flight table just after its last waiter was answered (on
        // the fetch's thread): under load the test can look in between.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while f.in_flight(&want.key) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!f.in_flight(&want.key));
    }

    #[test]
    fn a_block_that_landed_before_the_fetch_started_is_not_read_again() {
        let (_dir, f, source, want, _io) = fetcher(Vec::new(), Duration::ZERO);
        let landed = Arc::new(Block::copy_of(&[9; 100_000]).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        f.fetch(
            Arc::from(Path::new("f")),
            &want,
            &|| Some(landed.clone()),
            Box::new(move |r| tx.send(r).unwrap()),
            Box::new(|_| panic!("no read, no report")),
        );
        assert!(rx.recv().unwrap().is_ok_and(|b| b[..] == [9; 100_000]));
        assert_eq!(source.reads(), 0);
        assert!(!f.in_flight(&want.key));
        assert!(!f.memory.contains(&want.key), "not offered twice");
        // A prefetch's waiter runs on the pool, as it would after a read: the prefetcher
        // holds a lock its waiter takes while it issues the fetch.
        let (tx, rx) = std::sync::mpsc::channel();
        f.fetch(
            Arc::from(Path::new("f")),
            &want.because(super::super::Why::Prefetch),
            &|| Some(landed.clone()),
            Box::new(move |r| tx.send((r, std::thread::current().id())).unwrap()),
            Box::new(|_| panic!("no read, no report")),
        );
        let (r, on) = rx.recv().unwrap();
        assert!(r.is_ok_and(|b| b[..] == [9; 100_000]));
        assert_ne!(on, std::thread::current().id());
        assert_eq!(source.reads(), 0);
    }

    #[test]
    fn a_faulty_tier_in_front_of_the_source_falls_through_to_it() {
        let broken = crate::tier::tests::Told(Err(DataError::Missing("told")));
        let broken: Arc<dyn Tier> = Arc::new(broken);
        let (_dir, f, source, want, _io) = fetcher(vec![broken], Duration::ZERO);
        let got = fetch_all(&f, &want, 1);
        assert!(got[0].as_ref().is_ok_and(|b| b[..] == [7; 100_000]));
        assert_eq!(source.reads(), 1);
        assert_eq!(Counters::get(&f.stats.counters.tier_errors), 1);
    }

    #[test]
    fn a_source_fault_reaches_every_waiter() {
        let (_dir, f, source, want, _io) = fetcher(Vec::new(), Duration::from_millis(20));
        *source.fail_paths_containing.lock() = Some("f".into());
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..3 {
            let tx = tx.clone();
            f.fetch(
                Arc::from(Path::new("f")),
                &want,
                &|| None,
                Box::new(move |r| tx.send(r).unwrap()),
                Box::new(|fetched| assert_eq!(fetched.bytes, None)),
            );
        }
        for _ in 0..3 {
            let e = rx.recv().unwrap().unwrap_err();
            assert!(matches!(e, DataError::Source(_)), "{e:?}");
            assert_eq!(e.errno(), libc::EIO);
        }
        assert_eq!(source.reads(), 1);
        assert!(!f.memory.contains(&want.key));
    }

    #[test]
    fn parts_in_flight_are_counted_at_their_most_for_the_elastic_budget() {
        let (_dir, f, _source, want, _io) = fetcher_with(Vec::new(), Duration::ZERO, (8, (2, 0)));
        let mut version = want.key.version;
        version.size = 64 << 20;
        let key = |block| BlockKey { version, block };
        let read = |block| Want {
            key: key(block),
            ..want
        };
        // A small file's one block takes a slot for a moment, and is no part.
        let small = Want {
            key: BlockKey {
                version: crate::namespace::FileVersion {
                    size: 4096,
                    ..version
                },
                block: 0,
            },
            ..want
        };
        assert_eq!(f.claim_part(&small, false), (0, 1));
        assert_eq!(f.parts_peak.load(Ordering::Relaxed), 0);
        // Two readers each read a part (8 blocks); a third read, and the prefetcher's, read
        // their block alone: no room for another part.
        assert_eq!(f.claim_part(&read(0), false), (0, 8));
        assert_eq!(f.claim_part(&read(8), false), (8, 16));
        assert_eq!(f.claim_part(&read(16), false), (16, 17));
        assert_eq!(
            f.claim_part(&read(24).because(crate::tier::Why::Prefetch), false),
            (24, 25)
        );
        let ahead = f.ahead.capacity();
        assert_eq!(f.parts_unfilled(), ahead, "both parts are held now");
        // Once read, their memory is what the elastic budget leaves free for the next ones:
        // two blocks and a MiB of the body each, with the readahead buffer's room.
        f.parts_in_flight.fetch_sub(2, Ordering::AcqRel);
        assert_eq!(f.parts_unfilled(), 2 * (2 * (1 << 20) + (1 << 20)) + ahead);
    }

    /// A rig of 8 blocks of 64 KiB of varied bytes, read in parts of 4 blocks, with a cache
    /// of `cache` bytes and a readahead buffer of 8 blocks.
    fn parts_rig(cache: u64) -> (TestFetcher, Vec<u8>) {
        let bytes: Vec<u8> = (0..8 << 16).map(|i| (i % 251) as u8).collect();
        let r = Rig {
            bytes: bytes.clone(),
            block: 1 << 16,
            cache,
            ahead: 8 << 16,
            pool: 0,
        };
        (rig(Vec::new(), Duration::ZERO, (4, (2, 0)), &r), bytes)
    }

    /// A 16-block object of varied bytes, read in parts of 4 blocks with a readahead buffer of
    /// 12 and a cache of `cache` blocks, readers getting `parts` part slots, from a store that
    /// waits `wait` before each body, which then pauses `pause` after its first block.
    fn store_of_16(
        cache: u64,
        parts: usize,
        (wait, pause): (Duration, Duration),
    ) -> (TestFetcher, Vec<u8>) {
        let bytes: Vec<u8> = (0..16 << 16).map(|i| (i % 251) as u8).collect();
        let r = Rig {
            bytes: bytes.clone(),
            block: 1 << 16,
            cache: cache << 16,
            ahead: 12 << 16,
            pool: 0,
        };
        let rigged = rig(Vec::new(), Duration::ZERO, (4, (parts, 0)), &r);
        *rigged.2.read_delay.lock() = wait;
        *rigged.2.run_pause.lock() = pause;
        (rigged, bytes)
    }

    /// Fetches block `b` of `want`'s file for a reader and waits for it: the bytes its fetch
    /// reported.
    fn read_block(f: &Arc<Fetcher>, want: &Want<'_>, b: u64) -> Option<u64> {
        let (report, reported) = reporting();
        let (tx, rx) = std::sync::mpsc::channel();
        let w: Waiter<FetchResult> = Box::new(move |r| tx.send(r).unwrap());
        f.fetch(want.rel.into(), &want.block(b), &|| None, w, report);
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        reported.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    /// Waits, 10 s at most, until none of `blocks` of `want`'s file is in flight.
    fn settle(f: &Fetcher, want: &Want<'_>, blocks: std::ops::Range<u64>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while blocks.clone().any(|b| f.in_flight(&want.block(b).key)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Reads ahead from block `b` of `want`'s file and waits for the fetch's report: the bytes
    /// it read.
    fn read_ahead_told(f: &Arc<Fetcher>, want: &Want<'_>, b: u64) -> Option<u64> {
        let (report, reported) = reporting();
        f.read_ahead(want.rel.into(), &want.block(b), report);
        reported.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    /// Takes `blocks` of `want`'s file from the readahead buffer, as their reader does, and
    /// checks each against the file's `bytes`.
    fn take_left(f: &Fetcher, want: &Want<'_>, blocks: std::ops::Range<u64>, bytes: &[u8]) {
        for b in blocks {
            let got = f
                .take_ahead(&want.block(b).key)
                .expect("left for the reader");
            assert_eq!(&got[..], &bytes[(b as usize) << 16..(b as usize + 1) << 16]);
        }
    }

    /// Reads blocks 0 and 4 of [`store_of_16`] with a cache of `cache` blocks from a store of
    /// `wait` and `pause`: returns the blocks of the second run and the store's reads.
    fn second_run(cache: u64, wait: Duration, pause: Duration) -> (u64, u64) {
        let ((_dir, f, source, want, _io), _) = store_of_16(cache, 2, (wait, pause));
        assert_eq!(
            read_block(&f, &want, 0),
            Some(4 << 16),
            "the first run is a part"
        );
        // Its 3 other blocks in the buffer, none still on its way: the room the second run
        // sees does not hang on when the last of them lands.
        settle(&f, &want, 1..4);
        let second = read_block(&f, &want, 4).unwrap();
        (second >> 16, source.reads())
    }

    #[test]
    fn runs_span_more_parts_where_one_stream_brings_more_than_a_part_in_a_request_s_wait() {
        let (slow, fast) = (
            (Duration::ZERO, Duration::from_millis(20)),
            (Duration::from_millis(100), Duration::from_millis(5)),
        );
        // A body at about 10 MB/s after no wait: parts side by side add up, a run stays a part.
        assert_eq!(second_run(64, slow.0, slow.1), (4, 2));
        // 100 ms before a body at about 40 MB/s: the rest of the object in one request, while
        // the cache has room for the whole readahead buffer.
        assert_eq!(second_run(64, fast.0, fast.1), (12, 2));
        // With no room in the cache the blocks wait in the buffer: a run takes what the first
        // run's 3 blocks left there untaken leave of it (9 blocks: 2 parts and a block).
        assert_eq!(second_run(0, fast.0, fast.1), (9, 2));
    }

    #[test]
    fn a_read_of_a_later_block_of_a_run_sent_ahead_reads_the_run_as_sent() {
        // The kernel's READs of a window come in any order: the READ of a later block of an
        // object whose first run was sent ahead may come first. It reads the run as sent, from
        // the object's first block, in the one request sent (CI: a READ of a later block read
        // its own part, the first block's read was cut short of it and the request sent ahead
        // went unread).
        for (sent, later) in [(4u64, 2), (12, 6)] {
            let ((_dir, f, source, want, _io), bytes) = store_of_16(64, 2, Default::default());
            *source.sent.lock() = Some(vec![("f".into(), 0, (sent as usize) << 16)]);
            assert_eq!(read_block(&f, &want, later), Some(sent << 16), "{sent}");
            assert_eq!(source.reads(), 1, "one request");
            assert_eq!(source.sent.lock().as_deref(), Some(&[][..]), "the one sent");
            settle(&f, &want, 0..sent);
            // Every block of the run is the cache's, with its own bytes.
            for b in 0..sent {
                let got = f.memory.get(&want.block(b).key).expect("cached");
                assert_eq!(&got[..], &bytes[(b as usize) << 16..(b as usize + 1) << 16]);
            }
        }
    }

    #[test]
    fn a_run_read_ahead_spans_the_room_the_buffer_has_and_gives_it_back() {
        // A store that answers after 100 ms at about 40 MB/s, a cache with no room, parts of 4
        // blocks and a buffer of 12: once a reader's first part has taught the fetcher the
        // store's product and the reader took its blocks, a run read ahead from block 4 spans
        // the rest of the object (the buffer's 12 blocks, itself counted as a part).
        let fast = (Duration::from_millis(100), Duration::from_millis(5));
        let ((_dir, f, source, want, _io), bytes) = store_of_16(0, 8, fast);
        assert_eq!(read_block(&f, &want, 0), Some(4 << 16));
        settle(&f, &want, 1..4);
        take_left(&f, &want, 1..4, &bytes);
        assert_eq!(read_ahead_told(&f, &want, 4), Some(12 << 16));
        settle(&f, &want, 4..16);
        assert_eq!(
            f.ahead_extra.load(Ordering::Acquire),
            0,
            "the run gave its room back"
        );
        // Its blocks fill the buffer, none pushed out.
        assert_eq!(f.ahead_waiting(), 12 << 16);
        assert_eq!(source.reads(), 2);
        take_left(&f, &want, 4..16, &bytes);
        assert_eq!(Counters::get(&f.stats.counters.readahead_unused_bytes), 0);
    }

    /// A report that sends the bytes it is told of.
    fn reporting() -> (Report, std::sync::mpsc::Receiver<Option<u64>>) {
        let (tx, rx) = std::sync::mpsc::channel();
        (Box::new(move |f: &Fetched| tx.send(f.bytes).unwrap()), rx)
    }

    #[test]
    fn a_part_hands_each_block_to_its_reader_as_it_arrives() {
        let ((_dir, f, source, want, _io), bytes) = parts_rig(8 << 16);
        // The body of the part stops for a second after its first block.
        *source.run_pause.lock() = Duration::from_secs(1);
        let (tx, rx) = std::sync::mpsc::channel();
        let (report, reported) = reporting();
        let started = Instant::now();
        let w: Waiter<FetchResult> = Box::new(move |r| tx.send((r, started.elapsed())).unwrap());
        f.fetch(want.rel.into(), &want, &|| None, w, report);
        let (got, after) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(&got.unwrap()[..], &bytes[..1 << 16]);
        assert!(
            after < Duration::from_millis(700),
            "the first block came after {after:?}"
        );
        // The rest of the part, then the report of it all, one GET.
        let told = reported.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(started.elapsed() >= Duration::from_secs(1));
        assert_eq!(told, Some(4 << 16));
        assert_eq!(source.reads(), 1);
        for b in 1..4 {
            let key = want.block(b).key;
            let got = f.memory.copy_of(&key).expect("kept by the cache");
            assert_eq!(&got[..], &bytes[(b as usize) << 16..(b as usize + 1) << 16]);
        }
    }

    #[test]
    fn a_part_read_out_of_order_is_read_once_and_a_block_read_again_reads_its_part() {
        let ((_dir, f, source, want, _io), bytes) = parts_rig(0);
        let fetch = |b: u64| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (report, reported) = reporting();
            let w: Waiter<FetchResult> = Box::new(move |r| tx.send(r).unwrap());
            f.fetch(want.rel.into(), &want.block(b), &|| None, w, report);
            let got = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
            assert_eq!(&got[..], &bytes[(b as usize) << 16..(b as usize + 1) << 16]);
            let told = reported.recv_timeout(Duration::from_secs(10)).unwrap();
            // The part's last block is left for its reader once the fetch has reported.
            settle(&f, &want, 3..4);
            // Its reader takes the rest of the part as it reaches it.
            for other in b + 1..4 {
                f.take_ahead(&want.block(other).key);
            }
            told.unwrap() >> 16
        };
        // The READ of block 1 is answered first: its run is blocks 1-3, not block 0, which
        // no reader asked for yet.
        assert_eq!(fetch(1), 3);
        // Block 0's READ, answered late, reads block 0 alone, not blocks 1-3 again.
        assert_eq!(fetch(0), 1);
        assert_eq!(source.reads(), 2);
        // Block 1 asked again (a new epoch): its part is read again, in one GET.
        assert_eq!(fetch(1), 3);
        assert_eq!(source.reads(), 3);
    }

    /// A tier in front of the source that holds blocks `held` and reads none (as the disk
    /// tier holds what it has and is asked before the source).
    struct Holding(std::ops::Range<u64>);

    impl Tier for Holding {
        fn name(&self) -> &'static str {
            "holding"
        }
        fn get(&self, _want: &Want<'_>) -> Result<Option<Found<'_>>, DataError> {
            Ok(None)
        }
        fn holds(&self, want: &Want<'_>) -> bool {
            self.0.contains(&want.key.block)
        }
        fn admit(&self, _want: &Want<'_>, _data: &Arc<Block>) -> bool {
            false
        }
        fn remove(&self, _want: &Want<'_>) {}
    }

    #[test]
    fn a_part_leaves_out_the_blocks_the_disk_tier_holds() {
        // Blocks 2 and 3 of the part are on disk: the GET reads blocks 0 and 1 only. Read from
        // the store too, they were a second copy of cached bytes each epoch (32 shards from S3
        // with the disk tier: 308 MiB from the store an epoch for 268 MiB it lacked).
        let bytes: Vec<u8> = (0..8 << 16).map(|i| (i % 251) as u8).collect();
        let r = Rig {
            bytes: bytes.clone(),
            block: 1 << 16,
            cache: 0,
            ahead: 8 << 16,
            pool: 0,
        };
        let disk: Arc<dyn Tier> = Arc::new(Holding(2..4));
        let (_dir, f, source, want, _io) = rig(vec![disk], Duration::ZERO, (4, (2, 0)), &r);
        let (report, reported) = reporting();
        f.read_ahead(want.rel.into(), &want, report);
        let told = reported.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(told, Some(2 << 16), "blocks 0 and 1");
        assert_eq!(source.reads(), 1);
        settle(&f, &want, 1..2);
        take_left(&f, &want, 0..2, &bytes);
        assert!(
            f.take_ahead(&want.block(2).key).is_none(),
            "on disk, not read"
        );
    }

    #[test]
    fn parts_are_read_ahead_only_while_the_readahead_buffer_has_room_for_them() {
        // Four parts of four blocks, a cache with no room and a buffer of one part.
        let bytes: Vec<u8> = (0..16 << 16).map(|i| (i % 251) as u8).collect();
        let r = Rig {
            bytes,
            block: 1 << 16,
            cache: 0,
            ahead: 4 << 16,
            pool: 0,
        };
        let (_dir, f, source, want, _io) = rig(Vec::new(), Duration::ZERO, (4, (8, 0)), &r);
        assert_eq!(read_ahead_told(&f, &want, 4), Some(4 << 16));
        settle(&f, &want, 4..8);
        // The buffer is full with part 1: part 2 waits; it would push part 1 out unread.
        let (report, refused) = reporting();
        f.read_ahead(want.rel.into(), &want.block(8), report);
        assert!(refused.recv_timeout(Duration::from_millis(200)).is_err());
        assert_eq!(source.reads(), 1);
        // The reader takes part 1: room for part 2.
        take_left(&f, &want, 4..8, &r.bytes);
        assert_eq!(read_ahead_told(&f, &want, 8), Some(4 << 16));
        assert_eq!(source.reads(), 2);
        assert_eq!(Counters::get(&f.stats.counters.readahead_unused_bytes), 0);
    }

    #[test]
    fn parts_the_cache_keeps_are_read_ahead_beside_a_full_readahead_buffer() {
        // Four parts of four blocks, a buffer of one part, a store that answers after 200 ms.
        let bytes: Vec<u8> = (0..16 << 16).map(|i| (i % 251) as u8).collect();
        let read_ahead_two = |cache: u64| {
            let r = Rig {
                bytes: bytes.clone(),
                block: 1 << 16,
                cache,
                ahead: 4 << 16,
                pool: 0,
            };
            let slow = Duration::from_millis(200);
            let (_dir, f, source, want, _io) = rig(Vec::new(), slow, (4, (8, 0)), &r);
            let (first, one) = reporting();
            f.read_ahead(want.rel.into(), &want.block(4), first);
            // Part 1 is in flight and counts as waiting in the buffer: no room there for part 2.
            let (second, two) = reporting();
            f.read_ahead(want.rel.into(), &want.block(8), second);
            assert_eq!(one.recv_timeout(Duration::from_secs(10)), Ok(Some(4 << 16)));
            let two = two.recv_timeout(Duration::from_millis(400)).ok();
            let kept = (4..12).filter(|&b| f.memory.contains(&want.block(b).key));
            (two, source.reads(), kept.count(), f.ahead.bytes())
        };
        // A cache with room for both parts and a buffer's worth more keeps them: part 2 is
        // read beside part 1, and neither waits in the buffer.
        assert_eq!(read_ahead_two(16 << 16), (Some(Some(4 << 16)), 2, 8, 0));
        // A cache without that room: part 2 waits for room in the buffer (not read at all).
        assert_eq!(read_ahead_two(8 << 16), (None, 1, 4, 0));
    }

    #[test]
    fn the_next_part_is_read_ahead_once_into_the_readahead_buffer() {
        // A cache with no room: the part waits for its reader in the readahead buffer.
        let ((_dir, f, source, want, _io), bytes) = parts_rig(0);
        let next = want.block(4);
        let (report, reported) = reporting();
        f.read_ahead(want.rel.into(), &next, report);
        assert_eq!(
            reported.recv_timeout(Duration::from_secs(10)).unwrap(),
            Some(4 << 16)
        );
        // Each block leaves flight once it is where the reader finds it (the own block as it
        // arrived, the last after the report).
        settle(&f, &want, 4..8);
        // Asked again while its blocks wait: nothing is read again.
        let (report, again) = reporting();
        f.read_ahead(want.rel.into(), &next, report);
        assert!(again.recv_timeout(Duration::from_millis(200)).is_err());
        assert_eq!(source.reads(), 1);
        take_left(&f, &want, 4..8, &bytes);
        assert_eq!(Counters::get(&f.stats.counters.readahead_unused_bytes), 0);
        // A directory source reads no parts, and nothing ahead.
        let (_dir, f, source, want, _io) = fetcher(Vec::new(), Duration::ZERO);
        let (report, none) = reporting();
        f.read_ahead(want.rel.into(), &want, report);
        assert!(none.recv_timeout(Duration::from_millis(200)).is_err());
        assert_eq!(source.reads(), 0);
    }

    #[test]
    fn readers_get_more_parts_at_once_beside_more_memory() {
        const MIB: u64 = 1 << 20;
        // A pod of 384 MiB (a staging budget of 24 MiB), of 256 and of 128; no pod.
        assert_eq!(parts_in_flight(24 * MIB, 8 * MIB), (8, 0));
        assert_eq!(parts_in_flight(16 * MIB, 8 * MIB), (6, 0));
        assert_eq!(parts_in_flight(8 * MIB, 8 * MIB), (4, 0));
        assert_eq!(parts_in_flight(256 * MIB, 8 * MIB), (8, 4));
        // Bigger parts, fewer at once.
        assert_eq!(parts_in_flight(24 * MIB, 32 * MIB), (4, 0));
    }
}
