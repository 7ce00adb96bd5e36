//! Opens the kernel makes by itself, told to the daemon after the fact.
//!
//! A hot small file costs what its round trips cost: a 100 KiB file the kernel's page cache
//! holds is read natively in about 30 us, and an OPEN that asks the daemon costs 30-80 us of
//! wake-ups and switches before the daemon does anything (docs/BENCHMARKS.md, "Where a hot
//! file's time goes"). So where it is safe, the kernel opens files itself: the daemon answers
//! one OPEN with `ENOSYS` and the kernel sends no OPEN, FLUSH or RELEASE on the connection
//! again (FUSE's no-open mode; directories likewise, see `attrs.rs`). What an OPEN gave the
//! daemon comes another way:
//! - **Permissions**: the kernel checks each open against the modes it cached
//!   (`default_permissions`), and the source is watched (`watch.rs`), so a `chmod` reaches it
//!   at once. It is safe where modes say everything: no POSIX ACL in the source (the scan
//!   looks, on a mount other users may use), or `--acl`, with which the kernel reads them.
//! - **Accounting** (hits, epochs, the prefetcher's view of what a job has still to read): the
//!   kernel *tells* the daemon of every open, with the file's FUSE node id and the opening
//!   thread (the id FUSE requests carry too): by an eBPF program on the open system calls
//!   where the kernel loads one, else by fanotify (`events.rs`). Nobody waits for it: the
//!   opens queue in the kernel and a thread counts them in batches, exactly as an OPEN was
//!   counted ([`DatasetFs::told_open`]).
//! - **Reads**: a READ of a file nobody opened through the daemon comes with handle 0. The
//!   open it belongs to was queued before the READ was sent, so a READ that finds no told open
//!   of its file and thread first takes every queued event ([`DatasetFs::drain_told`]), and
//!   waits while the ring holds events it cannot read yet (another opener's record, half
//!   written when its CPU was taken from it, holds back those after it). The
//!   told open becomes a handle at the file's first READ, which its later READs use; it ends
//!   when the kernel has asked for the whole file, or after [`TOLD_IDLE`] without a READ.
//! - **Order hints** come over the mount's control socket, or by ioctl on the order file
//!   keyed by the process (`order.rs`).
//! - **Prefetched files** go to the kernel's page cache too (`FUSE_NOTIFY_STORE`), where the
//!   prefetcher brought a whole file into the cache in one block and the kernel knows the file
//!   (a listing or a lookup made its inode), from the moment the kernel may take the opens over:
//!   its reader then reads it with no READ, its open counted as a hit, as a file read before
//!   ([`DatasetFs::hand_to_kernel`]). A cold small file's READ was most of what it cost the
//!   daemon: 200,000 files of 200-600 B read cold by 2 processes, the FUSE threads' CPU fell
//!   from 5.2-6.9 s to 3.0-4.0 s, and the epoch from 9.6-11.4 s to 7.7-9.2 s (2 runs each,
//!   alternated). The bytes go only while the file is the version read (checked before and
//!   after: the watch's invalidation of a change may come first).
//!
//! It is not safe, and every open keeps asking the daemon, for a daemon that is not root
//! (eBPF and fanotify need it), an object store (its opens are a small part of a read, and
//! nothing watches it), `--read-delay`, a dataset of big files (shards: the kernel reads them by
//! passthrough, which needs an OPEN, and they are opened a few times a second), POSIX ACLs
//! without `--acl`, a source that cannot be watched whole, and while the scan runs.
//!
//! Nor is it worth it while opens are few: an asked open costs its reader a round trip, which
//! at a few hundred opens a second is a percent of a CPU, and gives what the kernel's opens
//! cannot: the source's own check as the caller at every open (ACLs, LSMs), passthrough for
//! cached files, and a file removed from the source while it is open still reads as the file
//! opened (the daemon holds it; a file the kernel opened is first opened in the source at its
//! first READ). So under `--opens auto` the daemon gets ready after the scan (every directory
//! marked) and the kernel takes the opens over once they come [`SWITCH_RATE`] a second: a
//! training job's first second. The switch happens once: the kernel cannot be asked to send
//! OPEN again. `--opens kernel` switches at the first open.

mod events;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::open::{Accessed, Counted, KernelReading};
use super::watch::SourceWatch;
use super::{Access, Caller, DatasetFs, FsError, ReadDone};
use crate::config::Opens;
use crate::namespace::{Kind, NodeId};
pub use events::told_by;
use events::{OpenEvents, Told};

