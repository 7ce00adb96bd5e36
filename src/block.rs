//! Blocks: the bytes of one block of a file, in memory of their own.
//!
//! Every tier below the cache hands blocks around as `Arc<Block>`: the source reads into one,
//! the staging area and the recent blocks keep them, an open file holds them until it is
//! closed. A block is page-aligned memory rounded up to whole pages, which the source can
//! read into with `O_DIRECT`, or, for small blocks kept after the read, exactly its bytes
//! ([`Block::exact`]): the memory a block takes is what the staging area counts
//! ([`Block::footprint`]). The mapping of a big block that is dropped serves a later block of
//! its size (the newest [`SPARE_MAX`] bytes of them are kept, so a file's odd-sized last block
//! ages out): blocks of parts come and go by the thousand a second. A block that needs a new
//! mapping gets its pages in one go (`MAP_POPULATE`), not a fault each.
//!
//! [`BlockSize`] says how a file is cut into blocks.
//!
//! This module knows nothing of where blocks come from or go, so that the source, the
//! tiers and the prefetcher can all use it without using each other.

use std::io;
use std::num::NonZeroU64;
use std::ops::Deref;

use memmap2::MmapMut;

/// How files are cut into blocks: a file up to the block size is one block of its own size
/// (small files are cached whole), a larger one is cut into blocks of the block size, so that
/// random access into a TFRecord, a tar shard or an HDF5 file reads just the blocks it needs.
/// Never zero: every block count and offset divides or multiplies by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSize(NonZeroU64);

impl BlockSize {
    /// Blocks of `size` bytes.
    pub const fn new(size: NonZeroU64) -> Self {
        BlockSize(size)
    }

    /// Bytes per block.
    pub fn get(self) -> u64 {
        self.0.get()
    }

    /// How many blocks a file of `size` bytes has (an empty file has one, empty).
    pub fn count(self, size: u64) -> u64 {
        if size <= self.get() {
            1
        } else {
            size.div_ceil(self.get())
        }
    }

    /// The length of block `block` of a file of `size` bytes.
    pub fn len(self, size: u64, block: u64) -> u64 {
        if size <= self.get() {
            size
        } else {
            self.get().min(size.saturating_sub(self.offset(block)))
        }
    }

    /// Where block `block` starts in its file.
    pub fn offset(self, block: u64) -> u64 {
        block * self.get()
    }
}

/// What a source's buffers are aligned to and rounded up to: the page, which covers the
/// logical block size that `O_DIRECT` asks of memory, offsets and lengths.
pub const ALIGN: usize = 4096;

/// The bytes of one block as read from the source, in page-aligned memory of their own, so
/// the source can read straight into it with `O_DIRECT` (no bounce buffer, no page-cache
/// copy), freed when the last reader drops it.
pub struct Block {
    mem: Memory,
    len: usize,
}

/// From [`MAP_FROM`] bytes up, a block is an anonymous mapping of its own: zero pages that
/// cost nothing until read into (glibc would map an allocation this large anyway, then Rust
/// would zero it). Smaller ones are aligned heap allocations: a staging area of small files
/// holds tens of thousands of blocks, past the kernel's limit of mappings per process.
pub const MAP_FROM: usize = 64 << 10;

/// The most memory of dropped blocks kept mapped for new ones (see `spare`): a part of 8
/// MiB and a half; a fixed overhead of the daemon beside its budgets.
pub const SPARE_MAX: usize = 12 << 20;

enum Memory {
    Mapped(std::mem::ManuallyDrop<MmapMut>),
    Heap {
        ptr: std::ptr::NonNull<u8>,
        layout: std::alloc::Layout,
    },
    /// Exactly the block's bytes, for small blocks that are kept (staged) after the read.
    Exact(Box<[u8]>),
}

// SAFETY: a Block owns its memory alone, like a Box<[u8]>; shared access is read-only.
unsafe impl Send for Memory {}
// SAFETY: as above: `&Block` only hands out `&[u8]`.
unsafe impl Sync for Memory {}

impl Drop for Memory {
    fn drop(&mut self) {
        match self {
            Memory::Heap { ptr, layout } => {
                // SAFETY: allocated in `Block::zeroed` with this very layout, freed once.
                unsafe { std::alloc::dealloc(ptr.as_ptr(), *layout) }
            }
            Memory::Mapped(map) => {
                // SAFETY: taken once, here, and `self` is not used after its drop.
                spare::give(unsafe { std::mem::ManuallyDrop::take(map) });
            }
            Memory::Exact(_) => {}
        }
    }
}

