//! Fetching blocks from the source: the one path by which file data leaves the source.
//!
//! A fetch runs on the I/O pool, never on a FUSE thread, so a slow source cannot hold up
//! hits. Concurrent fetches of one block are merged ([`Inflight`]): a demand read that finds
//! a prefetch (or another reader) already fetching the block waits for that fetch instead of
//! reading the source again. A fetched block is offered to the cache, then handed to every
//! waiter, whether or not the cache admitted it. A block a reader asked for that the cache
//! did not admit is also kept a moment ([`RecentBlocks`]), before the waiters run, so that a
//! second open of the file right after finds it (see [`crate::cache::recent`]). A fetch
//! whose read panics still ends: its waiters get EIO and the block is no longer in flight.
//!
//! Memory: a fetch holds one block-sized buffer until its waiters are done, so the bytes in
//! flight are bounded by the I/O threads times the block size (64 x 1 MiB by default). The
//! buffer is a [`Block`] ([`crate::block`]), which the source can read into with `O_DIRECT`.

use std::path::Path;
use std::sync::Arc;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use crate::block::{Block, MAP_FROM};
use crate::cache::inflight::{Inflight, Waiter};
use crate::cache::recent::RecentBlocks;
use crate::cache::{BlockCache, BlockKey};
use crate::prefetch::Pacer;
use crate::source::DatasetSource;
use crate::stats::{Counters, Stats};

/// The bytes of a fetched block, or the errno of the failure.
pub type FetchResult = Result<Arc<Block>, i32>;

/// Called with the bytes a fetch read from the source, by the caller that started it.
pub type Account = Box<dyn FnOnce(u64) + Send>;

/// Who asks for a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchKind {
    /// A reader waits for it; the cache may admit it.
    Demand,
    /// The prefetcher guesses it will be read; the cache may admit it if `admit`.
    Prefetch { admit: bool },
}

