//! The handle table: what the kernel's file handles stand for.
//!
//! An open file ([`FileHandle`]) carries everything its reads need without asking anyone:
//! the version it opened (the cache key), the source descriptor opened as the caller, the
//! epochs its reads count in ([`Attribution`]), and the blocks it holds outside the cache
//! ([`Held`]). An open directory carries the listing taken at `opendir`; a directory the
//! kernel opened itself (handle 0) has one taken at its listing's start ([`Unopened`]).
//! Handle numbers are unique across files, directories and the order file, from one counter.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;

use super::kernel_cache;
use super::plan::SMALL_READ;
use crate::block::Block;
use crate::cache::BlockKey;
use crate::handover::state::{HandleKind, HandleSlots, OpenHandle};
use crate::jobs::JobKey;
use crate::jobs::ledger::Attribution;
use crate::namespace::{FileId, FileVersion, NodeId};
use crate::prefetch::ReadBy;
use crate::source::Listing;
use crate::tier::{Want, Why};

/// Blocks an open file holds outside the cache: the reader's own tier, between the cache
/// and the staging area (see [`crate::tier`]).
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Blocks the prefetcher staged for this file, claimed by this open, or taken from the
    /// blocks read moments ago; freed at close.
    pub claimed: Vec<(u64, Arc<Block>)>,
    /// The last blocks fetched for this handle (at most [`HELD_LAST`]), each with the bytes
    /// of it served so far, so that reads through a block the cache did not admit do not fetch
    /// it again: small reads of it, and the kernel's readahead READs, which start off block
    /// boundaries and so ask for two blocks each, a window of them in flight at once. A block
    /// leaves once all its bytes have been served.
    pub last: std::collections::VecDeque<Last>,
}

/// A block of [`Held::last`].
#[derive(Debug)]
pub(super) struct Last {
    block: u64,
    data: Arc<Block>,
    /// Bytes of it served to reads.
    served: u64,
}

/// The READs of a `direct_stream` open so far. Through direct I/O the kernel splits a read
/// where its buffer's pages pass 1 MiB: a read of 1 MiB into a buffer that does not begin on
/// a page is two READs, one of a few KiB. So a reader is judged by the mean of its first
/// [`DirectReads::JUDGED_AT`] READs, not by any one.
#[derive(Debug, Default)]
pub(super) struct DirectReads {
    reads: AtomicU32,
    bytes: AtomicU64,
}

impl DirectReads {
    const JUDGED_AT: u32 = 4;

    /// Counts a READ of `size` bytes, until they are judged; true once, at the last READ
    /// judged, if they were small (a mean of [`SMALL_READ`] or less).
    pub fn small(&self, size: u32) -> bool {
        if self.reads.load(Ordering::Relaxed) >= Self::JUDGED_AT {
            return false;
        }
        let bytes = self.bytes.fetch_add(size.into(), Ordering::Relaxed) + u64::from(size);
        let reads = self.reads.fetch_add(1, Ordering::Relaxed) + 1;
        reads == Self::JUDGED_AT && bytes / u64::from(reads) <= u64::from(SMALL_READ)
    }
}

/// Whether the reads of an open stream through its file, or seek: a reader streams from its
/// first read if that begins near the file's start, else once two reads in a row began near
/// where the read before ended (within `near` blocks either side: the kernel's READs of a
/// window are answered out of order, the first answered may not be the first sent); a read
/// that begins elsewhere ends the stream.
#[derive(Debug, Default)]
pub(super) struct Stream {
    /// One past the last block of the latest read (0: none yet).
    next: u64,
    /// Reads in a row that began near where the one before ended, up to 2.
    near: u8,
}

impl Stream {
    /// A read of blocks `first..=last`: true if it streams.
    pub fn read(&mut self, first: u64, last: u64, near: u64) -> bool {
        self.near = if self.next == 0 {
            if first <= near { 2 } else { 0 }
        } else if first + near >= self.next && first <= self.next + near {
            (self.near + 1).min(2)
        } else {
            0
        };
        self.next = last + 1;
        self.near == 2
    }
}

