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

use crate::cache::inflight::{Inflight, Waiter};
use crate::cache::{BlockCache, BlockKey};
use crate::source::DatasetSource;
use crate::stats::{Counters, Stats};

/// The bytes of a fetched block, or the errno of the failure.
pub type FetchResult = Result<Arc<Vec<u8>>, i32>;

/// Called with the bytes a fetch read from the source, by the caller that started it.
pub type Account = Box<dyn FnOnce(u64) + Send>;

/// Reads blocks from the source for the cache and its readers.
pub struct Fetcher {
    source: Arc<dyn DatasetSource>,
    cache: Arc<BlockCache>,
    stats: Arc<Stats>,
    inflight: Inflight<BlockKey, FetchResult>,
    io: tokio::runtime::Handle,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("inflight", &self.inflight)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// A fetcher that reads `source` on the `io` pool into `cache`.
    pub fn new(
        source: Arc<dyn DatasetSource>,
        cache: Arc<BlockCache>,
        stats: Arc<Stats>,
        io: tokio::runtime::Handle,
    ) -> Self {
        Fetcher {
            source,
            cache,
            stats,
            inflight: Inflight::default(),
            io,
        }
    }

    /// Hands block `key` of the file at `rel` to `waiter`, fetching it unless a fetch is in
    /// flight. If this call starts the fetch, `account` receives the bytes it read, and the
    /// block is offered to the cache if `admit`.
    pub fn fetch(
        self: &Arc<Self>,
        rel: Arc<Path>,
        key: BlockKey,
        waiter: Waiter<FetchResult>,
        account: Option<Account>,
        admit: bool,
    ) {
        if !self.inflight.join(&key, waiter) {
            return;
        }
        let this = self.clone();
        self.io.spawn_blocking(move || {
            let result = this.read(&rel, key, admit);
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