/// The blocks a run fills one after another (`DatasetSource::read_blocks`): their lengths,
/// each block allocated only when the read reaches it. A part's GET thus holds the block its
/// body is filling, not the whole part from its first byte: 1 MiB instead of 8, which the
/// elastic budget gives to the cache (a spare block is zeroed, and charged, when taken).
#[derive(Debug)]
pub struct RunBlocks {
    lens: std::vec::IntoIter<usize>,
    /// The length of the block that could not be allocated, if one could not.
    short_of: Option<usize>,
}

impl RunBlocks {
    pub fn new(lens: Vec<usize>) -> Self {
        RunBlocks {
            lens: lens.into_iter(),
            short_of: None,
        }
    }

    /// The length of a block that could not be allocated: the run failed for memory, not for
    /// its read.
    pub fn short_of(&self) -> Option<usize> {
        self.short_of
    }

    /// Bytes of the blocks not taken yet.
    pub fn bytes(&self) -> usize {
        self.lens.as_slice().iter().sum()
    }

    /// Blocks not taken yet.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.len() == 0
    }
}

impl Iterator for RunBlocks {
    /// The next block, to be read into whole ([`Block::for_overwrite`]: a `read_blocks` hands a
    /// block over only once every byte of it was read, and drops one it could not fill), or
    /// why it could not be allocated.
    type Item = io::Result<Block>;

    fn next(&mut self) -> Option<Self::Item> {
        let len = self.lens.next()?;
        let block = Block::for_overwrite(len);
        if block.is_err() {
            self.short_of = Some(len);
        }
        Some(block)
    }
}

impl Block {
    /// `len` zero bytes, in [`Block::footprint_for`]`(len)` bytes of memory.
    pub fn zeroed(len: usize) -> io::Result<Block> {
        Self::new(len, 0)
    }

    /// `len` bytes that the caller writes every one of before the block is read, in
    /// [`Block::footprint_for`]`(len)` bytes of memory: as [`Block::zeroed`], but a spare
    /// mapping keeps its old bytes where the caller will write (only the rest of its last page
    /// is zeroed). Why: a part's blocks are filled whole by the GET's body, and zeroing each
    /// spare first was work for nothing (4% of a profile's samples while a cold read streamed
    /// objects from S3, though not beyond the noise of the CPU a GiB, docs/BENCHMARKS.md).
    pub fn for_overwrite(len: usize) -> io::Result<Block> {
        Self::new(len, len)
    }

    /// A block of `len` bytes, zero from byte `from` on (a spare mapping keeps its old bytes
    /// before it; fresh memory is zero throughout).
    fn new(len: usize, from: usize) -> io::Result<Block> {
        let size = Self::footprint_for(len) as usize;
        let mem = if size >= MAP_FROM {
            match spare::take(size) {
                Some(mut map) => {
                    map[from..].fill(0);
                    Memory::Mapped(std::mem::ManuallyDrop::new(map))
                }
                // Its pages in one go, not one fault each: every page is written at once
                // (a part's body, an O_DIRECT read), and on this VM a fault's trap cost as
                // much as the page's zeroing (docs/BENCHMARKS.md).
                None => Memory::Mapped(std::mem::ManuallyDrop::new(
                    memmap2::MmapOptions::new()
                        .len(size)
                        .populate()
                        .map_anon()?,
                )),
            }
        } else {
            let layout = std::alloc::Layout::from_size_align(size, ALIGN)
                .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            // SAFETY: the layout's size is at least one page, never zero.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            let ptr = std::ptr::NonNull::new(ptr).ok_or(io::ErrorKind::OutOfMemory)?;
            Memory::Heap { ptr, layout }
        };
        Ok(Block { mem, len })
    }

    /// A block of exactly `bytes`, in plain heap memory of that size (not page aligned: a
    /// source cannot read into it with `O_DIRECT`).
    ///
    /// Why: a staging area of tiny files held each in a page-aligned allocation took about
    /// 2.1 times what it counted (measured: 200,000 files of 0.1-4 KiB); glibc serves an
    /// aligned allocation from a larger chunk and leaves the rest fragmented. Small blocks
    /// are read into a per-thread scratch page and copied out at their size instead.
    pub fn exact(bytes: &[u8]) -> Block {
        Block {
            mem: Memory::Exact(bytes.into()),
            len: bytes.len(),
        }
    }

