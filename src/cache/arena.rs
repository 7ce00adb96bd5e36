//! An append-only arena in one anonymous memory mapping, for the MinIO cache.
//!
//! MinIO never evicts, so its store needs no allocator: a slot is carved off the end of one
//! big mapping with an atomic bump. No fragmentation, no per-item header, and a slot's bytes
//! stay at the same address while it is cached, so a hit hands the FUSE reply a slice of the
//! mapping without a copy of its own. The mapping is reserved up front but the kernel only
//! backs the pages that are written, so an idle cache costs address space, not memory.
//!
//! The one way back is from the end: when an elastic budget shrinks, the cache drops its
//! newest files and [`Arena::truncate`] gives the pages past the last slot it keeps back to
//! the kernel (`MADV_DONTNEED`). The cache makes sure nobody holds or writes a slot there
//! while it does (its shrink lock).
//!
//! A slot is written once, by the thread that allocated it, before it is published in the
//! cache index (under the index's lock, which orders the write before any read of it).
//!
//! Writers and readers share the mapping, so it is held as a [`MmapRaw`] and reached only
//! through raw pointers: no reference ever spans the whole mapping. A reader's `&[u8]`
//! covers its own slot alone, which nobody writes again; a writer's copy covers its fresh
//! slot alone, which nobody reads yet. (A `&[u8]` of the whole `MmapMut` beside a write
//! through a pointer cast to `*mut` would alias the written bytes.)

use std::sync::atomic::{AtomicUsize, Ordering};

use memmap2::{MmapOptions, MmapRaw};

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
    map: MmapRaw,
    next: AtomicUsize,
    /// The memory file the arena maps, when it must outlive the daemon (a keeper holds it:
    /// see [`Arena::shared`]); None for anonymous memory.
    file: Option<std::fs::File>,
}

impl Arena {
    /// An arena of `capacity` bytes. The mapping reserves address space only.
    pub fn new(capacity: usize) -> std::io::Result<Self> {
        // memmap2 refuses empty mappings; a zero-capacity cache still needs a valid arena.
        // No swap is reserved for it (MAP_NORESERVE): an elastic budget reserves as much
        // address space as the machine has memory, and only what is written is ever used.
        let map = MmapOptions::new()
            .len(capacity.max(ALIGN))
            .no_reserve_swap()
            .map_anon()?;
        Ok(Arena {
            map: MmapRaw::from(map),
            next: AtomicUsize::new(0),
            file: None,
        })
    }

    /// An arena of `capacity` bytes in the memory file `memory` (a memfd), mapped shared: its
    /// bytes outlive the daemon while another process (the keeper) holds the file, and a
    /// successor maps them again with [`Arena::resume_at`]. The file is sized to `capacity`
    /// (sparse: only written pages take memory).
    pub fn shared(memory: &std::os::fd::OwnedFd, capacity: usize) -> std::io::Result<Self> {
        let file = std::fs::File::from(memory.try_clone()?);
        let capacity = capacity.max(ALIGN);
        if (file.metadata()?.len() as usize) < capacity {
            file.set_len(capacity as u64)?;
        }
        let map = MmapOptions::new().len(capacity).map_raw(&file)?;
        Ok(Arena {
            map,
            next: AtomicUsize::new(0),
            file: Some(file),
        })
    }

    /// Goes on allocating from `end`, the end of the last slot a previous daemon published
    /// (slots it allocated past that were never published, and are written again).
    pub fn resume_at(&self, end: usize) {
        self.next
            .store(Self::footprint(end).min(self.map.len()), Ordering::Relaxed);
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
        // which happens after this copy, and no reference spans it (see the module header).
        // So this is the only access to these bytes now.
        unsafe {
            let dst = self.map.as_mut_ptr().add(slot.offset);
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
        }
    }

    /// The bytes of a written slot, which must come from [`Arena::alloc`] on this arena and
    /// have been written by [`Arena::write`] (before it was published to this reader).
    pub fn get(&self, slot: Slot) -> &[u8] {
        assert!(slot.offset + slot.len <= self.map.len());
        // SAFETY: the range is inside the mapping (checked above) and is one written slot:
        // nobody writes it again while the arena lives (the borrow of `self`), and writes to
        // other slots touch other bytes through raw pointers, never through a reference.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(slot.offset), slot.len) }
    }