/// A told open left without a READ this long is over (its unread bytes are taken back).
pub const TOLD_IDLE: Duration = Duration::from_secs(30);
/// How long after the reply to a told open's last READ the kernel is told to drop the file's
/// pages: for its reader to copy them (a page dropped before its
/// reader took it is read again, in a READ of the same access: [`ENDED_KEEP`]).
const DROP_DELAY: Duration = Duration::from_millis(10);
/// Tries to drop a file's pages, each after twice the wait of the one before.
const DROP_TRIES: u32 = 6;
/// How long a READ waits for another READ of its open to make the open's handle, or for the
/// opens held back in the ring to come through.
const BUSY_WAIT: Duration = Duration::from_millis(50);
/// How long a told open read whole is remembered, for READs of it that come late.
const ENDED_KEEP: Duration = Duration::from_secs(2);
/// Told opens not read through the daemon remembered at most (a hundred bytes or so each):
/// past it, the oldest go. A file's first READ comes right after its open.
const TOLD_MAX: usize = 16_384;
/// How long a told open waits for its first READ (one that comes later counts as a read of
/// its own). Until then it holds what it took from the staging area.
const TOLD_WAIT: Duration = Duration::from_secs(2);
/// The told-open thread's pause while opens come one after another, so that it takes them in
/// batches (each wake-up is a switch on a CPU the readers need): 5 ms of opens at 100,000 a
/// second is 500 events, well inside the kernel's queue of 16,384.
const BATCH_PAUSE: Duration = Duration::from_millis(5);
/// Events taken at once from which the told-open thread pauses before the next.
const BATCH_MIN: usize = 32;
/// Opens come one after another when the thread takes some within this long of the last it
/// took: it then pauses too, however few it took. Cold small files are opened a few thousand
/// times a second, each waited for on the disk: the thread woke for nearly every one (190,000
/// switches for 200,000 files, 16 us of CPU a file).
const STREAM_GAP: Duration = Duration::from_millis(20);
/// An open asked of the daemon is told of within this long: its event is queued as the open
/// returns, and the told-open thread takes the queue every [`BATCH_PAUSE`] or so once it
/// runs, but it starts only after every directory is marked (a second or more for 100,000
/// directories), and a loaded machine delays it further: 200 ms let a few opens asked while
/// the directories were marked be counted twice. An entry is taken by its event, and one is
/// made only for an open whose event is sure to come (see [`KernelOpens::asked`]), so a long
/// window costs nothing.
const SWITCH_WINDOW: Duration = Duration::from_secs(30);
/// The pause between the last directory's mark and the switch: long enough for an open
/// answered before the mark to have queued its event (microseconds after its reply; 20 ms
/// leaves room for a loaded machine), short beside the second of opens that began the switch.
const SWITCH_GRACE: Duration = Duration::from_millis(20);
/// How long the switch waits at a time for passed-through files to close (then again, while
/// the mount lives).
const PASSTHROUGH_WAIT: Duration = Duration::from_millis(500);
/// Opens a second from which the kernel opens files itself (under `--opens auto`): an asked
/// open costs its reader 30-80 us of round trip and the daemon some 20 us, so 1,000 a second
/// cost the readers 3-8% of a CPU's time; fewer cost them too little to give up what an
/// asked open gives (the source's own check as the caller, passthrough).
pub const SWITCH_RATE: u64 = 1000;
/// Asked opens remembered at most while the daemon is ready to be told of opens.
const ASKED_MAX: usize = 65_536;

/// A told open, counted, waiting for a READ (most never get one: the kernel holds their pages).
#[derive(Debug)]
struct Waiting {
    counted: Counted,
    hit: bool,
    /// Which insertion of its key it is (see [`ToldTable::order`]).
    seq: u64,
}

/// A told open that READs reach.
#[derive(Clone, Copy, Debug)]
enum Reading {
    /// Its first READ is making its handle.
    Opening { at: f64 },
    /// Read through the daemon as handle `fh`.
    Open { fh: u64, at: f64 },
    /// Read whole: a READ of it now (the kernel dropped a page before its reader took it)
    /// is part of the same access.
    Ended { at: f64 },
}

impl Reading {
    fn at(self) -> f64 {
        match self {
            Reading::Opening { at } | Reading::Open { at, .. } | Reading::Ended { at } => at,
        }
    }
}

/// What a READ of a file the kernel opened does next.
enum Next {
    /// Read through handle `fh`.
    Read(u64),
    /// Make the handle of the told open counted thus.
    Make { counted: Counted, hit: bool },
    /// Another READ is making it.
    Busy,
    /// It was read whole: this READ is a late one of the same open.
    Late,
    /// No told open: read as one.
    Untold,
}

/// Told opens by (node, thread): those counted and not read yet (most are never read through
/// the daemon: the kernel holds their pages), oldest first, at most [`TOLD_MAX`] and for
/// [`TOLD_WAIT`]; and those being read, until they end.
#[derive(Debug, Default)]
struct ToldTable {
    counted: hashbrown::HashMap<(NodeId, u32), Waiting>,
    order: std::collections::VecDeque<((NodeId, u32), u64, f64)>,
    reading: hashbrown::HashMap<(NodeId, u32), Reading>,
    seq: u64,
}

impl ToldTable {
    /// A told open of `key` at `now`; the handle of the open of `key` before it, if one is
    /// still read, ends (returned).
    fn counted(&mut self, key: (NodeId, u32), c: Counted, hit: bool, now: f64) -> Option<u64> {
        self.seq += 1;
        let seq = self.seq;
        self.order.push_back((key, seq, now));
        self.counted.insert(
            key,
            Waiting {
                counted: c,
                hit,
                seq,
            },
        );
        while self.order.len() > TOLD_MAX {
            self.pop_oldest();
        }
        match self.reading.remove(&key) {
            Some(Reading::Open { fh, .. }) => Some(fh),
            _ => None,
        }
    }