    /// A block holding a copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> io::Result<Block> {
        let mut block = Self::zeroed(bytes.len())?;
        block.whole_mut()[..bytes.len()].copy_from_slice(bytes);
        Ok(block)
    }

    /// The memory a block of `len` bytes takes: whole pages, at least one.
    pub fn footprint_for(len: usize) -> u64 {
        (len.div_ceil(ALIGN).max(1) * ALIGN) as u64
    }

    /// Ends the block's bytes at `len`, if they went further: a read that returned fewer.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// All of the block's memory, its pages past the end included: what a source reads into.
    pub fn whole_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            Memory::Mapped(map) => map,
            // SAFETY: `ptr` points to `layout.size()` zeroed bytes that this block owns;
            // `&mut self` makes the borrow unique.
            Memory::Heap { ptr, layout } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), layout.size())
            },
            Memory::Exact(bytes) => bytes,
        }
    }

    /// All of the block's memory, read-only.
    fn whole(&self) -> &[u8] {
        match &self.mem {
            Memory::Mapped(map) => map,
            // SAFETY: as in `whole_mut`, shared read-only for the borrow of `self`.
            Memory::Heap { ptr, layout } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), layout.size())
            },
            Memory::Exact(bytes) => bytes,
        }
    }

    /// The memory this block takes. An exact block counts what malloc gives it: its size
    /// rounded up to 16 bytes, and a 16-byte header.
    pub fn footprint(&self) -> u64 {
        match &self.mem {
            Memory::Exact(bytes) => (bytes.len().div_ceil(16) * 16 + 16) as u64,
            _ => self.whole().len() as u64,
        }
    }
}

/// Mappings of dropped blocks, kept for the next blocks of their size, up to [`SPARE_MAX`]
/// bytes in all.
///
/// Why: a block of a part read from an object store lives a moment (until the cache copies
/// it into its own memory and the reader has it), and a fresh mapping for each cost a fault
/// and a zeroed page for every 4 KiB of it, then an unmap: a third of the daemon's CPU while
/// it streamed shards from S3, at 2 CPUs the bound of its speed. A spare is zeroed again
/// when it is taken (a block is zeros until read into), which costs less than the faults.
mod spare {
    use std::collections::VecDeque;

    use memmap2::MmapMut;
    use parking_lot::Mutex;

    /// The spares, oldest first, and their bytes.
    static SPARE: Mutex<(VecDeque<MmapMut>, usize)> = Mutex::new((VecDeque::new(), 0));

    /// A spare mapping of exactly `size` bytes, if one is kept (its old bytes still in it):
    /// the newest of that size.
    pub fn take(size: usize) -> Option<MmapMut> {
        let mut spare = SPARE.lock();
        let i = spare.0.iter().rposition(|m| m.len() == size)?;
        spare.1 -= size;
        spare.0.remove(i)
    }

    /// Keeps `map` for a later block, unmapping the oldest spares past
    /// [`super::SPARE_MAX`]: the sizes blocks have now stay, one-off sizes (a file's last
    /// block) age out instead of filling the spares for good.
    pub fn give(map: MmapMut) {
        if map.len() > super::SPARE_MAX {
            return;
        }
        let mut old = Vec::new();
        let mut spare = SPARE.lock();
        spare.1 += map.len();
        spare.0.push_back(map);
        while spare.1 > super::SPARE_MAX {
            let oldest = spare.0.pop_front().expect("spares hold the bytes counted");
            spare.1 -= oldest.len();
            old.push(oldest);
        }
        drop(spare);
        drop(old); // unmapped here, not under the lock
    }

    /// Bytes kept now.
    #[cfg(test)]
    pub fn bytes() -> usize {
        SPARE.lock().1
    }
}