    /// Bytes the arena may hold.
    pub fn capacity(&self) -> usize {
        self.map.len()
    }

    /// Bytes reserved so far, alignment included: the end of the last slot.
    pub fn used(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }

    /// Forgets every slot past `end` and gives their whole pages back to the kernel. Returns
    /// the bytes no longer reserved. The caller guarantees that no slot past `end` is read or
    /// written now or later (they are out of every index, and no allocation is in progress).
    pub fn truncate(&self, end: usize) -> usize {
        let end = Self::footprint(end);
        let old = self.next.load(Ordering::Relaxed);
        if end >= old {
            return 0;
        }
        self.next.store(end, Ordering::Relaxed);
        let from = end.div_ceil(PAGE) * PAGE;
        let to = (old.div_ceil(PAGE) * PAGE).min(self.map.len());
        if from < to {
            let advice = if self.file.is_some() {
                memmap2::UncheckedAdvice::Remove
            } else {
                memmap2::UncheckedAdvice::DontNeed
            };
            // SAFETY: [from, to) is inside the mapping and past every slot still in use, which
            // nobody reads or writes (the caller's guarantee), so dropping its pages, which
            // then read as zeros, changes no byte anyone sees. A shared memory file's pages
            // are freed by removing them from the file (MADV_REMOVE); DONTNEED would only
            // unmap them.
            let dropped = unsafe { self.map.unchecked_advise_range(advice, from, to - from) };
            if let Err(e) = dropped {
                tracing::warn!("giving cache memory back to the kernel: {e}");
            }
        }
        old - end
    }
}

/// The page size, for giving whole pages back.
const PAGE: usize = 4096;

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
    fn truncating_gives_pages_back_and_reuses_the_space() {
        let arena = Arena::new(64 << 10).unwrap();
        let a = arena.alloc(5000).unwrap();
        let b = arena.alloc(20_000).unwrap();
        arena.write(a, &[1; 5000]);
        arena.write(b, &[2; 20_000]);
        assert_eq!(arena.truncate(a.offset + a.len), Arena::footprint(20_000));
        assert_eq!(arena.used(), Arena::footprint(5000));
        assert_eq!(arena.get(a), &[1; 5000][..]);
        // The pages past the first one of `b` were dropped: a new slot there reads what is
        // written into it, over zeros.
        let c = arena.alloc(20_000).unwrap();
        assert_eq!(c.offset, b.offset);
        assert!(
            arena
                .get(Slot {
                    offset: 8192,
                    len: 4096
                })
                .iter()
                .all(|&x| x == 0)
        );
        arena.write(c, &[3; 20_000]);
        assert_eq!(arena.get(c), &[3; 20_000][..]);
        assert_eq!(
            arena.truncate(1 << 20),
            0,
            "nothing past the end to give back"
        );
    }

    #[test]
    fn readers_hold_slots_while_writers_fill_others() {
        // Under Miri (`cargo +nightly miri test --lib cache::arena`) this checks the aliasing
        // model: every reader keeps slices of written slots while other threads write theirs.
        const SLOTS: usize = 64;
        let arena = std::sync::Arc::new(Arena::new(SLOTS * ALIGN).unwrap());
        let first = arena.alloc(ALIGN).unwrap();
        arena.write(first, &[0xAA; ALIGN]);
        let held = arena.get(first);
        let handles: Vec<_> = (1..4u8)
            .map(|t| {
                let arena = arena.clone();
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    for _ in 0..SLOTS / 4 {
                        let slot = arena.alloc(ALIGN).unwrap();
                        arena.write(slot, &[t; ALIGN]);
                        mine.push(slot);
                        // Read back everything this thread wrote, while others write.
                        for s in &mine {
                            assert!(arena.get(*s).iter().all(|&b| b == t));
                        }
                    }
                })
            })
            .collect();
        for _ in 0..100 {
            assert!(held.iter().all(|&b| b == 0xAA));
        }
        for h in handles {
            h.join().unwrap();
        }
        assert!(held.iter().all(|&b| b == 0xAA));
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