/// Blocks an open file keeps of those last fetched for it, partly served: a READ of the
/// kernel's readahead spans two blocks, and the READs of a window (up to 12 at once, the
/// kernel's background requests) are answered out of order. With 4, a reader streaming S3
/// shards in a pod found the block its READ shared with one answered earlier gone (pushed
/// out by the READs after it) and read its part again: 1-4% of an epoch read twice.
pub const HELD_LAST: usize = 16;

impl Held {
    /// Block `block`, if the open holds it.
    pub fn get(&self, block: u64) -> Option<Arc<Block>> {
        (self.claimed.iter())
            .find(|(b, _)| *b == block)
            .map(|(_, data)| data.clone())
            .or_else(|| {
                self.last
                    .iter()
                    .find(|l| l.block == block)
                    .map(|l| l.data.clone())
            })
    }

    /// Block `block` for a read of `served` bytes of it, if the open holds it: a block of
    /// the last fetched leaves once all its bytes have been served.
    pub fn serve(&mut self, block: u64, served: u64) -> Option<Arc<Block>> {
        if let Some((_, data)) = self.claimed.iter().find(|(b, _)| *b == block) {
            return Some(data.clone());
        }
        let at = self.last.iter().position(|l| l.block == block)?;
        let data = self.last[at].data.clone();
        self.served(at, served);
        Some(data)
    }

    /// Keeps `data`, block `block`, among the last blocks fetched, `served` bytes of it
    /// served already: unless they are all of it.
    pub fn keep_last(&mut self, block: u64, data: Arc<Block>, served: u64) {
        if let Some(at) = self.last.iter().position(|l| l.block == block) {
            return self.served(at, served);
        }
        if served >= data.len() as u64 {
            return;
        }
        if self.last.len() == HELD_LAST {
            self.last.pop_front();
        }
        self.last.push_back(Last {
            block,
            data,
            served,
        });
    }

    fn served(&mut self, at: usize, served: u64) {
        let last = &mut self.last[at];
        last.served += served;
        if last.served >= last.data.len() as u64 {
            self.last.remove(at);
        }
    }
}

/// An open file.
#[derive(Debug)]
pub(super) struct FileHandle {
    pub rel: Arc<Path>,
    pub version: FileVersion,
    /// The source file as opened for the caller (with the caller's credentials). Reads
    /// check it for changes made while the file is open, and read it directly when the path
    /// now names another file (replaced or removed), as a local open descriptor would.
    pub file: crate::source::SourceFile,
    /// The open was a hit and its bytes were counted then; reads count nothing more (unless
    /// the file turns out to need the source after all, see `read.rs`).
    pub counted_at_open: AtomicBool,
    /// Every read of the open reaches the daemon: the kernel neither reads it from a backing
    /// file nor keeps pages of it from before the open (`open.rs`). Then `asked` is what
    /// its reader read.
    pub reads_reach_daemon: bool,
    /// Bytes the kernel asked for through this open, within the file.
    pub asked: AtomicU64,
    /// The epochs the open's reads count in.
    pub att: Attribution,
    pub job_key: JobKey,
    /// The digest of the order the job followed at the open, if it gave one.
    pub order: Option<u64>,
    /// Files of its epoch the job had opened with this open.
    pub position: u64,
    /// This open re-reads what the job read moments ago: it is the same access and may take
    /// the blocks read then (see [`crate::tier::recent`]).
    pub same_access: bool,
    pub held: Mutex<Held>,
    /// Read through the kernel's page cache as a streamed miss: its pages are dropped when
    /// the open is released (`plan.rs`, `STREAMED_MISS_MIN`).
    pub drop_pages_at_release: bool,
    /// Read with direct I/O as a streamed miss of a job that reads large
    /// (`DaemonRead::DirectStream`): its reads say whether the job still does.
    pub direct_stream: bool,
    pub direct_reads: DirectReads,
    /// Set on a sentinel file's `keep_cache` open: is the kernel keeping its pages?
    pub watch: Option<kernel_cache::Watch>,
    /// How the kernel reads it (`passthrough.rs`), released with it.
    pub kernel_io: super::passthrough::KernelIo,
    /// The kernel reads it through its page cache, with readahead: through the daemon, or by
    /// passthrough from the source file (not from the cache's own file, which is memory
    /// already counted).
    pub page_cache_stream: bool,
    /// The node opened, for invalidation.
    pub ino: NodeId,
    /// The process that opened it: its reads' waits count as that reader's.
    pub pid: u32,
    /// The file's dense id (None for a file the scan has not seen).
    pub file_id: Option<FileId>,
    /// A read found the source file changed since the open.
    pub changed_while_open: AtomicBool,
    /// Where its reads went: whether they stream through the file (`read.rs`, `streams`).
    pub stream: Mutex<Stream>,
    /// Every byte of the version opened was in the memory cache at the open: if the source
    /// file changes while it is open, its reads go on serving that version (`read.rs`).
    pub cached_at_open: bool,
    /// Opened for one read under `--fast-open` that is not the file's access (see
    /// [`super::Access::Silent`]): it counts the bytes it moves, never a hit or a miss.
    pub silent: bool,
    /// Opened by a previous daemon of the mount, and opened again here at its first read
    /// (silent: its access was counted then). Its release ends the inode's open as the
    /// previous daemon granted it.
    pub adopted: bool,
    /// Made for an open the kernel made itself and told of (`told/`): the kernel holds no
    /// handle of it, so no successor daemon is told of it.
    pub told: bool,
}

