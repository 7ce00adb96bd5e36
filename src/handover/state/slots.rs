//! The handle slots: the open file and directory handles the kernel holds, with the node
//! each opened and its passthrough backing id, slots reused at release.

use super::*;

/// What an open handle is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleKind {
    File,
    Dir,
    /// The order file (`.coorfs-order`).
    Control,
}

/// One open handle the kernel holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenHandle {
    pub fh: u64,
    pub ino: NodeId,
    pub kind: HandleKind,
    /// The passthrough backing id registered for it (0: none).
    pub backing: u32,
}

/// Slot layout (32 bytes): fh u64 (0: free), ino u64, backing u32, kind u32, 8 spare.
const SLOT: usize = 32;
/// Slots start after the header and the next-handle word (word 16).
const SLOTS_START: usize = 32;

/// The open handles (see the module header).
#[derive(Debug)]
pub struct HandleSlots {
    region: Region,
    /// Free slots, and the slot of each handle.
    pub(super) index: Mutex<SlotIndex>,
}

#[derive(Debug, Default)]
pub(super) struct SlotIndex {
    free: Vec<usize>,
    pub(super) used: usize,
    of: std::collections::HashMap<u64, usize>,
}

impl HandleSlots {
    pub fn create() -> io::Result<HandleSlots> {
        let region = Region::create("coorfs-handles", 1 << 16, SLOTS_RESERVE)?;
        write_header(&region, SLOTS_MAGIC, SLOTS_VERSION);
        Ok(HandleSlots {
            region,
            index: Mutex::default(),
        })
    }

    /// The slots a previous daemon left, with their live handles indexed.
    pub fn open(fd: OwnedFd) -> io::Result<HandleSlots> {
        let region = Region::open(fd, SLOTS_RESERVE)?;
        check_header(&region, SLOTS_MAGIC, SLOTS_VERSION, "handles")?;
        let slots = HandleSlots {
            region,
            index: Mutex::default(),
        };
        {
            let mut index = slots.index.lock();
            let n = (slots.region.len() as usize - SLOTS_START) / SLOT;
            let mut last_used = 0;
            for i in 0..n {
                let fh = slots
                    .region
                    .word(SLOTS_START + i * SLOT)
                    .load(Ordering::Acquire);
                if fh != 0 {
                    index.of.insert(fh, i);
                    last_used = i + 1;
                }
            }
            index.used = last_used;
            let taken: std::collections::HashSet<usize> = index.of.values().copied().collect();
            index.free = (0..last_used).filter(|i| !taken.contains(i)).collect();
        }
        Ok(slots)
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd.as_fd()
    }

    /// The first handle number no open handle has, as far as the slots know.
    pub fn next_fh(&self) -> u64 {
        self.region.word(16).load(Ordering::Acquire).max(1)
    }

    /// A handle number was given out: the next daemon gives out higher ones.
    pub fn gave_out(&self, fh: u64) {
        self.region.word(16).fetch_max(fh + 1, Ordering::AcqRel);
    }

    /// Records open handle `h`.
    pub fn open_handle(&self, h: OpenHandle) {
        let mut index = self.index.lock();
        let known = index.of.get(&h.fh).copied();
        let slot = match known.or_else(|| index.free.pop()) {
            Some(s) => s,
            None => {
                let s = index.used;
                if let Err(e) = self.region.ensure((SLOTS_START + (s + 1) * SLOT) as u64) {
                    tracing::warn!(
                        "handle slots: {e}; handle {} is not kept for a successor",
                        h.fh
                    );
                    return;
                }
                index.used += 1;
                s
            }
        };
        let at = SLOTS_START + slot * SLOT;
        self.region.word(at + 8).store(h.ino, Ordering::Relaxed);
        let kind = match h.kind {
            HandleKind::File => 1u64,
            HandleKind::Dir => 2,
            HandleKind::Control => 3,
        };
        self.region
            .word(at + 16)
            .store(u64::from(h.backing) | kind << 32, Ordering::Relaxed);
        // The handle number last: a slot with one is whole.
        self.region.word(at).store(h.fh, Ordering::Release);
        index.of.insert(h.fh, slot);
        drop(index);
        self.gave_out(h.fh);
    }

    /// Handle `fh` was released.
    pub fn close_handle(&self, fh: u64) {
        let mut index = self.index.lock();
        if let Some(slot) = index.of.remove(&fh) {
            self.region
                .word(SLOTS_START + slot * SLOT)
                .store(0, Ordering::Release);
            index.free.push(slot);
        }
    }

    /// The handle `fh`, if it is open.
    pub fn get(&self, fh: u64) -> Option<OpenHandle> {
        let slot = *self.index.lock().of.get(&fh)?;
        self.read_slot(slot).filter(|h| h.fh == fh)
    }

    fn read_slot(&self, slot: usize) -> Option<OpenHandle> {
        let at = SLOTS_START + slot * SLOT;
        let fh = self.region.word(at).load(Ordering::Acquire);
        if fh == 0 {
            return None;
        }
        let ino = self.region.word(at + 8).load(Ordering::Relaxed);
        let w = self.region.word(at + 16).load(Ordering::Relaxed);
        let kind = match w >> 32 {
            1 => HandleKind::File,
            2 => HandleKind::Dir,
            _ => HandleKind::Control,
        };
        Some(OpenHandle {
            fh,
            ino,
            kind,
            backing: w as u32,
        })
    }

    /// Every open handle.
    pub fn all(&self) -> Vec<OpenHandle> {
        let slots: Vec<usize> = self.index.lock().of.values().copied().collect();
        slots
            .into_iter()
            .filter_map(|s| self.read_slot(s))
            .collect()
    }
}
