//! Blocks read ahead of their reader inside a file: the rest of an object-store part.
//!
//! A big object is read in parts (`--part-size`, 8 MiB by default): the fetch of a block
//! that no tier holds reads, in one ranged GET, that block and the blocks after it to the end
//! of its part ([`super::fetch`]). A block of the part that a reader is already waiting for
//! goes to that reader, and one the cache keeps to the cache; the others wait here for the
//! reader that streams through the file, which takes each as it reaches it ([`Ahead::take`]).
//!
//! Bounded in bytes ([`Ahead::new`]). When a part's blocks do not fit, a block gives way:
//! first one left untaken for [`STALE`] (its reader seeked elsewhere or stopped), else the
//! block furthest ahead of the nearest one held of its file, which a reader streaming through
//! the files needs last. (Giving way oldest first dropped the blocks a reader was about to
//! take: with 2 readers streaming S3 shards through a buffer of 3 parts, one reader's parts
//! pushed out the other's next blocks, and 1-9% of an epoch was read twice.) Bytes put here
//! and bytes that left untaken are counted (`readahead_bytes`, `readahead_unused_bytes`), so
//! that wasted readahead shows.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::block::Block;
use crate::cache::BlockKey;
use crate::namespace::FileVersion;
use crate::stats::{Counters, Stats};

/// A block left untaken this long gives way first when the buffer is full: a reader that
/// streams takes a block within a few parts' time, even one paced at a few MiB/s.
pub const STALE: Duration = Duration::from_secs(10);

/// When a block was put: the time, and the number of the put (of two files as far ahead of
/// their readers, the one put last gives way).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Put {
    at: Instant,
    seq: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each block, with its put.
    blocks: HashMap<BlockKey, (Arc<Block>, Put)>,
    /// The blocks held of each file.
    files: HashMap<FileVersion, BTreeSet<u64>>,
    /// Keys with their puts, oldest first (an entry whose block was taken, or put again
    /// since, is skipped).
    order: VecDeque<(BlockKey, Put)>,
    puts: u64,
    bytes: u64,
}

impl Inner {
    fn remove(&mut self, key: &BlockKey) -> Option<Arc<Block>> {
        let (data, _) = self.blocks.remove(key)?;
        self.bytes -= data.len() as u64;
        if let Some(held) = self.files.get_mut(&key.version) {
            held.remove(&key.block);
            if held.is_empty() {
                self.files.remove(&key.version);
            }
        }
        // Entries of blocks no longer held leave once they reach the front, so that the
        // queue stays about as long as the blocks held.
        while let Some((front, at)) = self.order.front() {
            if self.blocks.get(front).is_some_and(|(_, put)| put == at) {
                break;
            }
            self.order.pop_front();
        }
        Some(data)
    }

    /// The block to give way: the oldest if left untaken for [`STALE`] at `now`, else the one
    /// furthest ahead of the first block held of its file.
    fn victim(&self, now: Instant) -> Option<BlockKey> {
        if let Some((key, put)) = self.order.front()
            && now.duration_since(put.at) >= STALE
        {
            return Some(*key);
        }
        (self.files.iter())
            .filter_map(|(version, held)| {
                let (first, last) = (*held.first()?, *held.last()?);
                let key = BlockKey {
                    version: *version,
                    block: last,
                };
                Some((last - first, self.blocks.get(&key)?.1.seq, key))
            })
            .max_by_key(|(ahead, seq, _)| (*ahead, *seq))
            .map(|(.., key)| key)
    }
}

/// Blocks read ahead inside files, until their reader takes them.
#[derive(Debug)]
pub struct Ahead {
    capacity: u64,
    inner: Mutex<Inner>,
    stats: Arc<Stats>,
}

impl Ahead {
    /// An empty buffer of at most `capacity` bytes, counting in `stats`.
    pub fn new(capacity: u64, stats: Arc<Stats>) -> Self {
        Ahead {
            capacity,
            inner: Mutex::default(),
            stats,
        }
    }

    /// Keeps `data` as block `key` for the reader that will take it, if there is room once
    /// the blocks that give way first have gone (see the module header): `key` itself may be
    /// the one to go. A block larger than the whole buffer is not kept.
    pub fn put(&self, key: BlockKey, data: Arc<Block>) {
        self.put_at(key, data, Instant::now());
    }

    /// [`Ahead::put`] at `now`.
    fn put_at(&self, key: BlockKey, data: Arc<Block>, now: Instant) {
        let len = data.len() as u64;
        if len > self.capacity {
            return;
        }
        let counters = &self.stats.counters;
        let mut unused = 0;
        {
            let mut inner = self.inner.lock();
            inner.remove(&key);
            inner.puts += 1;
            let put = Put {
                at: now,
                seq: inner.puts,
            };
            inner.blocks.insert(key, (data, put));
            inner
                .files
                .entry(key.version)
                .or_default()
                .insert(key.block);
            inner.order.push_back((key, put));
            inner.bytes += len;
            while inner.bytes > self.capacity {
                let Some(victim) = inner.victim(now) else {
                    break;
                };
                unused += inner.remove(&victim).map_or(0, |gone| gone.len() as u64);
            }
        }
        Counters::add(&counters.readahead_bytes, len);
        Counters::add(&counters.readahead_unused_bytes, unused);
    }