impl FileHandle {
    /// A block of the file is read from below the cache after all: if the open counted it
    /// as a hit, it becomes a miss (once), so that hits never include reads of the source.
    pub fn no_longer_a_hit(&self, ledger: &crate::jobs::ledger::Ledger) {
        if !self.silent && self.counted_at_open.swap(false, Ordering::Relaxed) {
            tracing::debug!("{}: the hit at open became a miss", self.rel.display());
            ledger.hit_became_miss(&self.att, self.version.size);
        }
    }

    /// The read this open is, as [`crate::prefetch::Prefetcher::share`] keeps its blocks.
    pub fn read_by(&self) -> ReadBy {
        ReadBy {
            job: self.job_key,
            round: self.att.job_epoch,
            order: self.order,
            position: self.position,
        }
    }

    /// Block `block` of the file, wanted by this open's reader.
    pub fn want(&self, block: u64) -> Want<'_> {
        Want {
            key: BlockKey {
                version: self.version,
                block,
            },
            rel: &self.rel,
            job: self.job_key,
            epoch: self.att.job_epoch,
            why: if self.same_access {
                Why::Reread
            } else {
                Why::Read
            },
            stream: true,
        }
    }
}

/// An open directory: a snapshot of its listing taken at `opendir`.
#[derive(Debug)]
pub(super) struct DirHandle {
    pub node: NodeId,
    pub parent: NodeId,
    pub listing: Listing,
    /// Until when the listing's names (and the attributes the node table holds for them)
    /// may be handed to the kernel without an `lstat` each: set when the listing is the one
    /// the scan kept (see [`crate::namespace::Namespace::kept_listing`]).
    pub kept_until: Option<Instant>,
}

/// The page cache the kernel reads ahead for the open files, per reader process: a process
/// reads one file at a time (a data loader's worker streams one shard), so its open files
/// count at most one stream's windows, however many it holds open (a dataset that opens every
/// shard at its start). A process that reads several at once in threads (tf.data's
/// `interleave`) is counted one stream's room: its readers may then read some pages twice,
/// never more memory than the pod has.
#[derive(Debug, Default)]
struct Windows(Mutex<WindowsInner>);

#[derive(Debug, Default)]
struct WindowsInner {
    /// The windows of each process's open files, uncapped.
    by_pid: HashMap<u32, u64>,
    /// Their sum, each process's capped at a stream's.
    total: u64,
    /// The most `total` reached since [`Windows::peak`] was last asked.
    peak: u64,
}