    /// A told open of `key` that is a hit of a file held whole in memory: no entry (its pages
    /// are the kernel's, and a READ of it, where the kernel let a page go, is served from
    /// memory as part of the open: [`DatasetFs::read_told`]). An older open of `key` not read
    /// yet is forgotten; the handle of one still read ends (returned). In a hot epoch every
    /// open is such a hit, and the table stays empty: an entry made and aged out for each was
    /// a fifth of the told-open thread's time (two looks in a table of 16,384).
    fn counted_in_memory(&mut self, key: (NodeId, u32)) -> Option<u64> {
        if !self.counted.is_empty() {
            self.counted.remove(&key);
        }
        match self.reading.remove(&key) {
            Some(Reading::Open { fh, .. }) => Some(fh),
            _ => None,
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((key, seq, _)) = self.order.pop_front()
            && self.counted.get(&key).is_some_and(|c| c.seq == seq)
        {
            self.counted.remove(&key);
        }
    }

    /// What a READ of `key` at `now` does next.
    fn next_for(&mut self, key: (NodeId, u32), now: f64) -> Next {
        let ended = match self.reading.get_mut(&key) {
            Some(Reading::Open { fh, at }) => {
                *at = now;
                return Next::Read(*fh);
            }
            Some(Reading::Opening { .. }) => return Next::Busy,
            Some(Reading::Ended { .. }) => true,
            None => false,
        };
        // A newer open of the file by the thread than the one read whole.
        match self.counted.remove(&key) {
            Some(c) => {
                self.reading.insert(key, Reading::Opening { at: now });
                Next::Make {
                    counted: c.counted,
                    hit: c.hit,
                }
            }
            None if ended => Next::Late,
            None => Next::Untold,
        }
    }

    /// Ends what waited too long: counted opens after [`TOLD_WAIT`], reads idle for
    /// [`TOLD_IDLE`] (their handles are returned, to release).
    fn sweep(&mut self, now: f64) -> Vec<u64> {
        while self
            .order
            .front()
            .is_some_and(|(_, _, at)| now - at > TOLD_WAIT.as_secs_f64())
        {
            self.pop_oldest();
        }
        let mut ended = Vec::new();
        self.reading.retain(|_, r| {
            let keep = match r {
                Reading::Ended { at } => now - *at < ENDED_KEEP.as_secs_f64(),
                _ => now - r.at() < TOLD_IDLE.as_secs_f64(),
            };
            if !keep && let Reading::Open { fh, .. } = r {
                ended.push(*fh);
            }
            keep
        });
        ended
    }
}

/// Files whose pages the kernel is to drop (see [`DatasetFs::drop_pages`]): files the cache
/// does not keep, each with its version and when its last READ was answered; and an eventfd
/// that wakes the told-open thread, which may be asleep for a second, when one comes.
#[derive(Debug)]
pub(super) struct DropQueue {
    queue: Mutex<Vec<PageDrop>>,
    wake: OwnedFd,
}

/// A file whose pages are to go.
#[derive(Clone, Copy, Debug)]
struct PageDrop {
    ino: NodeId,
    version: crate::namespace::FileVersion,
    /// When to try.
    due: std::time::Instant,
    /// Tries so far: pages still in use by their reader stay, and are tried again later.
    tries: u32,
}

impl DropQueue {
    fn new() -> std::io::Result<DropQueue> {
        let flags = rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK;
        Ok(DropQueue {
            queue: Mutex::default(),
            wake: rustix::event::eventfd(0, flags)?,
        })
    }

    /// The last READ of file `ino` at `version` was answered now.
    fn push(&self, ino: NodeId, version: crate::namespace::FileVersion) {
        self.again(PageDrop {
            ino,
            version,
            due: std::time::Instant::now() + DROP_DELAY,
            tries: 0,
        });
    }

    fn again(&self, drop: PageDrop) {
        let mut queue = self.queue.lock();
        queue.push(drop);
        if queue.len() == 1 {
            let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        }
    }

    /// The drops due now.
    fn due(&self) -> Vec<PageDrop> {
        let now = std::time::Instant::now();
        let mut queue = self.queue.lock();
        let (due, later) = queue.drain(..).partition(|d| d.due <= now);
        *queue = later;
        due
    }

    /// How long until the next drop is due, if one is queued.
    fn next_in(&self) -> Option<Duration> {
        let now = std::time::Instant::now();
        (self.queue.lock().iter())
            .map(|d| d.due.saturating_duration_since(now))
            .min()
    }
}

/// Who opens the mount's files, and what the daemon is told of the opens it does not see.
#[derive(Debug)]
pub(super) struct KernelOpens {
    pub mode: Opens,
    /// The mount point, through which the directories are marked.
    mountpoint: PathBuf,
    /// The mount is one other users may use (`--allow-other`), and without `--acl`.
    check_acls: bool,
    /// The kernel opens files itself: set once, never cleared.
    on: AtomicBool,
    /// The scan found it safe for the kernel to open files: opens are counted for the switch.
    ready: AtomicBool,
    /// The switch has begun.
    switching: AtomicBool,
    /// The mount, for the thread that makes the switch (`--opens auto`).
    switcher: OnceLock<Weak<DatasetFs>>,
    /// Opens asked of the daemon in the current second, and when it began.
    rate: Mutex<(u64, Option<std::time::Instant>)>,
    /// Why it does not (yet), for the stats and the log.
    why: Mutex<String>,
    /// The source's watches (`watch.rs`), where the kernel may open files.
    pub watch: OnceLock<Arc<SourceWatch>>,
    /// What tells opens (`events.rs`), once in place (for fanotify, the directories marked).
    events: OnceLock<OpenEvents>,
    /// Held while events are read and counted (so that a READ that drains knows its open was
    /// counted when it gets the lock); its buffer.
    drain: Mutex<Vec<u8>>,
    /// Told opens by (node, thread).
    told: Mutex<ToldTable>,
    /// Opens asked of the daemon while it was ready to be told of them: their events are not
    /// counted again: how many of each file by each thread, and when the last was asked (a
    /// job that opens a sample twice asks twice, and is told of twice).
    asked: Mutex<HashMap<(NodeId, u32), (u32, std::time::Instant)>>,
    /// The directories marked so far, with when each mark was in place.
    marked: Mutex<HashMap<NodeId, std::time::Instant>>,
    /// Directories to mark, found after the switch (made in the source later).
    unmarked: Mutex<Vec<NodeId>>,
    /// Files whose pages the kernel is to drop.
    drops: Arc<DropQueue>,
    /// The told-open thread, whose own opens (to drop pages) are not a job's.
    own_tid: std::sync::atomic::AtomicU32,
    /// Who forked whom, for readers gone before their opens were counted.
    forks: OnceLock<Option<Arc<crate::jobs::forks::Forks>>>,
    /// Threads' uids, for their jobs, with when they were read.
    uids: Mutex<HashMap<u32, (u32, f64)>>,
}

impl KernelOpens {
    pub fn new(mode: Opens, mountpoint: PathBuf, check_acls: bool) -> Self {
        KernelOpens {
            mode,
            mountpoint,
            check_acls,
            on: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            switching: AtomicBool::new(false),
            switcher: OnceLock::new(),
            rate: Mutex::default(),
            why: Mutex::new(match mode {
                Opens::Daemon => "--opens daemon".into(),
                _ => "the scan has not finished".into(),
            }),
            watch: OnceLock::new(),
            events: OnceLock::new(),
            drain: Mutex::new(vec![0; 256 << 10]),
            told: Mutex::default(),
            asked: Mutex::default(),
            unmarked: Mutex::default(),
            marked: Mutex::default(),
            drops: Arc::new(DropQueue::new().expect("an eventfd")),
            own_tid: Default::default(),
            forks: OnceLock::new(),
            uids: Mutex::default(),
        }
    }

