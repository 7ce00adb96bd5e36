//! Blocks: the bytes of one block of a file, in memory of their own.
//!
//! Every tier below the cache hands blocks around as `Arc<Block>`: the source reads into one,
//! the staging area and the recent blocks keep them, an open file holds them until it is
//! closed. A block is page-aligned memory rounded up to whole pages, which the source can
//! read into with `O_DIRECT`, or, for small blocks kept after the read, exactly its bytes
//! ([`Block::exact`]): the memory a block takes is what the staging area counts
//! ([`Block::footprint`]).
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

enum Memory {
    Mapped(MmapMut),
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
        if let Memory::Heap { ptr, layout } = self {
            // SAFETY: allocated in `Block::zeroed` with this very layout, freed once.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), *layout) }
        }
    }
}

impl Block {
    /// `len` zero bytes, in [`Block::footprint_for`]`(len)` bytes of memory.
    pub fn zeroed(len: usize) -> io::Result<Block> {
        let size = Self::footprint_for(len) as usize;
        let mem = if size >= MAP_FROM {
            Memory::Mapped(MmapMut::map_anon(size)?)
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
}