impl Windows {
    /// Process `pid` opened a file of `bytes` of windows; a process counts at most `stream`.
    fn open(&self, pid: u32, bytes: u64, stream: u64) {
        if bytes > 0 {
            self.change(pid, stream, |held| held + bytes);
        }
    }

    /// Process `pid` closed a file of `bytes` of windows.
    fn close(&self, pid: u32, bytes: u64, stream: u64) {
        if bytes > 0 {
            self.change(pid, stream, |held| held.saturating_sub(bytes));
        }
    }

    fn change(&self, pid: u32, stream: u64, to: impl FnOnce(u64) -> u64) {
        let mut w = self.0.lock();
        let held = w.by_pid.get(&pid).copied().unwrap_or(0);
        let new = to(held);
        if new == 0 {
            w.by_pid.remove(&pid);
        } else {
            w.by_pid.insert(pid, new);
        }
        w.total = w.total - held.min(stream) + new.min(stream);
        w.peak = w.peak.max(w.total);
    }

    /// The most the windows took since the last call.
    fn peak(&self) -> u64 {
        let w = &mut *self.0.lock();
        std::mem::replace(&mut w.peak, w.total).max(w.total)
    }
}

/// The open files and directories of a mount, by handle number.
#[derive(Debug)]
pub(super) struct HandleTable {
    next: AtomicU64,
    files: Mutex<HashMap<u64, Arc<FileHandle>>>,
    dirs: Mutex<HashMap<u64, Arc<DirHandle>>>,
    /// The listings being read of directories the kernel opened itself.
    unopened: Mutex<Unopened<Arc<DirHandle>>>,
    /// Where the handles the kernel holds are kept for a successor daemon, and where a
    /// predecessor's are found (`handover/state/`); none without a keeper.
    slots: OnceLock<Arc<HandleSlots>>,
    /// A previous daemon left handles open (some may be released since).
    inherited: AtomicBool,
    /// The kernel's readahead window of the mount's files ([`HandleTable::set_window`]).
    window: AtomicU64,
    /// The page cache the open files read through it may hold ahead of their readers
    /// ([`HandleTable::windows_peak`]).
    windows: Windows,
}

impl Default for HandleTable {
    fn default() -> Self {
        HandleTable {
            // 0 is no handle at all to the kernel.
            next: AtomicU64::new(1),
            files: Mutex::default(),
            dirs: Mutex::default(),
            unopened: Mutex::default(),
            slots: OnceLock::new(),
            inherited: AtomicBool::new(false),
            window: AtomicU64::new(KERNEL_WINDOW),
            windows: Windows::default(),
        }
    }
}

/// Readahead windows an open file read through the page cache needs room for. The kernel
/// keeps up to two ahead of a reader (the one it reads in, and the next, started at its
/// marker); a third covers the time those pages wait while another reader streams faster (a
/// passthrough open of a source file reads at the disk's speed, and the page cache's oldest
/// pages go first). A passthrough open of a source file counts the mount's window too: its own
/// device's may be smaller, but it is the faster stream. Measured with 2 readers in a 384 MiB
/// pod, 2 shards of 1 GiB and one of 40 MiB, 3 epochs, 3 runs: with two windows each, the
/// slower reader's pages were read twice (epoch 1 read up to 1.013x the dataset, epoch 3 up to
/// 1.035x what the cache lacked); with three, 1.000-1.005x, and later epochs exactly what the
/// cache lacked.
const WINDOWS: u64 = 3;

/// The kernel's own readahead window, where the mount's is not raised (`--readahead 0`, or a
/// daemon not run as root).
pub const KERNEL_WINDOW: u64 = 128 << 10;

impl HandleTable {
    /// Keeps every handle in `slots` from now on; handle numbers go on after the highest a
    /// predecessor gave out.
    pub fn keep_in(&self, slots: Arc<HandleSlots>) {
        self.next.fetch_max(slots.next_fh(), Ordering::Relaxed);
        let inherited = !slots.all().is_empty();
        if self.slots.set(slots).is_ok() {
            self.inherited.store(inherited, Ordering::Relaxed);
        }
    }

