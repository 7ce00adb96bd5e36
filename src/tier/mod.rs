//! The read path as a chain of tiers: the places a block can come from, nearest first.
//!
//! ```text
//!  read of block b of an open file
//!    │  FUSE thread
//!    ├─ memory    the cache (crate::cache), lent in place      memory.rs
//!    ├─ the open file's own blocks (taken from staging or recent, or fetched for it)
//!    ├─ staging   fetched ahead for a job, or kept for jobs     staging.rs
//!    │            that will read it this epoch
//!    ├─ recent    read moments ago, for a re-read only          recent.rs
//!    │  I/O pool (or the FUSE thread while storage is fast), one fetch per block
//!    └─ fetch ──► local disk ──► peers ──► source          fetch/, disk/, peer.rs,
//!                                                              source.rs
//! ```
//!
//! Each tier is one type behind [`Tier`]: `get` a block, `admit` one offered from below,
//! `remove` one a reader got another way. What a tier needs to decide (the reader's job and
//! epoch, whether it reads or the prefetcher guesses) comes in a [`Want`]. The tiers know
//! nothing of each other; the callers walk them: the read path (`crate::fs`) the ones on the
//! FUSE thread, [`fetch::Fetcher`] the ones behind the fetch, and each caller offers what it
//! found to the tiers that keep such blocks. Concurrent misses of one block are merged into
//! one fetch ([`inflight`]), so a block is read from below once however many wait for it.
//!
//! Tiers fail open ([`look_up`]): a fault of any tier but the last (the source) is a
//! warning, a count (`tier_errors`) and a miss, and the next tier is asked. Only the source's
//! faults reach the reader. A fault is a [`DataError`] ([`error`]), which keeps its cause (an
//! I/O error, a store's answer, a peer's) for the log and maps to the reader's errno.
//!
//! Lookups cost what they cost before the chain: a call through `&dyn Tier` per tier asked,
//! no allocation, and the memory tier lends its bytes without a copy or a reference count.

pub mod ahead;
pub mod disk;
pub mod error;
pub mod fetch;
pub mod inflight;
pub mod memory;
pub mod peer;
pub mod recent;
pub mod source;
pub mod staging;

use std::path::Path;
use std::sync::Arc;

use crate::block::Block;
use crate::cache::{BlockCache, BlockKey, CachedBytes};
use crate::jobs::JobKey;
use crate::source::DatasetSource;
use crate::stats::{Counters, Stats};
pub use error::DataError;
use fetch::Fetcher;
use recent::RecentBlocks;
use source::SourceTier;
use staging::Staging;

/// Why a block is wanted: what a tier decides by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// A reader reads it.
    Read,
    /// A reader re-reads what its job read moments ago (a check and a decode, two workers
    /// sharing a file): the same access, which the recent blocks may serve.
    Reread,
    /// The prefetcher fetches it ahead of the reader.
    Prefetch,
    /// A reader took it from the staging area.
    Claimed,
    /// Another member of the cluster asked for it, since this one owns its file: a read like
    /// a reader's, that no peer is asked for (see [`peer`]).
    Peer,
}

impl Why {
    /// True if a reader waits for the block (here, or on another member).
    pub fn is_read(self) -> bool {
        matches!(self, Why::Read | Why::Reread | Why::Peer)
    }
}

/// A block, who wants it and why.
#[derive(Clone, Copy, Debug)]
pub struct Want<'a> {
    pub key: BlockKey,
    /// The file's path relative to the source root, for tiers that read it.
    pub rel: &'a Path,
    /// The job that reads, or that the prefetcher fetches for.
    pub job: JobKey,
    /// The job's epoch the block is for (the staging area files it under it).
    pub epoch: u64,
    pub why: Why,
    /// Its reader streams through the file from here (or the prefetcher reads the file): a
    /// read of an object runs on to the end of the block's part. A reader that seeks reads
    /// the blocks asked for alone ([`fetch`]).
    pub stream: bool,
}

impl<'a> Want<'a> {
    /// The same want for block `block` of the file.
    pub fn block(&self, block: u64) -> Want<'a> {
        Want {
            key: BlockKey {
                version: self.key.version,
                block,
            },
            ..*self
        }
    }

    /// The same want, wanted for another reason.
    pub fn because(&self, why: Why) -> Want<'a> {
        Want { why, ..*self }
    }
}

