//! A mount served by a successor daemon: what the core keeps for one, and takes over from one.
//!
//! Under a keeper (`keeper.rs`) every node id the node table gives out goes to the node
//! journal, and every handle the kernel is given, with its passthrough registration, to the
//! handle slots (`handover/state/`). A successor replays the journal before it serves, so
//! every node id the kernel holds names the same entry, and takes the inodes' passthrough
//! modes from the slots. A predecessor's handle is opened again at its first READ or READDIR
//! (the kernel sends the node with it; the open is silent: its access was counted by the
//! predecessor), and its RELEASE ends its inode's open as the predecessor granted it.
//!
//! The order file's handles are not kept: a hint written across a takeover fails with EBADF
//! and is written again by the client (`python/coorfs`) at its next epoch.

use std::sync::Arc;

use super::passthrough::KernelIo;
use super::{Access, Caller, DatasetFs};
use crate::handover::state::{HandleKind, HandleSlots, Meta, NodeJournal, Restarts};
use crate::namespace::NodeId;

/// What a successor took over of the handles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TakenOver {
    /// Handles the kernel still holds.
    pub handles: usize,
    /// Backing file registrations the predecessor kept for its cache, given back.
    pub registrations_dropped: usize,
}

/// The daemons of a mount so far, as the stats show them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Daemons {
    pub keeper: Option<u32>,
    pub restarts: Restarts,
    /// The kernel resends a dead daemon's requests.
    pub resends: bool,
}

impl DatasetFs {
    /// The keeper and the daemons before this one (none without a keeper).
    pub fn daemons(&self) -> Daemons {
        match self.handover.get() {
            Some(meta) => Daemons {
                keeper: meta.keeper(),
                restarts: meta.restarts(),
                resends: meta.resends() == Some(true),
            },
            None => Daemons::default(),
        }
    }

    /// Shows the keeper's record of the mount's daemons (`meta`) in the stats.
    pub fn kept_by(&self, meta: Arc<Meta>) {
        let _ = self.handover.set(meta);
    }

    /// Records, from now on, what a successor daemon will need: node ids in `journal`,
    /// handles and registrations in `slots`.
    pub fn keep_for_successor(&self, journal: Arc<NodeJournal>, slots: Arc<HandleSlots>) {
        self.tree.ns.log_to(journal);
        self.handles.keep_in(slots.clone());
        self.opener.passthrough.keep_in(slots);
    }

    /// Takes the node ids over from a previous daemon that left `journal`, before anything
    /// reads the node table (the scan, a request, the prefetcher), and records new ones there.
    /// Returns how many it gave out.
    pub fn take_over_nodes(&self, journal: Arc<NodeJournal>) -> std::io::Result<usize> {
        let nodes = journal.nodes()?;
        let replayed = self
            .tree
            .ns
            .replay(nodes.into_iter().map(|n| (n.id, n.parent, n.kind, n.name)))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        self.tree.ns.log_to(journal);
        Ok(replayed)
    }

    /// Takes over the handles a previous daemon left in `slots` (after
    /// [`DatasetFs::take_over_nodes`], with passthrough started or refused as INIT said,
    /// before serving), and records new ones there.
    pub fn take_over_handles(&self, slots: Arc<HandleSlots>) -> TakenOver {
        let open = slots.all();
        let handles = open
            .iter()
            .filter(|h| h.kind != HandleKind::Control && h.ino != 0)
            .count();
        let registrations_dropped = self.opener.passthrough.adopt(&open);
        self.handles.keep_in(slots.clone());
        self.opener.passthrough.keep_in(slots);
        TakenOver {
            handles,
            registrations_dropped,
        }
    }

    /// Opens a predecessor's handle `fh` of file `ino` again for `caller`, at its first read
    /// here. False if `fh` is no file handle the predecessor left open on `ino`, or the file
    /// cannot be opened now (the read then fails as a read of an unknown handle does).
    pub(super) fn adopt_file(&self, fh: u64, ino: NodeId, caller: Caller) -> bool {
        let Some(h) = self.handles.predecessors(fh) else {
            return false;
        };
        if self.handles.file(fh).is_some() {
            return true;
        }
        if h.kind != HandleKind::File || h.ino != ino {
            return false;
        }
        match self.open_handle(ino, caller, Access::Silent) {
            Ok((mut handle, _)) => {
                handle.kernel_io = predecessors_io(h.backing);
                handle.page_cache_stream = handle.kernel_io == KernelIo::PageCache;
                handle.adopted = true;
                tracing::debug!("handle {fh} of node {ino} taken over");
                let _ = self.handles.insert_file(fh, handle);
                true
            }
            Err(e) => {
                tracing::warn!("handle {fh} of node {ino}: opening it again: {e:?}");
                false
            }
        }
    }

    /// Opens a predecessor's handle `fh` of directory `ino` again for `caller`, at its first
    /// READDIR here: a new snapshot of the listing, whose offsets are the same while the
    /// directory is unchanged.
    pub(super) fn adopt_dir(&self, fh: u64, ino: NodeId, caller: Caller) -> bool {
        match self.handles.predecessors(fh) {
            Some(h) if h.kind == HandleKind::Dir && h.ino == ino => {}
            _ => return false,
        }
        if self.handles.dir(fh).is_some() {
            return true;
        }
        match self.dir_handle(ino, caller) {
            Ok(handle) => {
                self.handles.insert_dir(fh, handle);
                true
            }
            Err(e) => {
                tracing::warn!("directory handle {fh} of node {ino}: opening it again: {e:?}");
                false
            }
        }
    }

    /// The release of `fh` if it is a predecessor's file handle never read here: its inode's
    /// open ends as the predecessor granted it. False if it is none.
    pub(super) fn release_predecessors(&self, fh: u64) -> bool {
        let Some(h) = self.handles.predecessors(fh) else {
            return false;
        };
        if h.kind == HandleKind::File {
            self.opener
                .passthrough
                .release(h.ino, predecessors_io(h.backing), |_| false);
        }
        self.handles.forget_predecessors(fh);
        true
    }
}

/// How the kernel reads a predecessor's open that had backing file `backing` (0: none).
fn predecessors_io(backing: u32) -> KernelIo {
    match backing {
        0 => KernelIo::Direct,
        id => KernelIo::Passthrough(id),
    }
}
