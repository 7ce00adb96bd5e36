//! Parts of big objects: one ranged GET reads a block and the blocks after it to the end of
//! its part, hands each over as the body fills it, and leaves the rest in the readahead
//! buffer for the reader streaming through the object (see the header of `fetch`). How many
//! parts are read at once, how many parts a run spans ([`parts_per_run`]), which blocks a run
//! claims, and the runs read moments ago ([`Landed`]) are here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

/// Parts readers read at once at most: each holds the block its GET's body is filling, its
/// fetch's own block and a MiB of the body (3 MiB). Two readers each streaming a shard want 3 or
/// 4 each: the part they read and the two after it, read ahead, and the kernel's window
/// reaching into another.
pub const PARTS_IN_FLIGHT: usize = 8;

/// Parts readers read at once however short memory is: past them, blocks are read one by one
/// (a GET each).
pub const PARTS_IN_FLIGHT_MIN: usize = 4;

/// Parts read at once `(by readers, by the prefetcher)` beside a `--prefetch-memory` budget
/// of `budget` bytes, with parts of `part` bytes: readers get three parts for each part of
/// the budget, from [`PARTS_IN_FLIGHT_MIN`] to [`PARTS_IN_FLIGHT`] (in a memory cgroup the
/// budget is a sixteenth of its limit: 8 parts in a pod of 384 MiB, 24 MiB at their most,
/// which the elastic budget leaves room for, see [`Fetcher::parts_unfilled`]); the
/// prefetcher, whose parts land in the staging area, half of that, and none beside a budget
/// under 8 parts. Without a bound, the prefetcher's 16 fetches in flight following an order
/// hint each read a part, and a daemon with 300 MiB of cache was OOM-killed in a pod of 384
/// MiB. Shards from S3 in a pod of 384 MiB, 2 readers, epoch 1: paced at 100 MiB/s a stream,
/// 3.6-3.8 s with 4 parts at once, 3.4 s with 8; unpaced, 2.5 s and 2.1 s (fewer blocks read
/// alone: 108-245 GETs instead of 268-420).
pub fn parts_in_flight(budget: u64, part: u64) -> (usize, usize) {
    let part = part.max(1);
    let readers =
        (3 * budget / part).clamp(PARTS_IN_FLIGHT_MIN as u64, PARTS_IN_FLIGHT as u64) as usize;
    let prefetcher = if budget >= 8 * part { readers / 2 } else { 0 };
    (readers, prefetcher)
}

/// One run of a part's look at a stream of the store: the rate of its body after the first
/// block (`rest_bytes` in `rest`), in bytes a second, and its wait for the first byte
/// (`first`, which brought `first_bytes`, less their time at that rate), in seconds. None for
/// a run too short to tell (under a millisecond after its first block).
pub fn stream_sample(
    first: Duration,
    first_bytes: u64,
    rest: Duration,
    rest_bytes: u64,
) -> Option<(f64, f64)> {
    if rest < Duration::from_millis(1) || rest_bytes == 0 {
        return None;
    }
    let rate = rest_bytes as f64 / rest.as_secs_f64();
    let wait = (first.as_secs_f64() - first_bytes as f64 / rate).max(0.0);
    Some((rate, wait))
}

/// Runs a [`Stream`] judges the store by.
pub const STREAM_SAMPLES: usize = 8;

/// A stream of the store as the last [`STREAM_SAMPLES`] runs of parts saw it
/// ([`stream_sample`]): its bandwidth-delay product is their median rate times their
/// shortest wait. The shortest, as TCP's BBR takes a path's round trip: a wait is the store's
/// plus whatever held the answer up on the way, the daemon's threads waiting for a CPU among
/// them, and the store's own is the least of them. (Under two busy CPUs, a store paced at 40
/// MB/s after 30 ms, 1.2 MB, measured 5 MB smoothed, and 4.4 MB so: most of it was the S3
/// emulator behind it answering 80 ms later, starved of CPU too, a real product.) The median
/// rate, as one run's body read out of the socket's buffer at once says little of the
/// stream.
#[derive(Debug, Default)]
pub struct Stream {
    samples: parking_lot::Mutex<std::collections::VecDeque<(f64, f64)>>,
    /// The product the samples give, in bytes, for readers that take no lock.
    bdp: std::sync::atomic::AtomicU64,
}

