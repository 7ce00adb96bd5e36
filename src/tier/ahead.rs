//! Blocks read ahead of their reader inside a file: the rest of an object-store part.
//!
//! A big object is read in parts (`--part-size`, 8 MiB by default): the fetch of a block
//! that no tier holds reads, in one ranged GET, that block and the blocks after it to the end
//! of its part ([`super::fetch`]). A block of the part that a reader is already waiting for
//! goes to that reader, and one the cache keeps to the cache; the others wait here for the
//! reader that streams through the file, which takes each as it reaches it ([`Ahead::take`]).
//!
//! Bounded in bytes ([`Ahead::new`]): when a part's blocks do not fit, the oldest blocks
//! give way (a reader that seeked elsewhere or stopped never takes them). Bytes put here and
//! bytes that left untaken are counted (`readahead_bytes`, `readahead_unused_bytes`), so
//! that wasted readahead shows.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::block::Block;
use crate::cache::BlockKey;
use crate::stats::{Counters, Stats};

#[derive(Debug, Default)]
struct Inner {
    blocks: HashMap<BlockKey, Arc<Block>>,
    /// Keys in the order they were put, oldest first (a key taken since is skipped).
    order: VecDeque<BlockKey>,
    bytes: u64,
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

    /// Keeps `data` as block `key` for the reader that will take it, pushing out the oldest
    /// blocks if there is no room. A block larger than the whole buffer is not kept.
    pub fn put(&self, key: BlockKey, data: Arc<Block>) {
        let len = data.len() as u64;
        if len > self.capacity {
            return;
        }
        let counters = &self.stats.counters;
        let mut unused = 0;
        {
            let mut inner = self.inner.lock();
            if let Some(old) = inner.blocks.insert(key, data) {
                inner.bytes -= old.len() as u64;
            } else {
                inner.order.push_back(key);
            }
            inner.bytes += len;
            while inner.bytes > self.capacity {
                let Some(oldest) = inner.order.pop_front() else {
                    break;
                };
                if let Some(gone) = inner.blocks.remove(&oldest) {
                    inner.bytes -= gone.len() as u64;
                    unused += gone.len() as u64;
                }
            }
        }
        Counters::add(&counters.readahead_bytes, len);
        Counters::add(&counters.readahead_unused_bytes, unused);
    }

    /// Takes block `key`, if it is here: it leaves, for the reader that asked.
    pub fn take(&self, key: &BlockKey) -> Option<Arc<Block>> {
        let mut inner = self.inner.lock();
        let data = inner.blocks.remove(key)?;
        inner.bytes -= data.len() as u64;
        // Keys taken leave the queue once they reach its front, so that it stays as long as
        // the blocks held.
        while let Some(front) = inner.order.front() {
            if inner.blocks.contains_key(front) {
                break;
            }
            inner.order.pop_front();
        }
        Some(data)
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
    fn the_oldest_blocks_give_way_and_count_as_unused() {
        let stats = Arc::new(Stats::default());
        let ahead = Ahead::new(250, stats.clone());
        for b in 0..3 {
            ahead.put(key(1, 3000, b), block(100));
        }
        // 300 bytes into 250: block 0 went.
        assert!(!ahead.contains(&key(1, 3000, 0)));
        assert!(ahead.contains(&key(1, 3000, 1)) && ahead.contains(&key(1, 3000, 2)));
        assert_eq!(ahead.bytes(), 200);
        assert_eq!(Counters::get(&stats.counters.readahead_unused_bytes), 100);
        // A taken block leaves no debt: the next put pushes out only what it must.
        ahead.take(&key(1, 3000, 1));
        ahead.put(key(1, 3000, 3), block(100));
        assert_eq!(ahead.bytes(), 200);
        assert_eq!(Counters::get(&stats.counters.readahead_unused_bytes), 100);
        // Too large for the whole buffer: not kept, nothing pushed out.
        ahead.put(key(2, 3000, 0), block(300));
        assert_eq!(ahead.bytes(), 200);
        assert!(!ahead.contains(&key(2, 3000, 0)));
    }
}