impl Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.whole()[..self.len]
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_split_large_files_only() {
        let b = BlockSize::new(NonZeroU64::new(1000).unwrap());
        assert_eq!((b.count(0), b.len(0, 0)), (1, 0));
        assert_eq!((b.count(999), b.len(999, 0)), (1, 999));
        assert_eq!((b.count(1000), b.len(1000, 0)), (1, 1000));
        assert_eq!(b.count(2500), 3);
        assert_eq!(
            [b.len(2500, 0), b.len(2500, 1), b.len(2500, 2)],
            [1000, 1000, 500]
        );
        assert_eq!(b.offset(2), 2000);
    }

    #[test]
    fn exact_blocks_count_what_malloc_gives_them() {
        for (len, footprint) in [(0, 16), (1, 32), (100, 128), (4096, 4112)] {
            let bytes = vec![7u8; len];
            let b = Block::exact(&bytes);
            assert_eq!(&b[..], &bytes[..]);
            assert_eq!(b.footprint(), footprint, "{len} bytes");
        }
    }

    #[test]
    fn blocks_are_page_aligned_whole_pages_holding_their_bytes() {
        for len in [0, 1, 4095, 4096, 4097, 112_640, 1 << 20] {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut b = Block::copy_of(&bytes).unwrap();
            assert_eq!(&b[..], &bytes[..]);
            assert_eq!(b.footprint(), Block::footprint_for(len));
            assert_eq!(b.footprint() as usize, len.div_ceil(ALIGN).max(1) * ALIGN);
            let whole = b.whole_mut();
            assert_eq!(whole.as_ptr() as usize % ALIGN, 0);
            assert_eq!(whole.len() as u64, Block::footprint_for(len));
            assert!(whole[len..].iter().all(|&x| x == 0), "past the end is zero");
        }
    }

    #[test]
    fn a_dropped_blocks_memory_serves_the_next_block_of_its_size_zeroed() {
        // A size no other test uses: the spares are the process's.
        let len = MAP_FROM * 3 + 5;
        let mut b = Block::copy_of(&vec![9u8; len]).unwrap();
        let addr = b.whole_mut().as_ptr() as usize;
        let size = b.footprint() as usize;
        drop(b);
        assert!(spare::bytes() >= size);
        let mut again = Block::zeroed(len).unwrap();
        assert_eq!(
            again.whole_mut().as_ptr() as usize,
            addr,
            "not the same memory"
        );
        assert!(again.whole_mut().iter().all(|&x| x == 0), "not zeroed");
        // Never more than the bound, however many are dropped.
        let many: Vec<Block> = (0..(SPARE_MAX / size + 4))
            .map(|_| Block::zeroed(len).unwrap())
            .collect();
        drop(many);
        assert!(spare::bytes() <= SPARE_MAX);
    }

    #[test]
    fn a_one_off_size_ages_out_of_the_spares_as_blocks_of_another_size_come_and_go() {
        // Sizes no other test uses: the spares are the process's.
        let (odd, len) = (MAP_FROM * 7 + 11, MAP_FROM * 9 + 13);
        drop(Block::zeroed(odd).unwrap());
        let size = Block::footprint_for(len) as usize;
        let many: Vec<Block> = (0..(SPARE_MAX / size + 1))
            .map(|_| Block::zeroed(len).unwrap())
            .collect();
        drop(many);
        assert!(
            spare::take(Block::footprint_for(odd) as usize).is_none(),
            "the one-off size still takes room a block's size could use"
        );
        assert!(spare::bytes() <= SPARE_MAX);
    }

    #[test]
    fn a_block_to_overwrite_takes_a_spare_with_the_tail_of_its_last_page_zeroed() {
        // A size no other test uses: the spares are the process's.
        let len = MAP_FROM * 5 + 7;
        let mut b = Block::copy_of(&vec![9u8; len + 100]).unwrap();
        let addr = b.whole_mut().as_ptr() as usize;
        drop(b);
        let mut again = Block::for_overwrite(len).unwrap();
        assert_eq!(again.len(), len);
        assert_eq!(
            again.whole_mut().as_ptr() as usize,
            addr,
            "not the same memory"
        );
        assert!(
            again.whole_mut()[len..].iter().all(|&x| x == 0),
            "the old bytes past the block's end are still there"
        );
        // A fresh one (no spare of its size) is zeros, as every new mapping.
        let mut fresh = Block::for_overwrite(MAP_FROM * 5 + 4097 + 7).unwrap();
        assert!(fresh.whole_mut().iter().all(|&x| x == 0));
    }
}