impl Stream {
    /// Takes in a run's `(rate, wait)`, the oldest of the window leaving.
    pub fn note(&self, (rate, wait): (f64, f64)) {
        let mut samples = self.samples.lock();
        if samples.len() == STREAM_SAMPLES {
            samples.pop_front();
        }
        samples.push_back((rate, wait));
        let mut rates: Vec<f64> = samples.iter().map(|s| s.0).collect();
        rates.sort_by(f64::total_cmp);
        let wait = samples.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
        let bdp = rates[rates.len() / 2] * wait;
        self.bdp.store(bdp as u64, Ordering::Relaxed);
    }

    /// The bandwidth-delay product in bytes: 0 before a run was noted.
    pub fn bdp(&self) -> u64 {
        self.bdp.load(Ordering::Relaxed)
    }
}

/// Parts of `part` bytes a run spans, from the store's bandwidth-delay product `bdp`
/// ([`Stream`]): enough that a request's wait is at most a third of its time (a run of
/// twice the product), from one part to `most`. A part is sized for a cloud store's streams
/// (about 100 MB/s and 20-50 ms a request: a product of 2-5 MB), where parts read side by
/// side add up to a reader's speed. On a store whose one stream is fast (a server nearby) the
/// product passes a part, and parts read side by side bring no more bytes a second than one
/// run, only more requests and more threads taking turns: 32 shards of 24 MiB from a local S3
/// server answering after 20 ms (about 1.2 GB/s a stream, a product of 24 MiB), 2 readers in
/// a pod of 384 MiB on 2 CPUs, epoch 1: 1.00-1.05 s with three GETs of 8 MiB a shard,
/// 0.79-0.88 s with one of 24 MiB, against 0.60-0.66 s for a boto3 loop.
pub fn parts_per_run(bdp: u64, part: u64, most: u64) -> u64 {
    (2 * bdp).div_ceil(part.max(1)).clamp(1, most.max(1))
}

/// Blocks of `block` bytes a run spans with parts of `part_blocks`, the store's product `bdp`
/// ([`parts_per_run`]) and `room` bytes for it: the parts the product calls for, cut at the
/// last whole block the room holds, never under a part. Cut at a whole part instead, a run
/// lost a part whenever anything at all waited in the readahead buffer: a 24 MiB buffer
/// holding a few hundred KiB left 2 parts of a 3-part shard's run, its last part read by a
/// GET begun only when its reader had read half the run, its wait not hidden (shards from S3,
/// 20 ms a request, 2 readers in a 384 MiB pod: those shards took 63-86 ms against 40-50, in
/// one epoch of the three logged most of them; over 8 rounds of 3 epochs, 78.5 GETs a round
/// against 79.5 at the median, and no change in the epochs' times beyond the noise). A run cut a
/// block or two short of an object's end reaches it ([`run_end`]).
pub fn run_blocks_within(bdp: u64, part_blocks: u64, block: u64, room: u64) -> u64 {
    let part = part_blocks * block;
    let parts = parts_per_run(bdp, part, room.div_ceil(part.max(1)));
    (part_blocks * parts).min((room / block.max(1)).max(part_blocks))
}

/// Where a run that would end at block `end` of an object of `count` blocks, with parts of
/// `part_blocks`, ends: at the object's end if it would leave no more than a quarter of a part
/// (at least its last block) behind, for a GET of its own. Why: a GET's wait costs what a
/// part's body does, and objects are seldom a whole number of parts. Shards of a little over
/// 24 MiB from S3 (20 ms a request), runs of 24 MiB: an eighth of them took a second GET of
/// 4-200 KiB for their last block, 22-24 ms each, while their reader waited.
pub fn run_end(end: u64, count: u64, part_blocks: u64) -> u64 {
    if end + (part_blocks / 4).max(1) >= count {
        count
    } else {
        end
    }
}