    /// Takes block `key`, if it is here: it leaves, for the reader that asked.
    pub fn take(&self, key: &BlockKey) -> Option<Arc<Block>> {
        self.inner.lock().remove(key)
    }

    /// True if block `key` is here.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.inner.lock().blocks.contains_key(key)
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    /// The most it holds, in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::tests::key;

    fn block(len: usize) -> Arc<Block> {
        Arc::new(Block::exact(&vec![1; len]))
    }

    #[test]
    fn a_block_put_is_taken_once_and_counted() {
        let stats = Arc::new(Stats::default());
        let ahead = Ahead::new(1000, stats.clone());
        ahead.put(key(1, 3000, 1), block(100));
        assert!(ahead.contains(&key(1, 3000, 1)));
        assert_eq!(ahead.bytes(), 100);
        assert_eq!(ahead.take(&key(1, 3000, 1)).unwrap().len(), 100);
        assert!(ahead.take(&key(1, 3000, 1)).is_none());
        assert_eq!(ahead.bytes(), 0);
        assert_eq!(Counters::get(&stats.counters.readahead_bytes), 100);
        assert_eq!(Counters::get(&stats.counters.readahead_unused_bytes), 0);
    }

    #[test]
    fn the_block_furthest_ahead_in_its_file_gives_way_and_counts_as_unused() {
        let stats = Arc::new(Stats::default());
        let ahead = Ahead::new(350, stats.clone());
        // File 1's reader is at block 4, file 2's at block 0.
        for b in 4..6 {
            ahead.put(key(1, 3000, b), block(100));
        }
        ahead.put(key(2, 3000, 0), block(100));
        // 400 bytes into 350: file 1's block 6 goes first, the furthest ahead of its reader,
        // though file 2's block 0 and file 1's block 4 came before it.
        ahead.put(key(1, 3000, 6), block(100));
        assert!(!ahead.contains(&key(1, 3000, 6)));
        assert!(ahead.contains(&key(1, 3000, 4)) && ahead.contains(&key(1, 3000, 5)));
        assert!(ahead.contains(&key(2, 3000, 0)));
        assert_eq!(ahead.bytes(), 300);
        assert_eq!(Counters::get(&stats.counters.readahead_unused_bytes), 100);
        // File 2's reader moves on: its blocks are now the furthest ahead.
        for b in 1..3 {
            ahead.put(key(2, 3000, b), block(100));
        }
        assert!(!ahead.contains(&key(2, 3000, 2)) && !ahead.contains(&key(2, 3000, 1)));
        assert!(ahead.contains(&key(1, 3000, 5)) && ahead.contains(&key(2, 3000, 0)));
        assert_eq!(Counters::get(&stats.counters.readahead_unused_bytes), 300);
        // A taken block leaves no debt: the next put pushes out nothing.
        ahead.take(&key(1, 3000, 4));
        ahead.put(key(2, 3000, 1), block(100));
        assert_eq!(ahead.bytes(), 300);
        assert_eq!(Counters::get(&stats.counters.readahead_unused_bytes), 300);
        // Too large for the whole buffer: not kept, nothing pushed out.
        ahead.put(key(3, 3000, 0), block(400));
        assert_eq!(ahead.bytes(), 300);
        assert!(!ahead.contains(&key(3, 3000, 0)));
    }

    #[test]
    fn a_block_left_untaken_too_long_gives_way_first() {
        let stats = Arc::new(Stats::default());
        let ahead = Ahead::new(250, stats.clone());
        let then = Instant::now();
        // File 1's reader stopped at block 0; file 2's streams.
        ahead.put_at(key(1, 3000, 0), block(100), then);
        ahead.put_at(key(2, 3000, 0), block(100), then + STALE);
        ahead.put_at(key(2, 3000, 1), block(100), then + STALE);
        assert!(!ahead.contains(&key(1, 3000, 0)));
        assert!(ahead.contains(&key(2, 3000, 0)) && ahead.contains(&key(2, 3000, 1)));
        // A block put again is as young as its last put.
        ahead.put_at(key(2, 3000, 0), block(100), then + 2 * STALE);
        ahead.put_at(key(3, 3000, 0), block(100), then + 2 * STALE);
        assert!(ahead.contains(&key(2, 3000, 0)) && !ahead.contains(&key(2, 3000, 1)));
        assert!(ahead.contains(&key(3, 3000, 0)));
        assert_eq!(ahead.bytes(), 200);
        assert_eq!(Counters::get(&stats.counters.readahead_unused_bytes), 200);
    }
}