    /// The handle `fh` a previous daemon of the mount opened, if it is still open.
    pub fn predecessors(&self, fh: u64) -> Option<OpenHandle> {
        if !self.inherited.load(Ordering::Relaxed) {
            return None;
        }
        self.slots.get()?.get(fh)
    }

    /// A predecessor's handle `fh` is released without having been opened again here.
    pub fn forget_predecessors(&self, fh: u64) {
        if let Some(slots) = self.slots.get() {
            slots.close_handle(fh);
        }
    }

    /// A handle number no other open has.
    pub fn next_fh(&self) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        if let Some(slots) = self.slots.get() {
            slots.gave_out(fh);
        }
        fh
    }

    /// The kernel's readahead window in the mount's files, in bytes.
    pub fn window(&self) -> u64 {
        self.window.load(Ordering::Relaxed)
    }

    /// The kernel reads ahead `bytes` in the mount's files (0: its own default).
    pub fn set_window(&self, bytes: u64) {
        let bytes = if bytes == 0 { KERNEL_WINDOW } else { bytes };
        self.window.store(bytes, Ordering::Relaxed);
    }

    /// Page cache the open files read through it need for what the kernel reads ahead of
    /// their readers ([`Windows`]), at its most since the last call: a shard read between two
    /// looks of the elastic budget counts. Such pages are reclaimable, and were they
    /// reclaimed before being read the kernel would ask for them again: the elastic budget
    /// leaves room for them (`crate::elastic`).
    pub fn windows_peak(&self) -> u64 {
        self.windows.peak()
    }

    /// The most the open files of one process take of [`HandleTable::windows_peak`].
    fn stream(&self) -> u64 {
        WINDOWS * self.window.load(Ordering::Relaxed)
    }

    /// What an open file adds to the windows of its process.
    fn window_of(&self, handle: &FileHandle) -> u64 {
        match handle.page_cache_stream {
            true => self.stream().min(handle.version.size),
            false => 0,
        }
    }

    /// Enters an open file as `fh` (from [`HandleTable::next_fh`]). True if it streams a
    /// shard through the page cache ([`crate::elastic::STREAM_MIN`] of readahead or more): the
    /// elastic budget would make room for its windows at once.
    pub fn insert_file(&self, fh: u64, handle: FileHandle) -> bool {
        let window = self.window_of(&handle);
        (self.windows).open(handle.pid, window, self.stream());
        if let Some(slots) = self.slots.get().filter(|_| !handle.told) {
            let backing = match handle.kernel_io {
                super::passthrough::KernelIo::Passthrough(id) => id,
                _ => 0,
            };
            slots.open_handle(OpenHandle {
                fh,
                ino: handle.ino,
                kind: HandleKind::File,
                backing,
            });
        }
        self.files.lock().insert(fh, Arc::new(handle));
        window >= crate::elastic::STREAM_MIN
    }

    /// Open file `fh`.
    pub fn file(&self, fh: u64) -> Option<Arc<FileHandle>> {
        self.files.lock().get(&fh).cloned()
    }

    /// Closes open file `fh`; returns it if it was one.
    pub fn remove_file(&self, fh: u64) -> Option<Arc<FileHandle>> {
        let handle = self.files.lock().remove(&fh);
        if let Some(h) = &handle {
            self.forget_predecessors(fh);
            (self.windows).close(h.pid, self.window_of(h), self.stream());
        }
        handle
    }

    /// Enters an open directory; returns its handle.
    pub fn add_dir(&self, handle: DirHandle) -> u64 {
        let fh = self.next_fh();
        self.insert_dir(fh, handle);
        fh
    }

    /// Enters an open directory as `fh`.
    pub fn insert_dir(&self, fh: u64, handle: DirHandle) {
        if let Some(slots) = self.slots.get() {
            slots.open_handle(OpenHandle {
                fh,
                ino: handle.node,
                kind: HandleKind::Dir,
                backing: 0,
            });
        }
        self.dirs.lock().insert(fh, Arc::new(handle));
    }

    /// Open directory `fh`.
    pub fn dir(&self, fh: u64) -> Option<Arc<DirHandle>> {
        self.dirs.lock().get(&fh).cloned()
    }

    /// Closes open directory `fh`.
    pub fn remove_dir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
        self.forget_predecessors(fh);
    }

    /// The listing being read of directory `ino`, which the kernel opened itself, if any.
    pub fn unopened_dir(&self, ino: NodeId) -> Option<Arc<DirHandle>> {
        self.unopened.lock().get(ino)
    }

    /// Keeps `listing` as the one being read of directory `ino`, which the kernel opened
    /// itself, until its end.
    pub fn keep_unopened_dir(&self, ino: NodeId, listing: Arc<DirHandle>) {
        self.unopened.lock().keep(ino, listing);
    }

    /// The listing of directory `ino` was read to its end.
    pub fn end_unopened_dir(&self, ino: NodeId) {
        self.unopened.lock().end(ino);
    }
}

