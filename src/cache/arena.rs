//! An append-only arena in one anonymous memory mapping, for the MinIO cache.
//!
//! MinIO never evicts, so its store needs no allocator: a slot is carved off the end of one
//! big mapping with an atomic bump, and never freed. No fragmentation, no per-item header,
//! and a slot's bytes stay at the same address for the life of the mount, so a hit hands
//! the FUSE reply a slice of the mapping without a lock or a copy of its own. The mapping is
//! reserved up front but the kernel only backs the pages that are written, so an idle
//! cache costs address space, not memory.
//!
//! A slot is written once, by the thread that allocated it, before it is published in the
//! cache index (under the index's lock, which orders the write before any read of it).

use std::sync::atomic::{AtomicUsize, Ordering};

use memmap2::{MmapMut, MmapOptions};

/// Slots start at multiples of this many bytes: cache-line alignment keeps copies out of a
/// slot fast, and costs under 0.1% of a 100 KiB file.
pub const ALIGN: usize = 64;

/// A reserved range of the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub offset: usize,
    pub len: usize,
}

/// The arena.
#[derive(Debug)]
pub struct Arena {
    map: MmapMut,
    next: AtomicUsize,
}

impl Arena {
    /// An arena of `capacity` bytes. The mapping reserves address space only.
    pub fn new(capacity: usize) -> std::io::Result<Self> {
        // memmap2 refuses empty mappings; a zero-capacity cache still needs a valid arena.
        let map = MmapOptions::new().len(capacity.max(ALIGN)).map_anon()?;
        Ok(Arena {
            map,
            next: AtomicUsize::new(0),
        })
    }

    /// The bytes a slot of `len` takes, alignment included.
    pub fn footprint(len: usize) -> usize {
        len.div_ceil(ALIGN) * ALIGN
    }

    /// Reserves `len` bytes, or None if they do not fit.
    pub fn alloc(&self, len: usize) -> Option<Slot> {
        let need = Self::footprint(len);
        let mut at = self.next.load(Ordering::Relaxed);
        loop {
            let end = at.checked_add(need)?;
            if end > self.map.len() {
                return None;
            }
            match self
                .next
                .compare_exchange_weak(at, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(Slot { offset: at, len }),
                Err(now) => at = now,
            }
        }
    }

    /// Copies `data` into `slot`, which must come from [`Arena::alloc`] on this arena, with
    /// `slot.len == data.len()`, and not have been written before.
    pub fn write(&self, slot: Slot, data: &[u8]) {
        assert_eq!(slot.len, data.len());
        assert!(slot.offset + slot.len <= self.map.len());
        // SAFETY: the range is inside the mapping (checked above) and belongs to one slot,
        // handed out once by `alloc`; nobody reads it before the cache index publishes it,
        // which happens after this copy. So this is the only access to these bytes now.
        unsafe {
            let dst = self.map.as_ptr().add(slot.offset) as *mut u8;
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
        }
    }

    /// The bytes of a written slot.
    pub fn get(&self, slot: Slot) -> &[u8] {
        &self.map[slot.offset..slot.offset + slot.len]
    }

    /// Bytes reserved so far, alignment included.
    pub fn used(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_disjoint_and_bounded() {
        let arena = Arena::new(1000).unwrap();
        let a = arena.alloc(10).unwrap();
        let b = arena.alloc(100).unwrap();
        assert_eq!((a.offset, b.offset), (0, 64));
        arena.write(a, &[1; 10]);
        arena.write(b, &[2; 100]);
        assert_eq!(arena.get(a), &[1; 10]);
        assert_eq!(arena.get(b), &[2; 100]);
        assert_eq!(arena.used(), 64 + 128);
        assert!(arena.alloc(1000).is_none());
        assert!(arena.alloc(768).is_some());
        assert!(arena.alloc(1).is_none());
    }

    #[test]
    fn concurrent_allocations_never_overlap() {
        let arena = std::sync::Arc::new(Arena::new(64 * 4000).unwrap());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let arena = arena.clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .map(|_| arena.alloc(64).unwrap().offset)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<usize> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 4000);
        assert!(arena.alloc(1).is_none());
    }
}
