//! Where cached blocks are, and how they are found: the store a policy needs (the arena, a
//! mapping per block, or the kernel's files), the index of what is cached with its byte
//! counts, and the order of admission an elastic cache shrinks by (see the module header of
//! `cache`).

use std::collections::BTreeMap;
use std::sync::Arc;

// hashbrown's default hasher (foldhash): the index is looked up at every read and filled at
// every block a successor takes over (400,000 in 0.4 s with SipHash).
use hashbrown::HashMap;
use parking_lot::RwLockReadGuard;

use super::BlockKey;
use super::arena::{Arena, Slot};
use super::policy::CachePolicy;
use crate::handover::state::{CacheJournal, CacheRecord, CachedAt};
use crate::namespace::FileVersion;

/// One block of LRU's: its own anonymous mapping.
#[derive(Debug)]
pub struct MappedBlock {
    pub(super) map: memmap2::Mmap,
    pub(super) len: usize,
}

impl MappedBlock {
    pub(super) fn new(data: &[u8]) -> std::io::Result<Self> {
        let mut map = memmap2::MmapOptions::new()
            .len(data.len().max(1))
            .map_anon()?;
        map[..data.len()].copy_from_slice(data);
        Ok(MappedBlock {
            map: map.make_read_only()?,
            len: data.len(),
        })
    }

    /// The memory a mapping of `len` bytes takes: whole pages.
    pub(super) fn footprint(len: usize) -> usize {
        len.max(1).div_ceil(PAGE) * PAGE
    }
}

/// The page size that mappings are rounded to.
pub(super) const PAGE: usize = 4096;

/// Where admitted blocks are kept: chosen by what the policy needs, not by its name.
#[derive(Debug)]
pub(super) enum Store {
    /// Nothing: the policy admits nothing.
    Nothing,
    /// An append-only arena, for a policy that never evicts.
    Arena(Arena),
    /// A mapping per block, given back to the kernel when the policy evicts it.
    Mappings,
}

impl Store {
    /// The store `policy` needs, for a cache of `capacity` bytes. An arena reserves its
    /// address space here.
    pub(super) fn for_policy(
        policy: &dyn CachePolicy<BlockKey>,
        capacity: u64,
    ) -> std::io::Result<Self> {
        Ok(if !policy.keeps_anything() {
            Store::Nothing
        } else if policy.evicts() {
            Store::Mappings
        } else {
            Store::Arena(Arena::new(capacity as usize)?)
        })
    }

    /// The memory `len` bytes take in this store: what the budget counts.
    pub(super) fn footprint(&self, len: usize) -> u64 {
        match self {
            Store::Arena(_) => Arena::footprint(len) as u64,
            Store::Nothing | Store::Mappings => MappedBlock::footprint(len) as u64,
        }
    }
}

#[derive(Clone, Debug)]
pub(super) enum Stored {
    Arena(Slot),
    Mapped(Arc<MappedBlock>),
    /// In its file's file on the private tmpfs ([`kernel_files`]), named `file`, at `offset`.
    Kernel {
        offset: u64,
        len: u64,
        file: u64,
    },
}

impl Stored {
    pub(super) fn len(&self) -> u64 {
        match self {
            Stored::Arena(s) => s.len as u64,
            Stored::Mapped(b) => b.len as u64,
            Stored::Kernel { len, .. } => *len,
        }
    }
}

/// Bytes found in the cache.
#[derive(Debug)]
pub enum CachedBytes<'a> {
    /// A slot of the arena, and, for an elastic cache, the shrink lock held shared while the
    /// slice is lent (no shrink gives its pages back meanwhile).
    Arena(&'a [u8], Option<RwLockReadGuard<'a, ()>>),
    Mapped(Arc<MappedBlock>),
    /// A view of a file the kernel can read ([`kernel_files`]): its pages, mapped read-only;
    /// and, for an elastic cache, the shrink lock held shared while they are (no shrink
    /// punches the block out of its file meanwhile).
    File(memmap2::Mmap, Option<RwLockReadGuard<'a, ()>>),
}

impl std::ops::Deref for CachedBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            CachedBytes::Arena(b, _) => b,
            CachedBytes::Mapped(b) => &b.map[..b.len],
            CachedBytes::File(map, _) => map,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) blocks: HashMap<BlockKey, Stored>,
    /// Cached bytes per file version.
    pub(super) per_file: HashMap<FileVersion, u64>,
    /// Their sum, kept as they change: the disk tier asks for it at every block it is offered.
    pub(super) bytes: u64,
    /// Versions whose every byte is cached.
    pub(super) full_files: u64,
    /// The order of admission, kept only by an elastic cache (see the module header).
    pub(super) admitted: Option<Admitted>,
    /// Where every change is recorded for a successor daemon, under a keeper.
    pub(super) log: Option<Arc<CacheJournal>>,
}