/// Listings of directories that the kernel opens without asking (FUSE's no-opendir mode):
/// their READDIRs carry no handle, so the listing a READDIR at offset 0 takes is kept here
/// for the READDIRs after it, by directory, until one of them finds nothing left. At most
/// [`Unopened::MAX`] at once: a listing left unfinished (a reader that stopped early) gives
/// way to the newest, and a READDIR whose listing gave way takes a new one (its offsets
/// are the same while the directory is unchanged). The kernel keeps what it was given
/// (`FOPEN_CACHE_DIR`, implied by the mode), so each directory is listed here once until it
/// changes.
#[derive(Debug)]
struct Unopened<L> {
    listings: HashMap<NodeId, (L, u64)>,
    /// Listings taken so far: the oldest gives way first.
    taken: u64,
}

impl<L> Default for Unopened<L> {
    fn default() -> Self {
        Unopened {
            listings: HashMap::new(),
            taken: 0,
        }
    }
}

impl<L: Clone> Unopened<L> {
    /// Listings kept at once: far more than the directories a host lists at one time, and a
    /// bound on their names' memory.
    const MAX: usize = 64;

    fn get(&self, ino: NodeId) -> Option<L> {
        self.listings.get(&ino).map(|(listing, _)| listing.clone())
    }

    fn keep(&mut self, ino: NodeId, listing: L) {
        if self.listings.len() >= Self::MAX && !self.listings.contains_key(&ino) {
            let oldest = self.listings.iter().min_by_key(|(_, (_, taken))| *taken);
            if let Some((&old, _)) = oldest {
                self.listings.remove(&old);
            }
        }
        self.taken += 1;
        self.listings.insert(ino, (listing, self.taken));
    }

