//! The source tier: the last of the chain, where every block can be read, and the one tier
//! whose faults reach the reader.
//!
//! It reads a block of the dataset source ([`crate::source::DatasetSource`]) into memory of
//! the block's own ([`Block`]), on the thread of the fetch that asked ([`super::fetch`]). A
//! small block is read into the thread's page-aligned scratch buffer and copied out at its
//! size (a staging area of tiny files held in page-aligned blocks took twice what it counted);
//! a large one is read straight into its page-aligned block, which `O_DIRECT` can fill. A block
//! shorter than the version says (the file shrank since it was opened) is an error, ESTALE:
//! nothing stale is served. It keeps nothing: `admit` and `remove` do nothing.

use std::path::Path;
use std::sync::Arc;

use super::{DataError, Found, Tier, Want};
use crate::block::{Block, BlockSize, MAP_FROM, RunBlocks};
use crate::cache::BlockKey;
use crate::source::{DatasetSource, SmallRead};
use crate::stats::{Counters, Stats};

/// Reads blocks of the dataset source.
pub struct SourceTier {
    source: Arc<dyn DatasetSource>,
    blocks: BlockSize,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for SourceTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceTier")
            .field("root", &self.source.root())
            .finish_non_exhaustive()
    }
}

impl SourceTier {
    /// A tier reading `source` in blocks of `blocks`, counting bytes and faults in `stats`.
    pub fn new(source: Arc<dyn DatasetSource>, blocks: BlockSize, stats: Arc<Stats>) -> Self {
        SourceTier {
            source,
            blocks,
            stats,
        }
    }

    /// Reads block `key` of the file at `rel`.
    fn read(&self, rel: &Path, key: BlockKey) -> Result<Block, DataError> {
        let len = self.blocks.len(key.version.size, key.block) as usize;
        let offset = self.blocks.offset(key.block);
        if len < MAP_FROM {
            // Read into this thread's scratch page(s), keep a copy of exactly `len` bytes.
            return SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                let buf = match &mut *scratch {
                    Some(b) => b,
                    None => match Block::zeroed(MAP_FROM) {
                        Ok(b) => scratch.insert(b),
                        Err(e) => return Err(DataError::no_memory(MAP_FROM, e)),
                    },
                };
                let whole = &mut buf.whole_mut()[..Block::footprint_for(len) as usize];
                let n = self.read_into(rel, &key, offset, whole)?;
                self.complete(Block::exact(&whole[..n.min(len)]), len)
            });
        }
        let mut block = Block::zeroed(len).map_err(|e| DataError::no_memory(len, e))?;
        let n = self.read_into(rel, &key, offset, block.whole_mut())?;
        block.truncate(n.min(len));
        self.complete(block, len)
    }

    /// Reads block `key` and the `more` after it in one read of the source (one request to an
    /// object store), each into a block of its own, handed to `each` with its number as soon
    /// as it is full, in order. A read that fails or comes back short fails the blocks not
    /// handed over yet.
    fn read_run(
        &self,
        rel: &Path,
        key: BlockKey,
        more: u64,
        each: &mut dyn FnMut(u64, Arc<Block>),
    ) -> Result<(), DataError> {
        let size = key.version.size;
        let lens: Vec<usize> = (key.block..=key.block + more)
            .map(|b| self.blocks.len(size, b) as usize)
            .collect();
        let mut blocks = RunBlocks::new(lens);
        let len = blocks.bytes();
        let offset = self.blocks.offset(key.block);
        let mut next = key.block;
        let n = (self
            .source
            .read_blocks(rel, &key.version, offset, &mut blocks, &mut |block| {
                each(next, Arc::new(block));
                next += 1;
            }))
        .map_err(|e| match blocks.short_of() {
            Some(len) => DataError::no_memory(len, e.into_io()),
            None => self.failed(e),
        })?;
        let counters = &self.stats.counters;
        Counters::add(&counters.bytes_from_source, n.min(len) as u64);
        if n < len {
            Counters::add(&counters.source_errors, 1);
            return Err(DataError::Short { got: n, want: len });
        }
        Ok(())
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
    ) -> Result<usize, DataError> {
        (self.source.read_block(rel, &key.version, offset, buf)).map_err(|e| self.failed(e))
    }

    fn log_fetch(&self, want: &Want<'_>) {
        tracing::debug!(
            "fetch {} block {} for {} epoch {} ({:?})",
            want.rel.display(),
            want.key.block,
            want.job,
            want.epoch,
            want.why
        );
    }

    /// Counts a failed read; its fault for the reader, whose one log line says it
    /// ([`super::error`]).
    fn failed(&self, e: crate::source::SourceError) -> DataError {
        Counters::add(&self.stats.counters.source_errors, 1);
        DataError::of_source(e)
    }

    /// Counts a block read from the source; one shorter than `len` is an error.
    fn complete(&self, block: Block, len: usize) -> Result<Block, DataError> {
        let counters = &self.stats.counters;
        Counters::add(&counters.bytes_from_source, block.len() as u64);
        if block.len() < len {
            Counters::add(&counters.source_errors, 1);
            let got = block.len();
            return Err(DataError::Short { got, want: len });
        }
        Ok(block)
    }
}