/// How long a block a part's run read counts as read moments ago ([`Landed`]).
pub const LANDED_FOR: Duration = Duration::from_secs(1);

/// Blocks of parts' runs remembered at most ([`Landed`]): the last 32 parts of 8 blocks.
pub const LANDED_MAX: usize = 256;

/// The blocks that parts' runs read in the last [`LANDED_FOR`], at most [`LANDED_MAX`]: a
/// run that begins at a block the kernel asked for late does not reach over the blocks after
/// it that an earlier run read and handed over already. With the store answering at once,
/// READs of blocks 200 and 203 answered out of order read blocks 203-207 twice: 1-6% of an
/// epoch of shards in a pod.
#[derive(Default)]
pub(super) struct Landed(parking_lot::Mutex<std::collections::VecDeque<(BlockKey, Instant)>>);

impl Landed {
    pub(super) fn note(&self, key: BlockKey) {
        let mut landed = self.0.lock();
        if landed.len() == LANDED_MAX {
            landed.pop_front();
        }
        landed.push_back((key, Instant::now()));
    }

    pub(super) fn holds(&self, key: &BlockKey) -> bool {
        let now = Instant::now();
        let landed = self.0.lock();
        (landed.iter().rev())
            .take_while(|(_, at)| now.duration_since(*at) < LANDED_FOR)
            .any(|(k, _)| k == key)
    }
}

impl Fetcher {
    /// Reads blocks `lo..hi` of a part from the source in one request, `want.key` among them,
    /// and hands each block over as it arrives: offered to the cache and the tiers in front of
    /// the source, then to its waiters (the fetch's own block too, kept first where its
    /// reader's next read finds it), the rest of the part left in the readahead buffer unless
    /// kept or awaited. The part's last block waits for the fetch's report ([`ReadOut::last`]),
    /// so that a reader that has read the part has its bytes counted.
    pub(super) fn read_part(
        &self,
        want: &Want<'_>,
        (lo, hi): (u64, u64),
        ahead: bool,
        fallback: bool,
    ) -> ReadOut {
        let (source, nearer) = self.below.split_last().expect("a tier to read from");
        let b = want.key.block;
        let (mut bytes, mut next, mut own, mut last) = (0, lo, None, None);
        let began = Instant::now();
        let mut first = None;
        // A run sent ahead waited before its reader came: its first block's time is not the
        // store's wait, and would shrink the product the next runs are sized by to nothing.
        let sent_ahead = source.sent_ahead(&want.block(lo)).is_some();
        let run = source.get_run(&want.block(lo), hi - lo - 1, &mut |x, data| {
            next = x + 1;
            bytes += data.len() as u64;
            first.get_or_insert_with(|| (began.elapsed(), data.len() as u64));
            let w = want.block(x);
            self.landed.note(w.key);
            let kept = self.memory.admit(&w, &data);
            for tier in nearer {
                tier.admit_behind(&w, &data, &self.memory, kept);
            }
            if x + 1 == hi {
                // Handed over once the fetch has reported, the fetch's own or not.
                if x == b {
                    own = Some(data);
                } else {
                    last = Some((w.key, data, kept));
                }
            } else if x == b {
                self.keep_own(&w, &data, ahead);
                self.inflight.complete(&w.key, Ok(data.clone()));
                own = Some(data);
            } else {
                self.leave_for_reader(w.key, &data, kept);
                self.inflight.complete(&w.key, Ok(data));
            }
        });
        self.parts_in_flight.fetch_sub(1, Ordering::AcqRel);
        if ahead {
            (self.ahead_extra).fetch_sub(self.beyond_a_part(lo, hi), Ordering::AcqRel);
        }
        if let (Ok(()), Some((took, first_bytes)), false) = (&run, first, sent_ahead) {
            let rest = began.elapsed().saturating_sub(took);
            if let Some(sample) = stream_sample(took, first_bytes, rest, bytes - first_bytes) {
                self.stream.note(sample);
            }
        }
        if let Err(e) = &run {
            for other in (next..hi).filter(|&x| x != b) {
                self.inflight
                    .complete(&want.block(other).key, Err(e.clone()));
            }
        }
        let handed = own.is_some() && b + 1 != hi;
        let result = match (own, run) {
            (Some(block), _) => Ok(block),
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Err(DataError::Missing(source.name())),
        };
        ReadOut {
            result,
            origin: Origin::Source,
            fallback,
            bytes,
            first_block: lo == 0,
            handed,
            last,
        }
    }