/// What a tier found, and who keeps it.
#[derive(Debug)]
pub enum Found<'a> {
    /// Bytes the tier keeps and lends for the read (the cache).
    Lent(CachedBytes<'a>),
    /// A block the reader may hold on to until it closes the file.
    Block(Arc<Block>),
    /// Every block of the file that the tier handed over at once, the one wanted among them,
    /// by block number: the staging area gives a reader all that its job staged of a file, so
    /// that they leave together.
    File(Vec<(u64, Arc<Block>)>),
}

/// A place blocks can come from.
pub trait Tier: Send + Sync {
    /// The tier's name, for the log.
    fn name(&self) -> &'static str;

    /// What the blocks this tier finds count as, behind the fetch.
    fn origin(&self) -> fetch::Origin {
        fetch::Origin::Source
    }

    /// Block `want.key`, if this tier holds it for `want`. `Err` is a fault of the tier, not
    /// a miss: the caller counts it and asks the next tier.
    fn get(&self, want: &Want<'_>) -> Result<Option<Found<'_>>, DataError>;

    /// Block `want.key` and the `more` blocks after it, read at once (one request to an
    /// object store, see [`fetch`]'s parts), each handed to `each` with its number as soon as
    /// it is read, in order; a failure fails those not handed over. Only the source is asked
    /// for runs; a tier that cannot read one says so (EOPNOTSUPP).
    fn get_run(
        &self,
        _want: &Want<'_>,
        _more: u64,
        _each: &mut dyn FnMut(u64, Arc<Block>),
    ) -> Result<(), DataError> {
        Err(DataError::NoRuns(self.name()))
    }

    /// Sends now the run of `want.key` and the `more` blocks after it that a reader is
    /// expected to ask for soon ([`crate::source::DatasetSource::send_ahead`]): its
    /// [`Tier::get_run`] then finds the request's wait behind it. Only the source sends runs
    /// ahead; by default nothing.
    fn send_ahead(&self, _want: &Want<'_>, _more: u64) {}

    /// The blocks after `want.key` of the run sent ahead from it, if one waits: a
    /// [`Tier::get_run`] of exactly those takes it.
    fn sent_ahead(&self, _want: &Want<'_>) -> Option<u64> {
        None
    }

    /// Each block of `wants` (whole small files, under `crate::block::MAP_FROM` bytes), read
    /// together where the tier can ([`Tier::reads_together`]), else one [`Tier::get`] each.
    fn get_small(&self, wants: &[Want<'_>]) -> Vec<Result<Option<Found<'_>>, DataError>> {
        wants.iter().map(|want| self.get(want)).collect()
    }

    /// True if [`Tier::get_small`] reads its files together (a directory source, see
    /// `crate::source::ring`).
    fn reads_together(&self) -> bool {
        false
    }

    /// True if the tier holds block `want.key` (or will, as soon as a write queued now lands),
    /// as far as it can tell without reading it: a part's run leaves such blocks out, to be
    /// read from here. A tier that cannot tell cheaply (a peer) says false.
    fn holds(&self, _want: &Want<'_>) -> bool {
        false
    }

    /// False if [`Tier::get`] would surely find nothing for `want`, as far as the tier can
    /// tell without asking anyone: a fetch that no tier in front of the source may serve
    /// claims its part's run at once (see [`fetch`]'s parts). A tier that holds blocks says
    /// what [`Tier::holds`] says.
    fn may_find(&self, want: &Want<'_>) -> bool {
        self.holds(want)
    }

    /// Offers `data`, found below this tier, as block `want.key`; the tier keeps it if it
    /// keeps blocks wanted for `want.why`. Returns true if it kept it.
    fn admit(&self, want: &Want<'_>, data: &Arc<Block>) -> bool;

    /// Offers `data`, read from the source as block `want.key`, after the memory tier was
    /// offered it: `kept` says if `memory` kept it. A tier that keeps first what memory does
    /// not (the disk tier) decides by that; the others as [`Tier::admit`].
    fn admit_behind(
        &self,
        want: &Want<'_>,
        data: &Arc<Block>,
        _memory: &BlockCache,
        _kept: bool,
    ) -> bool {
        self.admit(want, data)
    }

    /// Offers `data`, which this tier found as block `want.key`, to the memory cache above
    /// it; returns true if memory kept it. A tier whose blocks memory need not copy (the disk
    /// tier) decides by that; the others offer every block.
    fn offer_to_memory(&self, want: &Want<'_>, data: &Arc<Block>, memory: &BlockCache) -> bool {
        memory.admit(want, data)
    }

    /// Forgets block `want.key` for `want`: its reader got the bytes another way, or they
    /// must not be served again.
    fn remove(&self, want: &Want<'_>);
}

/// Parts the readahead buffer holds at most ([`ahead::Ahead`]): the rest of the part being
/// read for a few readers; the kernel's readahead asks for most blocks of a part while its GET
/// runs, so that little waits there.
pub const AHEAD_PARTS: u64 = 4;

/// The tiers of one mount, shared by the read path and the prefetcher.
#[derive(Clone, Debug)]
pub struct Tiers {
    pub memory: Arc<BlockCache>,
    pub staging: Arc<Staging>,
    pub recent: Arc<RecentBlocks>,
    /// The disk tier (`--cache-dir`), if any: behind the fetch, in front of peers and source.
    pub disk: Option<Arc<disk::DiskTier>>,
    /// One fetch per block, from the tiers behind it.
    pub fetcher: Arc<Fetcher>,
}

impl Tiers {
    /// The chain of a mount: `memory` in front, a staging area of `staging` bytes, the
    /// recent blocks (kept only if the cache keeps anything: `--policy none` is the kernel's
    /// page cache alone), and fetches on the `io` pool, counted in `stats`: from `disk` if it
    /// holds the block, else from the member of `cluster` that owns the file, if it is
    /// another, else from `source`. In a cluster, the cache keeps only the files this member
    /// owns. A source read of a big file reads the rest of its part of `part_size` bytes
    /// with it (object stores; 0, or the block size, reads block by block), with parts in
    /// flight and read ahead sized to `part_memory` (the `--prefetch-memory` budget, which
    /// is set even when prefetch is off).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        memory: BlockCache,
        staging: u64,
        (part_size, part_memory): (u64, u64),
        disk: Option<Arc<disk::DiskTier>>,
        source: Arc<dyn DatasetSource>,
        cluster: Option<&crate::cluster::ClusterConfig>,
        stats: Arc<Stats>,
        io: tokio::runtime::Handle,
    ) -> Self {
        let memory = Arc::new(memory);
        let blocks = memory.blocks();
        let recent = Arc::new(RecentBlocks::new(memory.caches()));
        let mut below: Vec<Arc<dyn Tier>> = Vec::new();
        if let Some(d) = &disk {
            below.push(d.clone());
        }
        if let Some(c) = cluster {
            let owns = c.membership.clone();
            memory.keep_only(Box::new(move |path| owns.owns(path)));
            below.push(Arc::new(peer::PeerTier::new(
                c.membership.clone(),
                c.secret.clone(),
                c.tls.as_ref(),
                blocks,
                stats.clone(),
            )));
        }
        below.push(Arc::new(SourceTier::new(source, blocks, stats.clone())));
        // The rest of a part waits for its reader in a buffer of a few parts, at most the
        // staging budget (a small pod's is a few MiB); as many parts are read at once as that
        // budget allows.
        let part_blocks = (part_size / blocks.get()).max(1);
        let ahead = Arc::new(ahead::Ahead::new(
            if part_blocks > 1 {
                (AHEAD_PARTS * part_size).min(part_memory)
            } else {
                0
            },
            stats.clone(),
        ));
        let parts = fetch::parts_in_flight(part_memory, part_size);
        let fetcher = Fetcher::new(
            below,
            memory.clone(),
            recent.clone(),
            (ahead, part_blocks, parts),
            stats,
            io,
        );
        Tiers {
            staging: Arc::new(Staging::new(staging, blocks)),
            memory,
            recent,
            disk,
            fetcher: Arc::new(fetcher),
        }
    }

    /// Offers blocks a reader took from the staging area (of the file of `want`) to the tiers
    /// that keep what is read: the cache, if its policy was not offered them when they
    /// arrived, else the recent blocks, where a second open moments from now finds them.
    pub fn took_from_staging(&self, want: &Want<'_>, claimed: &[(u64, Arc<Block>)]) {
        for (block, data) in claimed {
            let want = want.block(*block).because(Why::Claimed);
            if !self.memory.admit(&want, data) {
                self.recent.admit(&want, data);
            }
        }
    }
}

/// Asks `tiers` for `want`, nearest first, and returns the first hit. A tier's fault is
/// logged with its cause (the one line it gets) and counted in `errors`, and the next tier is
/// asked: the tiers fail open.
pub fn look_up<'t>(
    tiers: impl IntoIterator<Item = &'t dyn Tier>,
    want: &Want<'_>,
    errors: &std::sync::atomic::AtomicU64,
) -> Option<Found<'t>> {
    for tier in tiers {
        match tier.get(want) {
            Ok(Some(found)) => return Some(found),
            Ok(None) => {}
            Err(e) => {
                Counters::add(errors, 1);
                tracing::warn!(
                    "reading {} block {}: {e}; asking the next tier",
                    want.rel.display(),
                    want.key.block,
                );
            }
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::namespace::FileVersion;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Block `block` of a file of `size` bytes, inode `ino`.
    pub fn key(ino: u64, size: u64, block: u64) -> BlockKey {
        BlockKey {
            version: FileVersion {
                dev: 1,
                ino,
                size,
                mtime_ns: 0,
                ctime_ns: 0,
            },
            block,
        }
    }

    /// Block `block` of a file of `size` bytes (inode `ino`), wanted by a reader of job 1.
    pub fn want(ino: u64, size: u64, block: u64, why: Why) -> Want<'static> {
        Want {
            key: key(ino, size, block),
            rel: Path::new("f"),
            job: JobKey::Pgid(1),
            epoch: 1,
            why,
            stream: true,
        }
    }

    /// A tier that fails, misses or hits, as it is told.
    pub struct Told(pub Result<Option<u8>, DataError>);

    impl Tier for Told {
        fn name(&self) -> &'static str {
            "told"
        }
        fn get(&self, _want: &Want<'_>) -> Result<Option<Found<'_>>, DataError> {
            self.0.clone().map(|hit| {
                hit.map(|fill| Found::Block(Arc::new(Block::copy_of(&[fill; 10]).unwrap())))
            })
        }
        fn admit(&self, _want: &Want<'_>, _data: &Arc<Block>) -> bool {
            false
        }
        fn remove(&self, _want: &Want<'_>) {}
    }

    fn bytes(found: Option<Found<'_>>) -> Option<u8> {
        match found? {
            Found::Block(b) => Some(b[0]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_first_tier_that_holds_the_block_answers_and_a_fault_is_a_counted_miss() {
        let (miss, one, two) = (Told(Ok(None)), Told(Ok(Some(1))), Told(Ok(Some(2))));
        let broken = Told(Err(DataError::Missing("told")));
        // (the chain, the bytes found, the faults counted)
        let table: [(&[&dyn Tier], Option<u8>, u64); 6] = [
            (&[&miss, &one, &two], Some(1), 0),
            (&[&two, &one], Some(2), 0),
            (&[&miss, &miss], None, 0),
            (&[], None, 0),
            (&[&broken, &one], Some(1), 1),
            (&[&broken, &miss, &broken], None, 2),
        ];
        let w = want(1, 10, 0, Why::Read);
        for (i, (tiers, found, faults)) in table.iter().enumerate() {
            let errors = AtomicU64::new(0);
            let got = bytes(look_up(tiers.iter().copied(), &w, &errors));
            assert_eq!(got, *found, "row {i}");
            assert_eq!(errors.load(Ordering::Relaxed), *faults, "row {i}");
        }
    }

    #[test]
    fn blocks_taken_from_staging_go_where_the_policy_wants_what_is_read() {
        use crate::cache::{CacheConfig, PolicyKind};
        let dir = tempfile::tempdir().unwrap();
        let io = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // (policy, the cache keeps a claimed block, the recent blocks do)
        for (policy, cached, recent) in [
            (PolicyKind::MinIo, false, true),
            (PolicyKind::Lru, true, false),
            (PolicyKind::None, false, false),
        ] {
            let memory = BlockCache::new(CacheConfig {
                policy,
                capacity: 1 << 20,
                ceiling: None,
                block_size: std::num::NonZeroU64::new(64).unwrap(),
            })
            .unwrap();
            let source = crate::source::LocalSource::new(dir.path().to_path_buf(), false);
            let stats = Arc::new(Stats::default());
            let io = io.handle().clone();
            let tiers = Tiers::new(
                memory,
                1 << 20,
                (0, 0),
                None,
                Arc::new(source.unwrap()),
                None,
                stats,
                io,
            );
            let w = want(1, 100, 0, Why::Read);
            let claimed = vec![
                (0, Arc::new(Block::copy_of(&[1; 64]).unwrap())),
                (1, Arc::new(Block::copy_of(&[2; 36]).unwrap())),
            ];
            tiers.took_from_staging(&w, &claimed);
            for block in [0, 1] {
                let key = w.block(block).key;
                assert_eq!(tiers.memory.contains(&key), cached, "{policy:?}");
                assert_eq!(tiers.recent.get(&key, None).is_some(), recent, "{policy:?}");
            }
        }
    }
}