impl Tier for SourceTier {
    fn name(&self) -> &'static str {
        "source"
    }

    fn get(&self, want: &Want<'_>) -> Result<Option<Found<'_>>, DataError> {
        self.log_fetch(want);
        let block = self.read(want.rel, want.key)?;
        Ok(Some(Found::Block(Arc::new(block))))
    }

    fn get_small(&self, wants: &[Want<'_>]) -> Vec<Result<Option<Found<'_>>, DataError>> {
        for want in wants {
            self.log_fetch(want);
        }
        // One page-aligned buffer for the batch, each file at whole pages of its own, then a
        // copy of exactly each file's bytes (as `read` does for a small block).
        let lens: Vec<usize> = (wants.iter())
            .map(|w| self.blocks.len(w.key.version.size, w.key.block) as usize)
            .collect();
        let room = |len: usize| Block::footprint_for(len) as usize;
        let total = lens.iter().map(|&len| room(len)).sum::<usize>();
        let mut scratch = match Block::zeroed(total) {
            Ok(b) => b,
            Err(e) => {
                let failed = |_| {
                    Err(DataError::no_memory(
                        total,
                        std::io::Error::new(e.kind(), e.to_string()),
                    ))
                };
                return wants.iter().map(failed).collect();
            }
        };
        let mut reads = Vec::with_capacity(wants.len());
        let mut rest = &mut scratch.whole_mut()[..total];
        for (want, &len) in wants.iter().zip(&lens) {
            let (buf, after) = std::mem::take(&mut rest).split_at_mut(room(len));
            rest = after;
            reads.push(SmallRead {
                rel: want.rel,
                version: &want.key.version,
                buf,
                result: None,
                together: false,
            });
        }
        self.source.read_small(&mut reads);
        let together = reads.iter().filter(|r| r.together).count();
        Counters::add(&self.stats.counters.batched_reads, together as u64);
        (reads.into_iter().zip(lens))
            .map(|(read, len)| match read.result.expect("every file read") {
                Ok(n) => self
                    .complete(Block::exact(&read.buf[..n.min(len)]), len)
                    .map(|block| Some(Found::Block(Arc::new(block)))),
                Err(e) => Err(self.failed(e)),
            })
            .collect()
    }

    fn reads_together(&self) -> bool {
        self.source.reads_together()
    }

    fn get_run(
        &self,
        want: &Want<'_>,
        more: u64,
        each: &mut dyn FnMut(u64, Arc<Block>),
    ) -> Result<(), DataError> {
        tracing::debug!(
            "fetch {} blocks {}..={} for {} epoch {} ({:?})",
            want.rel.display(),
            want.key.block,
            want.key.block + more,
            want.job,
            want.epoch,
            want.why
        );
        self.read_run(want.rel, want.key, more, each)
    }

    fn send_ahead(&self, want: &Want<'_>, more: u64) {
        let (size, b) = (want.key.version.size, want.key.block);
        let offset = self.blocks.offset(b);
        let end = self.blocks.offset(b + more + 1).min(size);
        if end > offset {
            (self.source).send_ahead(want.rel, &want.key.version, offset, (end - offset) as usize);
        }
    }

    fn sent_ahead(&self, want: &Want<'_>) -> Option<u64> {
        let offset = self.blocks.offset(want.key.block);
        let len = (self.source).sent_ahead(want.rel, &want.key.version, offset)?;
        Some((len as u64).div_ceil(self.blocks.get()).saturating_sub(1))
    }

    fn admit(&self, _want: &Want<'_>, _data: &Arc<Block>) -> bool {
        false
    }

    fn remove(&self, _want: &Want<'_>) {}
}

thread_local! {
    /// Each I/O thread's page-aligned buffer for reads of small blocks (at most 64 threads x
    /// 64 KiB).
    static SCRATCH: std::cell::RefCell<Option<Block>> = const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{FaultySource, LocalSource};
    use crate::tier::Why;
    use crate::tier::tests::want;
    use std::num::NonZeroU64;

    /// A source directory with file `f` of `len` bytes (byte i is i % 251), and its version.
    fn source(len: usize) -> (tempfile::TempDir, FaultySource<LocalSource>, Want<'static>) {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &bytes).unwrap();
        let local = LocalSource::new(dir.path().to_path_buf(), false).unwrap();
        let meta = local
            .metadata(Path::new("f"), &crate::source::Creds::DAEMON)
            .unwrap();
        let mut w = want(0, 0, 0, Why::Read);
        w.key.version = meta.version;
        (dir, FaultySource::new(local), w)
    }

    fn tier(source: FaultySource<LocalSource>, block: u64) -> (SourceTier, Arc<Stats>) {
        let stats = Arc::new(Stats::default());
        let blocks = BlockSize::new(NonZeroU64::new(block).unwrap());
        (
            SourceTier::new(Arc::new(source), blocks, stats.clone()),
            stats,
        )
    }

    fn read(t: &SourceTier, w: &Want<'_>) -> Result<Vec<u8>, DataError> {
        match t.get(w)? {
            Some(Found::Block(b)) => Ok(b.to_vec()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_blocks_small_and_large_and_counts_their_bytes() {
        let (_dir, source, w) = source(300_000);
        let (t, stats) = tier(source, 128 << 10);
        let last = read(&t, &w.block(2)).unwrap();
        assert_eq!(last.len(), 300_000 - 2 * (128 << 10));
        assert_eq!(last[0], ((2 * (128 << 10)) % 251) as u8);
        assert_eq!(read(&t, &w.block(0)).unwrap().len(), 128 << 10);
        assert_eq!(
            Counters::get(&stats.counters.bytes_from_source),
            300_000 - (128 << 10)
        );
        assert!(!t.admit(&w, &Arc::new(Block::exact(&[1]))));
    }

    #[test]
    fn faults_reach_the_reader_and_are_counted() {
        let (_dir, source, w) = source(1000);
        *source.fail_paths_containing.lock() = Some("f".into());
        let (t, stats) = tier(source, 1 << 20);
        let e = read(&t, &w).unwrap_err();
        assert!(matches!(e, DataError::Source(_)), "{e:?}");
        assert_eq!(e.errno(), libc::EIO);
        assert_eq!(Counters::get(&stats.counters.source_errors), 1);
    }
}