    /// True once the kernel was judged safe to open files itself (the switch may be still to
    /// come), and while it is.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// ACLs of the source are looked for before the kernel is let check permissions alone
    /// (a mount other users may use, without `--acl`).
    pub fn check_acls(&self) -> bool {
        self.check_acls
    }

    /// The kernel opens files itself.
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Where `OPEN` is answered `ENOSYS`: from the first under `--opens kernel`.
    pub fn refuse_open(&self) -> bool {
        self.mode == Opens::Kernel || self.on()
    }

    /// "kernel" or "daemon", and why, for the stats.
    pub fn state(&self) -> (&'static str, String) {
        if self.refuse_open() {
            let told = match self.events.get() {
                Some(events) => format!("told by {}", events.how()),
                None => "not told: reads the page cache serves are not counted".into(),
            };
            ("kernel", told)
        } else {
            ("daemon", self.why.lock().clone())
        }
    }

    /// An open of `ino` by `pid` the daemon answered. Once the daemon is ready to be told of
    /// opens, its told event is not counted again; and once they come [`SWITCH_RATE`] a
    /// second, the kernel opens files itself from the next open on.
    pub fn asked(&self, ino: NodeId, dir: Option<NodeId>, pid: u32) {
        if !self.ready.load(Ordering::Relaxed) {
            return;
        }
        let now = std::time::Instant::now();
        // Its open is told if its directory was marked before this (the opener queues the
        // event after the reply, which comes after this). An open asked while its directory is
        // being marked is not recorded: its event, if the mark came before the opener queued
        // it, is counted a second time (a window of microseconds, once a directory); recorded,
        // an open with no event would hide a later told open of the same file by the thread.
        let marked_before = |d| self.marked.lock().get(&d).is_some_and(|at| *at < now);
        // eBPF tells every open from the moment it is in place, and the event is queued as the
        // open returns, after this.
        let told_before = self.events.get().is_some_and(|e| !e.needs_marks());
        if told_before || dir.is_some_and(marked_before) {
            let mut asked = self.asked.lock();
            if asked.len() >= ASKED_MAX {
                asked.retain(|_, (_, at)| now.duration_since(*at) < SWITCH_WINDOW);
            }
            let entry = asked.entry((ino, pid)).or_insert((0, now));
            *entry = (entry.0 + 1, now);
        }
        let mut rate = self.rate.lock();
        let begun = *rate.1.get_or_insert(now);
        rate.0 += 1;
        let elapsed = now.duration_since(begun);
        if elapsed >= Duration::from_secs(1) {
            let per_second = rate.0 as f64 / elapsed.as_secs_f64();
            *rate = (0, Some(now));
            if per_second >= SWITCH_RATE as f64 {
                drop(rate);
                self.switch_soon(&format!("{per_second:.0} a second"));
            }
        } else if rate.0 >= SWITCH_RATE {
            // As many as a second should bring, sooner.
            *rate = (0, Some(now));
            drop(rate);
            self.switch_soon(&format!("{SWITCH_RATE} in {:.2} s", elapsed.as_secs_f64()));
        }
    }

    /// Opens came `how` fast: the switch begins (once), on a thread of its own.
    fn switch_soon(&self, how: &str) {
        if self.switching.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::info!(
            "opens: {how}: the kernel takes the opens over once every directory is marked"
        );
        if let Some(fs) = self.switcher.get().cloned() {
            let spawned = std::thread::Builder::new()
                .name("coorfs-told".into())
                .spawn(move || switch_and_count(fs));
            if let Err(e) = spawned {
                tracing::warn!("no thread to count told opens: {e}");
            }
        }
    }