    fn end(&mut self, ino: NodeId) {
        self.listings.remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_reads_are_judged_once_by_their_mean_not_by_a_split_read() {
        // Reads of 1 MiB into a buffer off a page boundary: READs of 1,046,640 and 1,936.
        let large = DirectReads::default();
        let judged: Vec<bool> = [1_046_640, 1_936, 1_046_640, 1_936, 1_936]
            .into_iter()
            .map(|n| large.small(n))
            .collect();
        assert_eq!(judged, [false; 5]);
        // Reads of 16 KiB: small at the fourth READ, and only then.
        let small = DirectReads::default();
        let judged: Vec<bool> = (0..6).map(|_| small.small(16 << 10)).collect();
        assert_eq!(judged, [false, false, false, true, false, false]);
        // A mean of exactly SMALL_READ is small; a byte more is not.
        let edge = DirectReads::default();
        assert!((0..4).any(|_| edge.small(SMALL_READ)));
        let past = DirectReads::default();
        assert!(!(0..4).any(|_| past.small(SMALL_READ + 1)));
    }

    #[test]
    fn listings_of_unopened_directories_last_until_their_end_and_the_oldest_gives_way() {
        let mut u = Unopened::default();
        u.keep(7, "seven");
        u.keep(7, "seven again");
        assert_eq!(
            u.get(7),
            Some("seven again"),
            "a new listing replaces the old"
        );
        u.end(7);
        assert_eq!(u.get(7), None, "read to its end");
        for ino in 0..Unopened::<&str>::MAX as u64 {
            u.keep(100 + ino, "kept");
        }
        u.keep(100, "taken again");
        assert_eq!(
            u.listings.len(),
            Unopened::<&str>::MAX,
            "still within the bound"
        );
        u.keep(1, "one more");
        assert_eq!(u.listings.len(), Unopened::<&str>::MAX);
        assert_eq!(u.get(101), None, "the oldest gave way");
        assert_eq!(u.get(100), Some("taken again"), "retaken: not the oldest");
        assert_eq!(u.get(1), Some("one more"));
    }

    #[test]
    fn reads_stream_from_the_start_or_after_two_near_reads_and_a_seek_ends_it() {
        let mut s = Stream::default();
        // The first window's READs, answered out of order, stream.
        assert!(s.read(3, 3, 16));
        assert!(s.read(0, 1, 16));
        assert!(s.read(2, 2, 16));
        // A seek far away does not; two reads near it in a row stream again.
        assert!(!s.read(500, 500, 16));
        assert!(!s.read(501, 501, 16));
        assert!(s.read(502, 503, 16));
        assert!(s.read(490, 490, 16));
        // An open whose first read is far from the start seeks until it reads on.
        let mut t = Stream::default();
        assert!(!t.read(300, 300, 16));
        assert!(!t.read(100, 100, 16));
        assert!(!t.read(101, 101, 16));
        assert!(t.read(102, 102, 16));
    }

    #[test]
    fn a_block_fetched_for_a_handle_stays_until_all_its_bytes_are_served() {
        let block = |b: u8| Arc::new(Block::exact(&[b; 100]));
        let mut held = Held::default();
        // READs off block boundaries: one took 40 bytes of block 7, the next takes the rest.
        held.keep_last(7, block(7), 40);
        assert_eq!(held.serve(7, 30).unwrap()[0], 7);
        assert!(held.get(7).is_some());
        assert_eq!(held.serve(7, 30).unwrap()[0], 7);
        assert!(held.get(7).is_none() && held.serve(7, 10).is_none());
        // A block served whole by its one READ is not kept.
        held.keep_last(8, block(8), 100);
        assert!(held.get(8).is_none());
        // Two READs that waited for one fetch each keep their part.
        held.keep_last(9, block(9), 50);
        held.keep_last(9, block(9), 50);
        assert!(held.last.is_empty());
        // A window of READs answered out of order: the first block's other half finds it,
        // though the READs after it kept theirs.
        for b in 10..10 + HELD_LAST as u64 - 1 {
            held.keep_last(b, block(b as u8), 60);
        }
        assert_eq!(held.serve(10, 40).unwrap()[0], 10);
        // Past the bound the oldest goes.
        for b in 100..100 + HELD_LAST as u64 {
            held.keep_last(b, block(0), 1);
        }
        assert!(held.get(11).is_none() && held.get(100).is_some());
        assert_eq!(held.last.len(), HELD_LAST);
    }

    #[test]
    fn a_process_counts_one_stream_however_many_files_it_holds_open() {
        let w = Windows::default();
        let stream = 48;
        // A worker streams a shard; another opens every shard at once.
        w.open(1, 48, stream);
        for _ in 0..10 {
            w.open(2, 48, stream);
        }
        assert_eq!(w.peak(), 96);
        // A small file counts its size, within its process's stream.
        w.open(3, 5, stream);
        w.open(3, 5, stream);
        assert_eq!(w.peak(), 106);
        // The worker closed its shard and the small files went: the peak is asked once.
        w.close(1, 48, stream);
        w.close(3, 5, stream);
        w.close(3, 5, stream);
        assert_eq!(w.peak(), 106, "the most since the last look");
        assert_eq!(w.peak(), 48);
        // The opener's last files go: still one stream until the last.
        for _ in 0..9 {
            w.close(2, 48, stream);
        }
        assert_eq!(w.peak(), 48);
        w.close(2, 48, stream);
        assert_eq!(w.peak(), 48);
        assert_eq!((w.peak(), w.0.lock().by_pid.len()), (0, 0));
    }
}