/// What a shrink takes back next ([`Admitted::newest`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Newest {
    /// The arena's last slot, holding this block.
    Slot(BlockKey),
    /// This file's blocks, kept for the kernel.
    File(FileVersion),
}

/// What an elastic cache needs to drop its newest files: the arena's slots by offset (the
/// arena gives memory back from its end only), and the files kept for the kernel by when
/// their first block came.
#[derive(Debug, Default)]
pub(super) struct Admitted {
    /// Every arena slot in the index: offset, and the block, its length and its sequence
    /// number.
    pub(super) slots: BTreeMap<usize, (BlockKey, usize, u64)>,
    /// Files kept for the kernel, by the sequence number of their first block.
    pub(super) files: BTreeMap<u64, FileVersion>,
    /// Each such file's sequence number.
    pub(super) seq_of: HashMap<FileVersion, u64>,
    /// Blocks admitted so far.
    pub(super) seq: u64,
}

impl Admitted {
    pub(super) fn add(&mut self, key: BlockKey, stored: &Stored) {
        self.seq += 1;
        match stored {
            Stored::Arena(slot) => {
                self.slots.insert(slot.offset, (key, slot.len, self.seq));
            }
            Stored::Kernel { .. } => {
                if let hashbrown::hash_map::Entry::Vacant(e) = self.seq_of.entry(key.version) {
                    e.insert(self.seq);
                    self.files.insert(self.seq, key.version);
                }
            }
            Stored::Mapped(_) => {}
        }
    }

    pub(super) fn remove(&mut self, stored: &Stored) {
        if let Stored::Arena(slot) = stored {
            self.slots.remove(&slot.offset);
        }
    }

    pub(super) fn file_gone(&mut self, version: &FileVersion) {
        if let Some(seq) = self.seq_of.remove(version) {
            self.files.remove(&seq);
        }
    }

    /// What to drop next: the arena's last slot, or the newest file kept for the kernel,
    /// whichever came later.
    pub(super) fn newest(&self) -> Option<Newest> {
        let arena = self
            .slots
            .last_key_value()
            .map(|(_, (k, _, seq))| (*seq, Newest::Slot(*k)));
        let kernel = (self.files.last_key_value()).map(|(seq, v)| (*seq, Newest::File(*v)));
        arena
            .into_iter()
            .chain(kernel)
            .max_by_key(|(seq, _)| *seq)
            .map(|(_, n)| n)
    }

    /// The end of the arena's last slot in the index.
    pub(super) fn arena_end(&self) -> usize {
        self.slots
            .last_key_value()
            .map_or(0, |(offset, (_, len, _))| offset + len)
    }
}

impl Index {
    pub(super) fn add(&mut self, key: BlockKey, stored: Stored) {
        let len = stored.len();
        if let Some(log) = &self.log {
            let at = match stored {
                Stored::Arena(slot) => Some(CachedAt::Arena {
                    offset: slot.offset as u64,
                    len,
                }),
                Stored::Kernel { offset, file, .. } => Some(CachedAt::File { file, offset, len }),
                Stored::Mapped(_) => None,
            };
            if let Some(at) = at {
                log.append(&CacheRecord::Added {
                    version: key.version,
                    block: key.block,
                    at,
                });
            }
        }
        if let Some(admitted) = &mut self.admitted {
            admitted.add(key, &stored);
        }
        if let Some(old) = self.blocks.insert(key, stored) {
            if let Some(admitted) = &mut self.admitted {
                admitted.remove(&old);
            }
            self.sub(key.version, old.len());
        }
        self.bytes += len;
        let bytes = self.per_file.entry(key.version).or_default();
        let was_full = *bytes >= key.version.size;
        *bytes += len;
        if !was_full && *bytes >= key.version.size {
            self.full_files += 1;
        }
    }

    pub(super) fn remove(&mut self, key: &BlockKey) -> Option<Stored> {
        let old = self.blocks.remove(key)?;
        if let Some(log) = &self.log {
            log.append(&CacheRecord::Removed {
                version: key.version,
                block: key.block,
            });
        }
        if let Some(admitted) = &mut self.admitted {
            admitted.remove(&old);
        }
        self.sub(key.version, old.len());
        Some(old)
    }

    pub(super) fn sub(&mut self, version: FileVersion, len: u64) {
        if let Some(bytes) = self.per_file.get_mut(&version) {
            let was_full = *bytes >= version.size;
            let gone = len.min(*bytes);
            *bytes -= gone;
            self.bytes -= gone;
            if was_full && *bytes < version.size {
                self.full_files -= 1;
            }
            if *bytes == 0 {
                self.per_file.remove(&version);
                if let Some(admitted) = &mut self.admitted {
                    admitted.file_gone(&version);
                }
            }
        }
    }
}