    /// The kernel opens files itself from the next open on.
    fn switch_on(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    /// An event of an open of `ino` by `pid` that the daemon answered (so counted already).
    fn was_asked(&self, ino: NodeId, pid: u32) -> bool {
        let mut asked = self.asked.lock();
        let Some((n, at)) = asked.get_mut(&(ino, pid)) else {
            return false;
        };
        let fresh = at.elapsed() < SWITCH_WINDOW;
        *n -= 1;
        if *n == 0 {
            asked.remove(&(ino, pid));
        }
        fresh
    }

    /// Directory `node` appeared after the switch: it is marked by the told-open thread.
    pub fn mark_later(&self, node: NodeId) {
        if self.events.get().is_some_and(OpenEvents::needs_marks) {
            self.unmarked.lock().push(node);
        }
    }

    /// What a READ of `key` (node, thread) at `now` does next.
    fn next_for(&self, key: (NodeId, u32), now: f64) -> Next {
        self.told.lock().next_for(key, now)
    }

    fn uid_of(&self, tid: u32, now: f64) -> u32 {
        if let Some((uid, at)) = self.uids.lock().get(&tid)
            && now - at < 1.0
        {
            return *uid;
        }
        use std::os::unix::fs::MetadataExt;
        // A process's /proc directory belongs to its effective uid; a thread's too. One gone
        // already is its parent's user.
        let forks = self.forks.get().and_then(Option::as_deref);
        let mut at = tid;
        let mut uid = u32::MAX;
        for _ in 0..4 {
            match std::fs::metadata(format!("/proc/{at}")) {
                Ok(m) => {
                    uid = m.uid();
                    break;
                }
                Err(_) => match forks.and_then(|f| f.parent(at)) {
                    Some(parent) => at = parent,
                    None => break,
                },
            }
        }
        let mut uids = self.uids.lock();
        if uids.len() >= 4096 {
            uids.clear();
        }
        uids.insert(tid, (uid, now));
        uid
    }
}

impl DatasetFs {
    /// Where the kernel may open files, why not, if not (see the module header): `None` once
    /// the scan is complete and nothing stands in the way.
    fn kernel_opens_refusal(&self, acls: bool) -> Option<String> {
        let mean = {
            let files = self.tree.scan.files.load(Ordering::Relaxed).max(1);
            self.tree.scan.bytes.load(Ordering::Relaxed) / files
        };
        let root = rustix::process::geteuid().is_root();
        let why = match self.opener.opens.mode {
            Opens::Daemon => "--opens daemon".into(),
            Opens::Kernel => return None,
            Opens::Auto if !root => "the daemon is not root: it cannot be told of opens".into(),
            Opens::Auto if crate::source::object::ObjectUrl::is_url(self.tree.source.root()) => {
                "an object store: an open is a small part of a read".into()
            }
            Opens::Auto if self.opener.read_delay => "--read-delay".into(),
            Opens::Auto if mean >= super::plan::STREAMED_MISS_MIN => format!(
                "a dataset of big files ({} a file): their reads, not their opens, are what \
                 they cost",
                crate::units::format_size(mean)
            ),
            Opens::Auto if acls => {
                "the source has POSIX ACLs, which only --acl lets the kernel check".into()
            }
            Opens::Auto => match self.opener.opens.watch.get().map(|w| w.failed()) {
                None => "the source cannot be watched".into(),
                Some(Some(why)) => format!("the source cannot be watched: {why}"),
                Some(None) => return None,
            },
        };
        Some(why)
    }

    /// After the scan: if the kernel may open files itself (see the module header), the
    /// daemon gets ready to be told of opens (every directory marked, the told-open thread
    /// started); under `--opens auto` the kernel then opens files itself once opens come
    /// [`SWITCH_RATE`] a second ([`KernelOpens::opened`]), under `--opens kernel` it already
    /// does.
    pub fn open_in_kernel_if_safe(self: &Arc<Self>) {
        if self.opener.opens.mode == Opens::Daemon {
            return;
        }
        let acls = self.opener.opens.check_acls
            && self.opener.opens.mode == Opens::Auto
            && self.source_has_acls();
        if let Some(why) = self.kernel_opens_refusal(acls) {
            tracing::info!("opens: every open asks the daemon ({why})");
            *self.opener.opens.why.lock() = why;
            return;
        }
        let weak = Arc::downgrade(self);
        (self.reads.prefetcher).tell_whole_files(Box::new(move |node, version, data| {
            if let Some(fs) = weak.upgrade() {
                fs.hand_to_kernel(node, version, data);
            }
        }));
        if self.opener.opens.mode == Opens::Auto {
            // Marks are placed when the switch comes (they take a lookup of every directory
            // through the mount): a mount that is never read fast never makes them.
            tracing::info!(
                "opens: the kernel will open files itself once they come {SWITCH_RATE} a second"
            );
            *self.opener.opens.why.lock() = format!(
                "ready for the kernel to open files, once they come {SWITCH_RATE} a second"
            );
            let _ = self.opener.opens.switcher.set(Arc::downgrade(self));
            self.opener.opens.ready.store(true, Ordering::Relaxed);
            return;
        }
        let told = match rustix::process::geteuid().is_root() {
            true => self.mark_directories(),
            false => Err("the daemon is not root".into()),
        };
        if let Err(why) = told {
            tracing::info!(
                "opens: the kernel opens files itself (--opens kernel), and the daemon is not \
                 told of them ({why}): reads the page cache serves are not counted"
            );
            return;
        }
        tracing::info!("opens: the kernel opens files itself; the daemon is told of each");
        self.opener.opens.ready.store(true, Ordering::Relaxed);
        self.opener.opens.switch_on();
        self.listen_for_forks();
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("coorfs-told".into())
            .spawn(move || told_thread(weak));
        if let Err(e) = spawned {
            tracing::warn!("no thread to count told opens: {e}");
        }
    }

    /// A file a prefetch brought whole into the cache goes to the kernel's page cache too,
    /// where the kernel opens files itself and tells the daemon of each open, or will once
    /// opens come fast (`--opens auto` is ready): its reader then reads it with no READ, its
    /// open counted all the same, a hit (told, or asked: an OPEN the daemon answers for a file
    /// it holds keeps the kernel's pages), as a file read before. In a first epoch the
    /// prefetcher runs ahead of the switch, so waiting for it would hand over nothing.
    /// A cold small file's READ is most of what it costs the daemon (a round trip, and the
    /// reader's wait for it); this is one write to the FUSE device, off the reader's path, on
    /// the thread that tells the kernel of changes (a READ of the file may hold its pages
    /// until a FUSE thread answers it, and that thread may be waiting for this very fetch).
    fn hand_to_kernel(
        &self,
        node: NodeId,
        version: crate::namespace::FileVersion,
        data: Arc<crate::block::Block>,
    ) {
        if !self.opener.opens.ready() {
            return;
        }
        if let Some(invalidate) = self.opener.invalidator.get() {
            invalidate(super::Invalidation::Store(node, version, data), false);
        }
    }