    /// Leaves block `key` of a part, which a reader streaming through the file will read
    /// next, in the readahead buffer, unless the cache `kept` it or a reader waits for it.
    /// Put there before the key leaves flight, so that the reader finds it.
    pub(super) fn leave_for_reader(&self, key: BlockKey, data: &Arc<Block>, kept: bool) {
        if !kept && !self.inflight.awaited(&key) {
            self.ahead.put(key, data.clone());
        }
    }

    /// Keeps the fetch's own block, read for `want`, where the next read finds it, unless the
    /// cache did: read ahead of its reader and awaited by none, in the readahead buffer; read
    /// for a reader, among the recent blocks (a re-open finds it).
    pub(super) fn keep_own(&self, want: &Want<'_>, data: &Arc<Block>, ahead: bool) {
        if self.memory.contains(&want.key) {
            return;
        }
        if ahead && !self.inflight.awaited(&want.key) {
            self.ahead.put(want.key, data.clone());
        } else if want.why.is_read() {
            self.recent.admit(want, data);
        }
    }

    /// Claims for this fetch, which reads block `key`, the blocks of its part after it that
    /// nothing holds or reads (for a reader that streams, [`Want::stream`], or while the
    /// cache has room for them; else those asked for), and those before it that a fetch was
    /// started for and has not begun to read, up to the first on each side that is not so
    /// (see the module header); within a run sent ahead, the run as sent, every block of it
    /// that nothing holds or reads. Returns the run `lo..hi` to read, `key`'s block among
    /// them. Of two reads of one part that start together, the second finds the first's
    /// claims and waits for its GET. Called holding `claiming`.
    pub(super) fn claim_part(&self, want: &Want<'_>, ahead: bool) -> (u64, u64) {
        let (key, demand) = (&want.key, want.why.is_read());
        let b = key.block;
        if self.part_blocks <= 1 {
            return (b, b + 1);
        }
        // The parts in flight are memory: readers and the prefetcher get as many at once as
        // the budget allows ([`parts_in_flight`]); past that a block is read on its own.
        let most = if demand {
            self.parts_max.0
        } else {
            self.parts_max.1
        };
        let taken = self
            .parts_in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < most).then_some(n + 1)
            });
        let Ok(before) = taken else {
            return (b, b + 1);
        };
        let count = self.blocks.count(key.version.size);
        let (source, nearer) = self.below.split_last().expect("a tier to read from");
        // A run sent ahead ([`Fetcher::send_ahead`], from an object's first block) over the
        // block asked for is read as it was sent, from its first block: the kernel's READs of
        // a window come in any order, and a READ of a later block that read from its own part
        // would cut the run of the READ of the first, whose GET would then not be the one sent
        // (which went unread, and the object took two GETs).
        let sent = (source.sent_ahead(&want.block(0))).filter(|&more| b <= more);
        // Else a run begins at the part of the block asked for and spans the parts a run
        // calls for now ([`Fetcher::run_blocks`]).
        let (start, end) = match sent {
            Some(more) => (0, (more + 1).min(count)),
            None => {
                let start = b / self.part_blocks * self.part_blocks;
                let end = run_end(start + self.run_blocks(ahead), count, self.part_blocks);
                (start, end)
            }
        };
        // A block in flight whose fetch has not begun to read it is taken into the run: its
        // fetch will find it taken and leave it to this one.
        // A block a tier in front of the source holds (the disk tier) is read from there.
        // Before the block asked for, only blocks asked for too are taken: one nobody asks for
        // there is most likely one its reader has read already (a reader that streams through
        // the file asks for it again only if the kernel dropped it).
        // After a block read for the first time in a while, a block a run read moments ago is
        // not read again: its READ was answered before this one (the kernel's READs of a
        // window are answered out of order). A block read again (a new epoch) reads its part.
        let first_time = !self.landed.holds(key);
        let claim = |block, asked| {
            let other = want.block(block);
            !self.held_nearer(&other, nearer)
                && (asked || !first_time || !self.landed.holds(&other.key))
                && self.inflight.take(&other.key, asked)
        };
        // A reader that seeks gets the blocks asked for, not the rest of their part, unless
        // the cache has room to keep it (a reader of random records reads them all in time).
        let asked = !want.stream && !self.memory.has_room_for((end - b) * self.blocks.get());
        let mut hi = b + 1;
        while hi < end && claim(hi, asked) {
            hi += 1;
        }
        // Before it, a run sent ahead takes every block nothing else holds or reads, as its
        // GET reads them.
        let mut lo = b;
        while lo > start && claim(lo - 1, sent.is_none()) {
            lo -= 1;
        }
        // A run of one block (a small file, a part read already) is no part: its slot goes
        // back, and it counts for nothing in the memory parts take at their most.
        if hi - lo == 1 {
            self.parts_in_flight.fetch_sub(1, Ordering::AcqRel);
        } else {
            self.parts_peak.fetch_max(before + 1, Ordering::Relaxed);
            if ahead {
                (self.ahead_extra).fetch_add(self.beyond_a_part(lo, hi), Ordering::AcqRel);
            }
        }
        (lo, hi)
    }

    /// Sends ahead the request of the run that a read of `want` (an object's first block)
    /// would make ([`Tier::send_ahead`]), for an object that its job's order hint says it
    /// opens next and that the prefetcher leaves to its reader
    /// ([`Fetcher::prefetch_block_by_block`]): its open then finds the request's wait (20-50
    /// ms from a cloud store) behind it, and the body is read at the reader's pace as if it
    /// had asked. Nothing from a directory, nor for an object whose first block is read,
    /// cached, held nearer or read ahead already.
    pub fn send_ahead(&self, want: &Want<'_>) {
        if self.part_blocks <= 1 || want.key.block != 0 {
            return;
        }
        let (source, nearer) = self.below.split_last().expect("a tier to read from");
        // The run stops where its open's claim would (`claim_part`): at a block another tier
        // holds or a fetch reads (a shard partly cached in an earlier epoch). A GET of more
        // would not be that claim's, and would go unread.
        let held = |x: u64| {
            let w = want.block(x);
            self.held_nearer(&w, nearer) || self.in_flight(&w.key)
        };
        if held(0) || source.sent_ahead(want).is_some() {
            return;
        }
        let count = self.blocks.count(want.key.version.size);
        let end = run_end(self.run_blocks(false), count, self.part_blocks);
        let hi = (1..end).find(|&x| held(x)).unwrap_or(end);
        source.send_ahead(want, hi - 1);
    }

    /// True if block `want.key` is where a read finds it before the source: the cache, the
    /// readahead buffer, or a tier in `nearer` (the disk tier). A part's run stops there.
    fn held_nearer(&self, want: &Want<'_>, nearer: &[Arc<dyn Tier>]) -> bool {
        self.memory.contains(&want.key)
            || self.ahead.contains(&want.key)
            || nearer.iter().any(|t| t.holds(want))
    }

    /// True if one stream of the store brings a part in a request's wait (its
    /// [`Fetcher::stream_bdp`] is a part or more: a store nearby), so that a reader with one
    /// read in flight gets its speed from the runs read for it, with no readahead of the
    /// kernel's beside them. From a cloud store's streams (100 MB/s after 20-50 ms, 2-5 MB),
    /// a reader's speed is that of the parts read side by side for the kernel's readahead
    /// window, many READs in flight; false before a run was measured, and for a directory.
    pub fn streams_a_part(&self) -> bool {
        self.part_blocks > 1 && self.stream.bdp() >= self.part_blocks * self.blocks.get()
    }

    /// Blocks of a part (1 for a directory source).
    pub fn part_blocks(&self) -> u64 {
        self.part_blocks
    }

    /// The store's bandwidth-delay product for one stream, as the last runs of parts measured
    /// it ([`Stream`]), in bytes; 0 before a run was read.
    pub fn stream_bdp(&self) -> u64 {
        self.stream.bdp()
    }

    /// Blocks a run spans now: a part's blocks times the parts the store's streams call for
    /// ([`parts_per_run`]), within the room for them. A run's blocks that the cache does not
    /// keep and no READ waits for yet wait in the readahead buffer, so while the cache has no
    /// room for the run, a reader's run takes at most the room the buffer has beside the
    /// blocks waiting there, and a run read `ahead` of its reader (all of whose blocks may
    /// wait) the room beside those and the other runs read ahead in flight
    /// ([`Fetcher::ahead_waiting`]). (Runs of the whole buffer whatever it held pushed out
    /// blocks in a 320 MiB pod before their readers took them: epoch 1 read 1.06x the
    /// dataset.)
    fn run_blocks(&self, ahead: bool) -> u64 {
        if self.part_blocks <= 1 {
            return self.part_blocks;
        }
        let part = self.part_blocks * self.blocks.get();
        let buffer = self.ahead.capacity();
        let room = if self.memory.has_room_for(buffer) {
            buffer
        } else if ahead {
            // This run is among those in flight, counted as a part.
            (buffer + part).saturating_sub(self.ahead_waiting())
        } else {
            buffer.saturating_sub(self.ahead.bytes())
        };
        run_blocks_within(self.stream.bdp(), self.part_blocks, self.blocks.get(), room)
    }

    /// Bytes that wait, or will, in the readahead buffer: its blocks, and those of the runs
    /// read ahead in flight (a part each, and the blocks of longer ones beyond it).
    pub(super) fn ahead_waiting(&self) -> u64 {
        let block = self.blocks.get();
        let runs = self.ahead_in_flight.load(Ordering::Acquire) as u64 * self.part_blocks;
        self.ahead.bytes() + (runs + self.ahead_extra.load(Ordering::Acquire)) * block
    }

    /// Blocks of run `lo..hi` beyond a part.
    fn beyond_a_part(&self, lo: u64, hi: u64) -> u64 {
        (hi - lo).saturating_sub(self.part_blocks)
    }

    /// True if a file of `size` bytes is an object the prefetcher would read block by block,
    /// one GET each: bigger than a part, where the prefetcher gets no parts of its own (beside
    /// a budget under 8 parts, see [`parts_in_flight`]).
    pub fn prefetch_block_by_block(&self, size: u64) -> bool {
        self.part_blocks > 1 && self.parts_max.1 == 0 && size > self.part_blocks * self.blocks.get()
    }

    /// Block `key` if a part's read left it for its reader: it leaves the buffer.
    pub fn take_ahead(&self, key: &BlockKey) -> Option<Arc<Block>> {
        // A directory source reads block by block: nothing is ever left there, and a read
        // need not take the buffer's lock to learn it.
        if self.part_blocks <= 1 {
            return None;
        }
        self.ahead.take(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_run_s_sample_is_the_body_s_rate_and_the_wait_before_it() {
        // 20 ms, then a MiB a millisecond: the first MiB after 21 ms, 23 MiB more in 23 ms.
        let first = Duration::from_millis(21);
        let (rate, wait) = stream_sample(first, MIB, Duration::from_millis(23), 23 * MIB).unwrap();
        assert!((rate - 1000.0 * MIB as f64).abs() < MIB as f64, "{rate}");
        assert!((wait - 0.020).abs() < 0.0001, "{wait}");
        // A body too quick to time, or none, tells nothing.
        assert_eq!(
            stream_sample(first, MIB, Duration::from_micros(500), MIB),
            None
        );
        assert_eq!(stream_sample(first, MIB, Duration::from_millis(5), 0), None);
        // A first block slower than the rest (no wait at all) is no negative wait.
        assert_eq!(
            stream_sample(Duration::ZERO, MIB, Duration::from_millis(10), MIB),
            Some((100.0 * MIB as f64, 0.0))
        );
    }

    #[test]
    fn a_stream_s_product_is_its_median_rate_times_its_shortest_wait() {
        let stream = Stream::default();
        assert_eq!(stream.bdp(), 0);
        // 40 MB/s after 30 ms: 1.2 MB.
        stream.note((40e6, 0.030));
        assert_eq!(stream.bdp(), 1_200_000);
        // Answers held up on a busy machine (90 ms) and a body read at once out of the
        // socket's buffer (1 GB/s) move it not at all.
        stream.note((40e6, 0.090));
        stream.note((1e9, 0.090));
        assert_eq!(stream.bdp(), 1_200_000);
        // A store that got slower for good: once the window holds only its runs.
        for _ in 0..STREAM_SAMPLES {
            stream.note((20e6, 0.050));
        }
        assert_eq!(stream.bdp(), 1_000_000);
    }

    #[test]
    fn a_run_spans_twice_the_product_in_parts_within_its_bounds() {
        // A cloud store's stream: 100 MB/s after 30 ms, 3 MB: a part.
        assert_eq!(parts_per_run(3_000_000, 8 * MIB, 3), 1);
        assert_eq!(parts_per_run(0, 8 * MIB, 3), 1);
        // A server nearby at 1.2 GB/s after 20 ms: 24 MB, as many parts as the buffer holds.
        assert_eq!(parts_per_run(6 * MIB, 8 * MIB, 3), 2);
        assert_eq!(parts_per_run(24 * MIB, 8 * MIB, 3), 3);
        assert_eq!(parts_per_run(24 * MIB, 8 * MIB, 0), 1);
    }

    #[test]
    fn a_run_short_of_room_ends_at_the_last_block_that_fits_not_the_last_whole_part() {
        // A nearby store (a product of 30 MiB), parts of 8 blocks of 1 MiB.
        let run = |room| run_blocks_within(30 * MIB, 8, MIB, room);
        // Room for every part the product calls for: 3 parts.
        assert_eq!(run(24 * MIB), 24);
        // A few hundred KiB waiting in a 24 MiB buffer: 23 blocks, and a 24-block shard is
        // read whole by one GET (2 parts and a second GET before).
        assert_eq!(run(24 * MIB - 300 * 1024), 23);
        assert_eq!(run_end(run(24 * MIB - 300 * 1024), 24, 8), 24);
        // 17.5 MiB of room: 17 blocks, the rest of a 24-block shard a GET of its own.
        assert_eq!(run(17 * MIB + MIB / 2), 17);
        assert_eq!(run_end(17, 24, 8), 17);
        // Never under a part, whatever the room.
        assert_eq!(run(3 * MIB), 8);
        assert_eq!(run(0), 8);
        // A cloud store's product (3 MB) asks for one part, however much room.
        assert_eq!(run_blocks_within(3_000_000, 8, MIB, 24 * MIB), 8);
        assert_eq!(run_blocks_within(3_000_000, 8, MIB, 23 * MIB), 8);
    }

    #[test]
    fn a_run_takes_the_object_s_last_blocks_rather_than_leave_them_a_get_of_their_own() {
        // A shard a little over 24 MiB: 25 blocks, runs of 3 parts of 8.
        assert_eq!(run_end(24, 25, 8), 25);
        assert_eq!(run_end(23, 25, 8), 25);
        // More than a quarter of a part left: a run of its own.
        assert_eq!(run_end(24, 27, 8), 24);
        assert_eq!(run_end(8, 64, 8), 8);
        // Short of the end already, or parts of a block or two: the last block still joins.
        assert_eq!(run_end(30, 25, 8), 25);
        assert_eq!(run_end(4, 5, 2), 5);
        assert_eq!(run_end(3, 5, 2), 3);
    }
}