/// Reads blocks from the source for the cache and its readers.
pub struct Fetcher {
    source: Arc<dyn DatasetSource>,
    cache: Arc<BlockCache>,
    recent: Arc<RecentBlocks>,
    stats: Arc<Stats>,
    inflight: Inflight<BlockKey, FetchResult>,
    io: tokio::runtime::Handle,
    /// Reads of the source in flight, all and demand only.
    reading: AtomicUsize,
    demand: AtomicUsize,
    /// Learns from every read how deep a queue the storage takes (see [`Pacer`]); None
    /// without prefetch, which is all it paces.
    pacer: Option<Mutex<Pacer>>,
    /// Smoothed latency of demand reads, in microseconds (see [`INLINE_BELOW_US`]).
    demand_latency_us: AtomicU64,
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

/// The average of demand read latencies after a read that took `took_us`: mostly the last
/// eight reads.
pub fn smoothed(avg_us: u64, took_us: u64) -> u64 {
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
    /// A fetcher that reads `source` on the `io` pool into `cache` (and `recent`, what it
    /// does not admit of demand reads); prefetch may have up to `depth` reads in flight
    /// (None: no prefetch).
    pub fn new(
        source: Arc<dyn DatasetSource>,
        cache: Arc<BlockCache>,
        recent: Arc<RecentBlocks>,
        stats: Arc<Stats>,
        io: tokio::runtime::Handle,
        depth: Option<usize>,
    ) -> Self {
        Fetcher {
            source,
            cache,
            recent,
            stats,
            inflight: Inflight::default(),
            io,
            reading: AtomicUsize::new(0),
            demand: AtomicUsize::new(0),
            pacer: depth.map(|d| Mutex::new(Pacer::new(d))),
            demand_latency_us: AtomicU64::new(0),
        }
    }

    /// True once the storage was judged bandwidth-bound (see [`Pacer`]).
    pub fn bandwidth_bound(&self) -> bool {
        self.pacer
            .as_ref()
            .is_some_and(|p| p.lock().bandwidth_bound())
    }

    /// Prefetch reads that may be in flight now: what the pacer allows beside the demand
    /// reads in flight (none without prefetch).
    pub fn prefetch_allowed(&self) -> usize {
        self.pacer
            .as_ref()
            .map_or(0, |p| p.lock().allowed(self.demand.load(Ordering::Relaxed)))
    }

    /// Hands block `key` of the file at `rel` to `waiter`, fetching it unless a fetch is in
    /// flight. If this call starts the fetch, `account` receives the bytes it read, and the
    /// block is offered to the cache as `kind` allows.
    pub fn fetch(
        self: &Arc<Self>,
        rel: Arc<Path>,
        key: BlockKey,
        waiter: Waiter<FetchResult>,
        account: Option<Account>,
        kind: FetchKind,
    ) {
        if !self.inflight.join(&key, waiter) {
            return;
        }
        let demand = kind == FetchKind::Demand;
        let admit = match kind {
            FetchKind::Demand => true,
            FetchKind::Prefetch { admit } => admit,
        };
        let crowd = self.reading.fetch_add(1, Ordering::Relaxed) + 1;
        if demand {
            self.demand.fetch_add(1, Ordering::Relaxed);
        }
        let issued = Instant::now();
        let inline = demand
            && runs_inline(
                self.cache.block_len(key.version.size, key.block),
                self.demand_latency_us.load(Ordering::Relaxed),
            );
        let this = self.clone();
        let work = move || {
            let mut running = Running {
                fetcher: &this,
                key,
                demand,
                counted: true,
                done: false,
            };
            let result = this.read(&rel, key, admit);
            if demand {
                // An average over the last few reads: a slow one alone does not move it far.
                let took = issued.elapsed().as_micros().min(u128::from(u32::MAX)) as u64;
                let _ = this.demand_latency_us.fetch_update(
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                    |avg| Some(smoothed(avg, took)),
                );
            }
            if let Some(pacer) = &this.pacer {
                let mut pacer = pacer.lock();
                let before = pacer.window();
                pacer.record(issued.elapsed().as_secs_f64(), crowd);
                if pacer.window() != before {
                    tracing::debug!(
                        "prefetch window {} -> {} ({})",
                        before,
                        pacer.window(),
                        pacer.describe()
                    );
                }
            }
            running.uncount();
            if let (Ok(bytes), Some(account)) = (&result, account) {
                account(bytes.len() as u64);
            }
            if demand
                && let Ok(bytes) = &result
                && !this.cache.contains(&key)
            {
                this.recent.put(key, bytes);
            }
            running.complete(result);
        };
        if inline {
            // A panic in the read is the pool's to contain when it runs there; here, the
            // FUSE thread's. Its readers get EIO either way (`Running`).
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        } else {
            self.io.spawn_blocking(work);
        }
    }

    /// True if block `key` is being fetched.
    pub fn in_flight(&self, key: &BlockKey) -> bool {
        self.inflight.contains(key)
    }

    fn read(&self, rel: &Path, key: BlockKey, admit: bool) -> FetchResult {
        let size = key.version.size;
        let len = self.cache.block_len(size, key.block) as usize;
        let offset = key.block * self.cache.block_size();
        tracing::debug!("fetch {} block {} ({len} bytes)", rel.display(), key.block);
        if len < MAP_FROM {
            // Read into this thread's scratch page(s), keep a copy of exactly `len` bytes.
            return SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                let buf = match &mut *scratch {
                    Some(b) => b,
                    None => match Block::zeroed(MAP_FROM) {
                        Ok(b) => scratch.insert(b),
                        Err(_) => return Err(libc::ENOMEM),
                    },
                };
                let whole = &mut buf.whole_mut()[..Block::footprint_for(len) as usize];
                let n = self.read_into(rel, &key, offset, whole)?;
                let block = Block::exact(&whole[..n.min(len)]);
                self.finish(key, block, len, admit)
            });
        }
        let mut block = match Block::zeroed(len) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("no memory for a block of {}: {e}", rel.display());
                return Err(libc::ENOMEM);
            }
        };
        let n = self.read_into(rel, &key, offset, block.whole_mut())?;
        block.truncate(n.min(len));
        self.finish(key, block, len, admit)
    }

    /// Reads block `key` (at `offset`) into `buf`, whole pages of it, so that an O_DIRECT
    /// read may ask for them; the file ends at the block's length unless it grew, which the
    /// source's version check reports. Returns the bytes read.
    fn read_into(
        &self,
        rel: &Path,
        key: &BlockKey,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, i32> {
        let counters = &self.stats.counters;
        match self.source.read_block(rel, &key.version, offset, buf) {
            Ok(n) => Ok(n),
            Err(e) => {
                Counters::add(&counters.source_errors, 1);
                tracing::warn!("reading {}: {e}", rel.display());
                Err(e.raw_os_error().unwrap_or(libc::EIO))
            }
        }
    }

    /// Accounts a block read from the source and offers it to the cache; a block shorter
    /// than `len` (the file shrank since it was opened) is an error: nothing stale is served.
    fn finish(&self, key: BlockKey, block: Block, len: usize, admit: bool) -> FetchResult {
        let counters = &self.stats.counters;
        Counters::add(&counters.bytes_from_source, block.len() as u64);
        if block.len() < len {
            Counters::add(&counters.source_errors, 1);
            return Err(libc::ESTALE);
        }
        if admit {
            self.cache.insert(key, &block);
        }
        Ok(Arc::new(block))
    }
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
            self.fetcher.inflight.complete(&self.key, Err(libc::EIO));
        }
    }
}

thread_local! {
    /// Each I/O thread's page-aligned buffer for reads of small blocks (at most 64 threads x
    /// 64 KiB).
    static SCRATCH: std::cell::RefCell<Option<Block>> = const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_demand_reads_run_inline_only_while_the_storage_answers_fast() {
        // A local disk: 100-300 us a read, forever inline.
        let mut avg = 0;
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
}