    /// Starts following forks, to place readers gone before their opens are counted.
    fn listen_for_forks(&self) {
        let forks = crate::jobs::forks::Forks::listen(self.reads.jobs.found());
        let _ = self.opener.opens.forks.set(forks);
    }

    /// Puts in place what tells opens, and (fanotify) marks every directory of the mount. The
    /// group is in place before the first mark, so that an open asked meanwhile in a marked
    /// directory is known for one (its event is not counted again).
    fn mark_directories(&self) -> Result<(), String> {
        let events = OpenEvents::new(&self.opener.opens.mountpoint)?;
        let events = match self.opener.opens.events.set(events) {
            Ok(()) => self.opener.opens.events.get().expect("just set"),
            Err(_) => return Err("marked twice".into()),
        };
        if !events.needs_marks() {
            tracing::debug!("opens: told by eBPF");
            return Ok(());
        }
        let dirs = self.tree.ns.dirs();
        for dir in &dirs {
            let Some(rel) = self.tree.ns.path(*dir) else {
                continue;
            };
            events
                .mark(&self.opener.opens.mountpoint.join(&rel))
                .map_err(|e| format!("fanotify mark of {}: {e}", rel.display()))?;
            let at = std::time::Instant::now();
            self.opener.opens.marked.lock().insert(*dir, at);
        }
        tracing::debug!("opens: {} directories marked", dirs.len());
        Ok(())
    }

    /// True if a file or directory of the source has a POSIX access ACL (an `lgetxattr` each,
    /// on mounts other users may use without `--acl`).
    fn source_has_acls(&self) -> bool {
        let acl = crate::stats::ACL_XATTRS[0];
        (self.tree.ns.all_nodes().into_iter())
            .filter_map(|node| self.tree.ns.path(node))
            .any(|rel| matches!(self.tree.source.acl(&rel, acl), Ok(Some(_))))
    }

    /// Counts the told opens queued so far (see the module header).
    /// Returns how many there were.
    pub(super) fn drain_told(&self) -> usize {
        let Some(events) = self.opener.opens.events.get() else {
            return 0;
        };
        let mut buf = self.opener.opens.drain.lock();
        let mut n = 0;
        while events.read(&mut buf, |told| {
            n += 1;
            // Before the kernel opens files itself every open is asked, and counted then.
            if self.opener.opens.on() {
                self.told_open(told)
            } else {
                self.opener.opens.was_asked(told.node, told.tid);
            }
        }) {}
        n
    }

    /// The kernel told of an open of node `ino` by thread `tid`: counted as its OPEN would
    /// have been ([`DatasetFs::count_access`]), and kept for its READs.
    fn told_open(
        &self,
        Told {
            node: ino,
            tid,
            uid,
        }: Told,
    ) {
        if tid == self.opener.opens.own_tid.load(Ordering::Relaxed) {
            return;
        }
        let Some(info) = self.tree.ns.info(ino) else {
            return;
        };
        if info.attr.kind != Kind::File {
            return;
        }
        if self.opener.opens.was_asked(ino, tid) {
            return;
        }
        let now = self.reads.ledger.now();
        let uid = uid.unwrap_or_else(|| self.opener.opens.uid_of(tid, now));
        let caller = Caller {
            pid: tid,
            uid,
            gid: 0,
        };
        let version = info.version;
        let in_memory = self.reads.tiers.memory.holds_file(&version);
        // The path is needed for a miss (its staged blocks are claimed by it) or the disk
        // tier's look: a hit in memory, the hot path, does without.
        let rel = match (in_memory, &self.reads.tiers.disk) {
            (true, None) => PathBuf::new(),
            _ => match self.tree.ns.path(ino) {
                Some(rel) => rel,
                None => return,
            },
        };
        let hit = in_memory
            || (self.reads.tiers.disk.as_ref()).is_some_and(|d| d.holds_file(&rel, &version));
        let forks = self.opener.opens.forks.get().and_then(Option::as_deref);
        let job = self.reads.jobs.get_after(tid, uid, now, forks);
        let accessed = Accessed {
            rel: &rel,
            version,
            file_id: info.file_id,
        };
        let counted = self.count_access(job, &accessed, hit, caller, now);
        self.tell_prefetcher(&accessed, &counted, hit);
        crate::stats::Counters::add(&self.reads.ledger.stats().counters.told_opens, 1);
        let mut told = self.opener.opens.told.lock();
        let ended = match in_memory {
            true => told.counted_in_memory((ino, tid)),
            false => told.counted((ino, tid), counted, hit, now),
        };
        drop(told);
        if let Some(fh) = ended {
            self.release(fh);
        }
    }

