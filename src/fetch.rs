//! Fetching blocks from the source: the one path by which file data leaves the source.
//!
//! A fetch runs on the I/O pool, never on a FUSE thread, so a slow source cannot hold up
//! hits. Concurrent fetches of one block are merged ([`Inflight`]): a demand read that finds
//! a prefetch (or another reader) already fetching the block waits for that fetch instead of
//! reading the source again. A fetched block is offered to the cache, then handed to every
//! waiter, whether or not the cache admitted it.
//!
//! Memory: a fetch holds one block-sized buffer until its waiters are done, so the bytes in
//! flight are bounded by the I/O threads times the block size (64 x 1 MiB by default).

use std::path::Path;
use std::sync::Arc;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use crate::cache::inflight::{Inflight, Waiter};
use crate::cache::{BlockCache, BlockKey};
use crate::prefetch::Pacer;
use crate::source::DatasetSource;
use crate::stats::{Counters, Stats};

/// The bytes of a fetched block, or the errno of the failure.
pub type FetchResult = Result<Arc<Vec<u8>>, i32>;

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
    stats: Arc<Stats>,
    inflight: Inflight<BlockKey, FetchResult>,
    io: tokio::runtime::Handle,
    /// Reads of the source in flight, all and demand only.
    reading: AtomicUsize,
    demand: AtomicUsize,
    /// Learns from every read how deep a queue the storage takes (see [`Pacer`]); None
    /// without prefetch, which is all it paces.
    pacer: Option<Mutex<Pacer>>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("inflight", &self.inflight)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// A fetcher that reads `source` on the `io` pool into `cache`; prefetch may have up to
    /// `depth` reads in flight (None: no prefetch).
    pub fn new(
        source: Arc<dyn DatasetSource>,
        cache: Arc<BlockCache>,
        stats: Arc<Stats>,
        io: tokio::runtime::Handle,
        depth: Option<usize>,
    ) -> Self {
        Fetcher {
            source,
            cache,
            stats,
            inflight: Inflight::default(),
            io,
            reading: AtomicUsize::new(0),
            demand: AtomicUsize::new(0),
            pacer: depth.map(|d| Mutex::new(Pacer::new(d))),
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
        let this = self.clone();
        self.io.spawn_blocking(move || {
            let result = this.read(&rel, key, admit);
            if let Some(pacer) = &this.pacer {
                let mut pacer = pacer.lock();
                let before = pacer.window();
                pacer.record(issued.elapsed().as_secs_f64(), crowd);
                if pacer.window() != before {
                    tracing::info!(
                        "prefetch window {} -> {} ({})",
                        before,
                        pacer.window(),
                        pacer.describe()
                    );
                }
            }
            this.reading.fetch_sub(1, Ordering::Relaxed);
            if demand {
                this.demand.fetch_sub(1, Ordering::Relaxed);
            }
            if let (Ok(bytes), Some(account)) = (&result, account) {
                account(bytes.len() as u64);
            }
            this.inflight.complete(&key, result);
        });
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
        let mut buf = vec![0u8; len];
        let counters = &self.stats.counters;
        match self.source.read_block(rel, &key.version, offset, &mut buf) {
            Ok(n) => {
                Counters::add(&counters.bytes_from_source, n as u64);
                if n < len {
                    // The file shrank since it was opened: serve nothing stale.
                    Counters::add(&counters.source_errors, 1);
                    return Err(libc::ESTALE);
                }
                if admit {
                    self.cache.insert(key, &buf);
                }
                Ok(Arc::new(buf))
            }
            Err(e) => {
                Counters::add(&counters.source_errors, 1);
                tracing::warn!("reading {}: {e}", rel.display());
                Err(e.raw_os_error().unwrap_or(libc::EIO))
            }
        }
    }
}