    /// A READ with no handle (the kernel opened the file itself): through the handle of its
    /// told open, made at its first READ; else (an open that was not told) as one read.
    pub(super) fn read_told(
        &self,
        ino: NodeId,
        offset: u64,
        size: u32,
        caller: Caller,
        done: ReadDone,
    ) {
        let key = (ino, caller.pid);
        let now = self.reads.ledger.now();
        let mut next = self.opener.opens.next_for(key, now);
        // The open this READ belongs to may still be queued (an earlier open of the file by
        // the thread, read whole, is no proof it is not).
        let events = self.opener.opens.events.get();
        if events.is_some() && matches!(next, Next::Untold | Next::Late) {
            self.drain_told();
            next = self.opener.opens.next_for(key, now);
        }
        // It waits, a little, for either of two things:
        // - another READ of the open (readahead sends several) making its handle, which takes
        //   an open of the source file, so that the handle sees every byte asked (its end
        //   drops the file's pages);
        // - its open, held back in the ring behind one another thread was telling of when its
        //   CPU was taken from it (`OpenEvents::held_back`): on a loaded machine such a READ
        //   was counted as an open of its own, and again when its open came through.
        let waited = std::time::Instant::now();
        while waited.elapsed() < BUSY_WAIT {
            let held = matches!(next, Next::Untold) && events.is_some_and(OpenEvents::held_back);
            if !held && !matches!(next, Next::Busy) {
                break;
            }
            std::thread::yield_now();
            if held {
                self.drain_told();
            }
            next = self.opener.opens.next_for(key, now);
        }
        let fh = match next {
            Next::Read(fh) => fh,
            Next::Make { counted, hit } => match self.told_handle(ino, caller, counted, hit) {
                Ok(fh) => {
                    (self.opener.opens.told.lock().reading)
                        .insert(key, Reading::Open { fh, at: now });
                    fh
                }
                Err(e) => {
                    self.opener.opens.told.lock().reading.remove(&key);
                    return done(Err(e));
                }
            },
            // Read whole, or still making its handle: this one is a read of the same open.
            Next::Late | Next::Busy => {
                return self.read_once(ino, offset, size, caller, Access::Silent, done);
            }
            // A hit held in memory makes no entry: its READs are part of its open, counted.
            Next::Untold if self.held_in_memory(ino) => {
                return self.read_once(ino, offset, size, caller, Access::Silent, done);
            }
            Next::Untold => return self.read_unopened(ino, offset, size, caller, done),
        };
        let Some(h) = self.handles.file(fh) else {
            return self.read_once(ino, offset, size, caller, Access::Silent, done);
        };
        // A miss's pages go once the kernel has asked for the whole file and the reply that
        // completed it is out (readahead sends several READs at once: whichever ends last).
        let done: ReadDone = match h.reads_reach_daemon {
            true => {
                let (drops, handle) = (self.opener.opens.drops.clone(), h.clone());
                Box::new(move |result| {
                    done(result);
                    if handle.asked.load(Ordering::Relaxed) >= handle.version.size {
                        drops.push(ino, handle.version);
                    }
                })
            }
            false => done,
        };
        self.read(fh, offset, size, done);
        let whole = match h.reads_reach_daemon {
            true => h.asked.load(Ordering::Relaxed) >= h.version.size,
            false => offset + size as u64 >= h.version.size,
        };
        if whole {
            let mut told = self.opener.opens.told.lock();
            if matches!(told.reading.get(&key), Some(Reading::Open { fh: f, .. }) if *f == fh) {
                told.reading.insert(key, Reading::Ended { at: now });
            }
            drop(told);
            self.release(fh);
        }
    }

    /// Node `ino` is a file the memory cache holds whole, as it is now.
    fn held_in_memory(&self, ino: NodeId) -> bool {
        (self.tree.ns.info(ino)).is_some_and(|i| self.reads.tiers.memory.holds_file(&i.version))
    }

    /// The handle of a told open, at its first READ: the source file opened as the caller
    /// (the source still checks), entered in the handle table for the open's later READs.
    fn told_handle(
        &self,
        ino: NodeId,
        caller: Caller,
        counted: Counted,
        hit: bool,
    ) -> Result<u64, FsError> {
        let opened = self.open_source(ino, caller)?;
        let reading = KernelReading::told(hit);
        let mut handle =
            super::open::file_handle(ino, caller, opened, counted, hit, Access::Counted, reading);
        handle.told = true;
        let fh = self.handles.next_fh();
        self.handles.insert_file(fh, handle);
        Ok(fh)
    }

    /// Drops the kernel's pages of the files answered [`DROP_DELAY`] ago or more: an open of
    /// each (the kernel opens it without asking) and `POSIX_FADV_DONTNEED`, which drops its
    /// clean pages and, unlike an invalidation of the node, keeps its attributes (whose loss
    /// would cost the next open a GETATTR). The delay lets the reader take the pages first:
    /// pages in use stay.
    ///
    /// The kernel's page cache is LRU: left there, the pages of files the cache does not keep
    /// would push out those of files it does, and serve the file's next open without the
    /// daemon (which then reads it from the source when the kernel drops them). An open the
    /// daemon answers keeps them out with direct I/O.
    fn drop_pages(&self) {
        for mut drop in self.opener.opens.drops.due() {
            // A file the cache took meanwhile keeps its pages: they are a hit's.
            if self.reads.tiers.memory.holds_file(&drop.version) {
                continue;
            }
            let Some(rel) = self.tree.ns.path(drop.ino) else {
                continue;
            };
            let path = self.opener.opens.mountpoint.join(&rel);
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOATIME | libc::O_NONBLOCK)
                .open(&path);
            let file = match opened {
                Ok(file) => file,
                Err(e) => {
                    tracing::debug!("dropping the pages of {}: {e}", rel.display());
                    continue;
                }
            };
            let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
            let size = drop.version.size.max(1);
            tracing::trace!(
                "dropped the pages of {} (try {}): {:?} left",
                rel.display(),
                drop.tries,
                crate::source::cached_pages(&file, 0, size)
            );
            if crate::source::cached_pages(&file, 0, size).is_some_and(|n| n > 0)
                && drop.tries < DROP_TRIES
            {
                // Its reader has not taken them yet (a busy CPU): later.
                drop.tries += 1;
                drop.due = std::time::Instant::now() + DROP_DELAY * (1 << drop.tries);
                self.opener.opens.drops.again(drop);
            }
        }
    }

    /// Ends told opens that waited too long (see [`ToldTable::sweep`]).
    fn sweep_told(&self) {
        let ended = self.opener.opens.told.lock().sweep(self.reads.ledger.now());
        for fh in ended {
            self.release(fh);
        }
    }
}

/// Under `--opens auto`, once opens came fast: every directory marked, the kernel opens files
/// itself from the next open on, and this thread goes on to count the opens it tells of.
fn switch_and_count(fs: Weak<DatasetFs>) {
    // The kernel opens files through its page cache, which it refuses (EIO) for an inode that
    // has a backing file: no inode is passed through from now on, and the switch waits for
    // the last release of those that are (a file held open holds the switch back).
    let mut told_why = false;
    loop {
        let Some(fs) = fs.upgrade() else { return };
        let left = fs.opener.passthrough.close(PASSTHROUGH_WAIT);
        if left == 0 {
            break;
        }
        if !std::mem::replace(&mut told_why, true) {
            tracing::info!("opens: the switch waits for {left} files passed through to close");
            *fs.opener.opens.why.lock() =
                format!("the switch waits for {left} files passed through to close");
        }
    }
    {
        let Some(fs) = fs.upgrade() else { return };
        if let Err(why) = fs.mark_directories() {
            tracing::info!("opens: every open asks the daemon (not told of opens: {why})");
            *fs.opener.opens.why.lock() = format!("not told of opens: {why}");
            fs.opener.opens.ready.store(false, Ordering::Relaxed);
            fs.opener.passthrough.reopen();
            return;
        }
        fs.listen_for_forks();
        // Every event queued so far is of an open the daemon answered, and counted: among them
        // those asked while their directory was being marked, which have no entry in `asked`.
        // Their events are queued as their openers return, within microseconds of the reply:
        // after a pause they are all in the queue, and dropped with it before the switch.
        std::thread::sleep(SWITCH_GRACE);
        fs.drain_told();
        fs.opener.opens.switch_on();
    }
    told_thread(fs)
}

/// The told-open thread: counts told opens in batches, ends idle ones, marks directories made
/// after the switch; ends with the mount.
fn told_thread(fs: Weak<DatasetFs>) {
    let fd = match fs.upgrade().and_then(|fs| {
        (fs.opener.opens.events.get()).and_then(|e| e.as_fd().try_clone_to_owned().ok())
    }) {
        Some(fd) => fd,
        None => return,
    };
    // The pages this thread drops it drops through opens of its own, which are told too.
    if let Some(fs) = fs.upgrade() {
        fs.opener.opens.own_tid.store(
            rustix::thread::gettid().as_raw_nonzero().get() as u32,
            Ordering::Relaxed,
        );
    }
    let Some(woken) = fs
        .upgrade()
        .and_then(|fs| fs.opener.opens.drops.wake.try_clone().ok())
    else {
        return;
    };
    let mut swept = std::time::Instant::now();
    let mut lost = 0;
    let mut last_took = swept - STREAM_GAP;
    // While it pauses between batches of opens it still drops pages when they are due: a
    // file read again right after its pages were due to go would be served from them.
    let mut paused_until = swept;
    loop {
        let pause = paused_until.saturating_duration_since(std::time::Instant::now());
        let mut fds = [
            rustix::event::PollFd::new(&woken, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN),
        ];
        let listened = if pause.is_zero() { 2 } else { 1 };
        let mut wait = (fs.upgrade())
            .and_then(|fs| fs.opener.opens.drops.next_in())
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        if !pause.is_zero() {
            wait = wait.min(pause);
        }
        let wait = rustix::time::Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: wait.subsec_nanos() as i64,
        };
        let _ = rustix::event::poll(&mut fds[..listened], Some(&wait));
        if !fds[0].revents().is_empty() {
            let mut count = [0u8; 8];
            let _ = rustix::io::read(&woken, &mut count);
        }
        let Some(fs) = fs.upgrade() else { return };
        // A few opens are counted at once, while their processes still run (a job is told
        // by its process tree; one that exited is placed by the fork listener); many, or a
        // stream of them, in batches. A READ that needs its open counted sooner takes the
        // queue itself (`read_told`).
        let now = std::time::Instant::now();
        if paused_until <= now {
            let took = fs.drain_told();
            let streaming = took > 0 && now.duration_since(last_took) < STREAM_GAP;
            if took > 0 {
                last_took = now;
            }
            if took >= BATCH_MIN || streaming {
                paused_until = now + BATCH_PAUSE;
            }
        }
        fs.drop_pages();
        if swept.elapsed() >= Duration::from_secs(1) {
            swept = std::time::Instant::now();
            fs.sweep_told();
            let now_lost = fs.opener.opens.events.get().map_or(0, OpenEvents::lost);
            if now_lost > lost {
                tracing::warn!(
                    "{} opens came faster than they could be counted: their hits are not counted",
                    now_lost - lost
                );
                lost = now_lost;
            }
            let unmarked = std::mem::take(&mut *fs.opener.opens.unmarked.lock());
            if let Some(events) = fs.opener.opens.events.get() {
                for dir in unmarked {
                    let Some(rel) = fs.tree.ns.path(dir) else {
                        continue;
                    };
                    match events.mark(&fs.opener.opens.mountpoint.join(&rel)) {
                        Ok(()) => {
                            let at = std::time::Instant::now();
                            fs.opener.opens.marked.lock().insert(dir, at);
                        }
                        Err(e) => tracing::debug!("fanotify mark of {}: {e}", rel.display()),
                    }
                }
            }
        }
    }
}
