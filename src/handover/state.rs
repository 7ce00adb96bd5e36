//! What a daemon leaves its successor: four memory files (memfd) that the keeper holds.
//!
//! The kernel keeps a FUSE connection's node ids and file handles across a daemon's death
//! (the keeper holds the `/dev/fuse` descriptor); the successor must know what they stand
//! for, and which blocks the cache it takes over holds. Four regions, each a memfd mapped
//! shared by the daemon, written as things happen and read once by a successor:
//!
//! - [`Meta`] (one page): what INIT negotiated, the daemons so far, why the last one ended,
//!   when, and the longest pause a takeover caused.
//! - [`NodeJournal`]: every node id the daemon gave out, with its parent, name and kind, in
//!   the order given (nodes are never removed: FORGET is ignored, see `namespace.rs`). A
//!   successor replays it into a node table with the same ids; the attributes come from the
//!   source again (every lookup, getattr and open reads them anyway). About 11 bytes plus
//!   the name a node: 31 MiB for ImageNet's 1.28 M files of 20-byte names.
//! - [`CacheJournal`]: every change to the memory cache's index (a block added, in the arena
//!   or a file of the cache's tmpfs, or removed), 80 bytes each; a successor replays it over
//!   the arena and the tmpfs it takes over (`cache/mod.rs`).
//! - [`HandleSlots`]: the open file and directory handles the kernel holds, with the node
//!   each opened and its passthrough backing id, 32 bytes each, slots reused at release.
//!
//! Each region starts with a magic number and a format version; a successor refuses a region
//! it does not know rather than guess. Writes are ordered so that a daemon killed in the
//! middle of one leaves nothing half-read: a journal record counts once the journal's length
//! says so (stored after the record), a slot once its handle number is set (stored last).
//! The memory is the daemon's to count: it is shared memory charged to the cgroup that
//! touches it first, and it is small next to the node table and the cache it mirrors.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use parking_lot::Mutex;

use crate::namespace::{FileVersion, Kind, NodeId};

/// Address space reserved for each region's mapping: the file grows into it (`ftruncate`),
/// the mapping never moves, so that nothing holding a pointer into it must be told.
const META_RESERVE: usize = 4096;
const JOURNAL_RESERVE: usize = 1 << 38;
const SLOTS_RESERVE: usize = 1 << 34;

/// A memfd and a shared mapping of up to its reserve, grown by whole steps.
#[derive(Debug)]
struct Region {
    fd: OwnedFd,
    map: MmapRaw,
    /// The memfd's length now; bytes past it must not be touched (SIGBUS).
    len: AtomicU64,
    grow: Mutex<()>,
}

impl Region {
    /// A new, zeroed region named `name` (shown in /proc/PID/fd) of `len` bytes.
    fn create(name: &str, len: u64, reserve: usize) -> io::Result<Region> {
        let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&fd, len)?;
        Region::map(fd, reserve)
    }

    /// The region in `fd`, as a previous daemon left it.
    fn open(fd: OwnedFd, reserve: usize) -> io::Result<Region> {
        Region::map(fd, reserve)
    }

    fn map(fd: OwnedFd, reserve: usize) -> io::Result<Region> {
        let len = rustix::fs::fstat(&fd)?.st_size as u64;
        if len as usize > reserve {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "state region larger than its reserve",
            ));
        }
        let file = std::fs::File::from(fd.try_clone()?);
        // Past the file's end the mapping is address space only; `ensure` grows the file
        // before anything there is written.
        let map = MmapOptions::new().len(reserve).map_raw(&file)?;
        Ok(Region {
            fd,
            map,
            len: AtomicU64::new(len),
            grow: Mutex::new(()),
        })
    }

    /// Makes the first `end` bytes of the region writable, doubling the file as needed.
    fn ensure(&self, end: u64) -> io::Result<()> {
        if end <= self.len.load(Ordering::Acquire) {
            return Ok(());
        }
        let _g = self.grow.lock();
        let len = self.len.load(Ordering::Acquire);
        if end <= len {
            return Ok(());
        }
        let new = end
            .next_power_of_two()
            .max(len * 2)
            .min(self.map.len() as u64);
        if end > new {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "state region full",
            ));
        }
        rustix::fs::ftruncate(&self.fd, new)?;
        self.len.store(new, Ordering::Release);
        Ok(())
    }

    /// The region's bytes start here. Callers stay below [`Region::len`].
    fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    /// The file's length as it is now: another process may have grown it.
    fn refresh_len(&self) -> u64 {
        let _g = self.grow.lock();
        if let Ok(st) = rustix::fs::fstat(&self.fd) {
            let now = (st.st_size as u64).min(self.map.len() as u64);
            self.len.fetch_max(now, Ordering::AcqRel);
        }
        self.len()
    }

    /// The `u64` at `offset` (8-aligned, within the region) as an atomic.
    fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && (offset + 8) as u64 <= self.len());
        // SAFETY: the word is inside the mapped, sized file (checked above) and 8-aligned
        // (the mapping is page-aligned); the mapping lives as long as `self`, and every
        // access to these bytes, here and in other processes, is atomic.
        unsafe { &*(self.base().add(offset) as *const AtomicU64) }
    }
}

/// A region's first 16 bytes: magic and format version.
fn check_header(r: &Region, magic: u64, version: u64, what: &str) -> io::Result<()> {
    if r.len() < 16 || r.word(0).load(Ordering::Acquire) != magic {
        return Err(bad(format!("{what}: not a coorfs state region")));
    }
    let v = r.word(8).load(Ordering::Acquire);
    if v != version {
        return Err(bad(format!(
            "{what}: format {v}, this coorfs reads format {version}"
        )));
    }
    Ok(())
}

fn bad(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

fn write_header(r: &Region, magic: u64, version: u64) {
    r.word(8).store(version, Ordering::Release);
    r.word(0).store(magic, Ordering::Release);
}

const META_MAGIC: u64 = u64::from_le_bytes(*b"COORFSme");
const META_VERSION: u64 = 1;
const JOURNAL_MAGIC: u64 = u64::from_le_bytes(*b"COORFSno");
const JOURNAL_VERSION: u64 = 1;
const SLOTS_MAGIC: u64 = u64::from_le_bytes(*b"COORFSha");
const SLOTS_VERSION: u64 = 1;

/// What INIT negotiated with the kernel, which a successor needs and cannot ask again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// The kernel's FUSE protocol version.
    pub abi: (u32, u32),
    /// The kernel accepted FUSE passthrough.
    pub passthrough: bool,
    /// INIT negotiated FUSE over io_uring: the size of a ring entry's payload, which a
    /// successor's entries must hold (the kernel sends requests to the ring for good).
    pub io_uring: Option<u32>,
}

/// The meta page. Words (8 bytes each, after the 16-byte header):
const M_INIT: usize = 16; // 1: INIT done, 2: passthrough, 4: resend probed, 8: resends
const M_ABI: usize = 24; // major << 32 | minor
const M_DAEMONS: usize = 32; // daemons started, the first included
const M_DIED_AT: usize = 40; // CLOCK_MONOTONIC ns of the last death (0: none yet)
const M_CAUSE: usize = 48; // why the last daemon ended: [`Cause`] encoded
const M_LONGEST: usize = 56; // longest pause, ns
const M_KEEPER: usize = 64; // the keeper's pid
const M_URING: usize = 72; // io_uring entry payload bytes (0: /dev/fuse only; older daemons)

/// Why a daemon ended, as the keeper saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Killed by a signal (the number).
    Signal(i32),
    /// Killed by the OOM killer of its memory cgroup.
    OomKill,
    /// Exited with a non-zero status.
    Exit(i32),
    /// Handed the mount over on request (`coorfs restart`, or `coorfs mount` again).
    Handover,
}

impl Cause {
    fn encode(self) -> u64 {
        match self {
            Cause::Signal(s) => 1 << 32 | s as u32 as u64,
            Cause::OomKill => 2 << 32,
            Cause::Exit(c) => 3 << 32 | c as u32 as u64,
            Cause::Handover => 4 << 32,
        }
    }

    fn decode(w: u64) -> Option<Cause> {
        let n = w as u32 as i32;
        match w >> 32 {
            1 => Some(Cause::Signal(n)),
            2 => Some(Cause::OomKill),
            3 => Some(Cause::Exit(n)),
            4 => Some(Cause::Handover),
            _ => None,
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Signal(s) => {
                let name = match *s {
                    libc::SIGKILL => "SIGKILL".to_string(),
                    libc::SIGSEGV => "SIGSEGV".to_string(),
                    libc::SIGABRT => "SIGABRT".to_string(),
                    libc::SIGBUS => "SIGBUS".to_string(),
                    libc::SIGTERM => "SIGTERM".to_string(),
                    s => format!("signal {s}"),
                };
                write!(f, "killed by {name}")
            }
            Cause::OomKill => write!(f, "killed by the OOM killer"),
            Cause::Exit(c) => write!(f, "exited with status {c}"),
            Cause::Handover => write!(f, "handed over"),
        }
    }
}

/// The meta page: INIT's outcome and the daemons' history.
#[derive(Debug)]
pub struct Meta {
    region: Region,
}

/// What the meta page says of the daemons so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Restarts {
    /// Daemons after the first.
    pub count: u64,
    /// Why the last one before this ended.
    pub last_cause: Option<Cause>,
    /// The longest time from a daemon's death to its successor serving, in seconds.
    pub longest_pause: f64,
}

impl Meta {
    pub fn create() -> io::Result<Meta> {
        let region = Region::create("coorfs-meta", META_RESERVE as u64, META_RESERVE)?;
        write_header(&region, META_MAGIC, META_VERSION);
        Ok(Meta { region })
    }

    pub fn open(fd: OwnedFd) -> io::Result<Meta> {
        let region = Region::open(fd, META_RESERVE)?;
        check_header(&region, META_MAGIC, META_VERSION, "meta")?;
        Ok(Meta { region })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd.as_fd()
    }

    /// What INIT negotiated, once it is done.
    pub fn negotiated(&self) -> Option<Negotiated> {
        let init = self.region.word(M_INIT).load(Ordering::Acquire);
        if init & 1 == 0 {
            return None;
        }
        let abi = self.region.word(M_ABI).load(Ordering::Acquire);
        let uring = self.region.word(M_URING).load(Ordering::Acquire);
        Some(Negotiated {
            abi: ((abi >> 32) as u32, abi as u32),
            passthrough: init & 2 != 0,
            io_uring: u32::try_from(uring).ok().filter(|&n| n != 0),
        })
    }

    pub fn set_negotiated(&self, n: Negotiated) {
        let abi = (u64::from(n.abi.0) << 32) | u64::from(n.abi.1);
        self.region.word(M_ABI).store(abi, Ordering::Release);
        let uring = u64::from(n.io_uring.unwrap_or(0));
        self.region.word(M_URING).store(uring, Ordering::Release);
        let init = 1 | (u64::from(n.passthrough) << 1);
        self.region.word(M_INIT).fetch_or(init, Ordering::AcqRel);
    }

    /// Whether the kernel resends the requests a dead daemon had read (FUSE_NOTIFY_RESEND,
    /// Linux 6.9), as the first daemon found out; None before it did.
    pub fn resends(&self) -> Option<bool> {
        let init = self.region.word(M_INIT).load(Ordering::Acquire);
        (init & 4 != 0).then_some(init & 8 != 0)
    }

    pub fn set_resends(&self, yes: bool) {
        self.region
            .word(M_INIT)
            .fetch_or(4 | (u64::from(yes) << 3), Ordering::AcqRel);
    }

    /// A daemon starts; returns how many have, this one included.
    pub fn daemon_starts(&self) -> u64 {
        self.region.word(M_DAEMONS).fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The keeper saw the daemon end for `cause`, at `now` (CLOCK_MONOTONIC ns).
    pub fn daemon_ended(&self, cause: Cause, now: u64) {
        self.region
            .word(M_CAUSE)
            .store(cause.encode(), Ordering::Release);
        self.region.word(M_DIED_AT).store(now, Ordering::Release);
    }

    /// A successor serves from `now` on: the pause since its predecessor ended counts.
    pub fn serving(&self, now: u64) -> Option<f64> {
        let died = self.region.word(M_DIED_AT).load(Ordering::Acquire);
        if died == 0 {
            return None;
        }
        let pause = now.saturating_sub(died);
        self.region
            .word(M_LONGEST)
            .fetch_max(pause, Ordering::AcqRel);
        Some(pause as f64 / 1e9)
    }

    pub fn restarts(&self) -> Restarts {
        let w = |o| self.region.word(o).load(Ordering::Acquire);
        Restarts {
            count: w(M_DAEMONS).saturating_sub(1),
            last_cause: Cause::decode(w(M_CAUSE)),
            longest_pause: w(M_LONGEST) as f64 / 1e9,
        }
    }

    pub fn set_keeper(&self, pid: u32) {
        self.region
            .word(M_KEEPER)
            .store(pid.into(), Ordering::Release);
    }

    pub fn keeper(&self) -> Option<u32> {
        let pid = self.region.word(M_KEEPER).load(Ordering::Acquire);
        (pid != 0).then_some(pid as u32)
    }
}

/// The time on CLOCK_MONOTONIC in nanoseconds, which every process of the machine shares.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// One node of the journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalNode {
    pub id: NodeId,
    pub parent: NodeId,
    pub kind: Kind,
    pub name: Vec<u8>,
}

/// Record layout: id u32, parent u32, kind u8, name length u16, name.
const RECORD_HEAD: usize = 11;
/// Where records start: after the header and the committed length (word 16).
const JOURNAL_START: usize = 24;

/// An append-only log in a region: a committed length (word 16) that records count once it
/// says so, and a writer lock. An append that fails (the region is full, or memory ran out)
/// breaks it: it stops there, and says so once in the log.
#[derive(Debug)]
struct Log {
    region: Region,
    append: Mutex<()>,
    broken: AtomicU32,
}

impl Log {
    fn create(name: &str, reserve: usize, magic: u64, version: u64) -> io::Result<Log> {
        let region = Region::create(name, 1 << 16, reserve)?;
        region
            .word(16)
            .store(JOURNAL_START as u64, Ordering::Release);
        write_header(&region, magic, version);
        Ok(Log::over(region))
    }

    fn open(fd: OwnedFd, reserve: usize, magic: u64, version: u64, what: &str) -> io::Result<Log> {
        let region = Region::open(fd, reserve)?;
        check_header(&region, magic, version, what)?;
        Ok(Log::over(region))
    }

    fn over(region: Region) -> Log {
        Log {
            region,
            append: Mutex::new(()),
            broken: AtomicU32::new(0),
        }
    }

    fn whole(&self) -> bool {
        self.broken.load(Ordering::Relaxed) == 0
    }

    /// Room for `len` more bytes at the end, under the writer lock held by the caller: where
    /// they go, or None once the log is broken.
    fn room(&self, len: usize, what: &str) -> Option<u64> {
        if !self.whole() {
            return None;
        }
        let at = self.region.word(16).load(Ordering::Acquire);
        if let Err(e) = self.region.ensure(at + len as u64) {
            self.broken.store(1, Ordering::Relaxed);
            tracing::warn!("{what}: {e}; a successor daemon cannot take it over");
            return None;
        }
        Some(at)
    }

    /// The committed length, checked against the region.
    fn committed(&self, what: &str) -> io::Result<usize> {
        let end = self.region.word(16).load(Ordering::Acquire) as usize;
        if end < JOURNAL_START || end as u64 > self.region.refresh_len() {
            return Err(bad(format!("{what}: length {end} out of range")));
        }
        Ok(end)
    }
}

/// Every node id given out, in order (see the module header).
#[derive(Debug)]
pub struct NodeJournal {
    /// Appends are serialised by the node table's write lock too.
    log: Log,
}

impl NodeJournal {
    pub fn create() -> io::Result<NodeJournal> {
        let log = Log::create(
            "coorfs-nodes",
            JOURNAL_RESERVE,
            JOURNAL_MAGIC,
            JOURNAL_VERSION,
        )?;
        Ok(NodeJournal { log })
    }

    pub fn open(fd: OwnedFd) -> io::Result<NodeJournal> {
        let log = Log::open(
            fd,
            JOURNAL_RESERVE,
            JOURNAL_MAGIC,
            JOURNAL_VERSION,
            "node journal",
        )?;
        Ok(NodeJournal { log })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.log.region.fd.as_fd()
    }

    /// False once an append failed: the journal no longer holds every node.
    pub fn whole(&self) -> bool {
        self.log.whole()
    }

    /// Records node `id`, child `name` of `parent`, of kind `kind`.
    pub fn append(&self, id: NodeId, parent: NodeId, kind: Kind, name: &[u8]) {
        let _g = self.log.append.lock();
        let len = RECORD_HEAD + name.len();
        let Some(at) = self.log.room(len, "node journal") else {
            return;
        };
        let mut rec = Vec::with_capacity(len);
        rec.extend_from_slice(&(id as u32).to_le_bytes());
        rec.extend_from_slice(&(parent as u32).to_le_bytes());
        rec.push(kind_code(kind));
        rec.extend_from_slice(&(name.len() as u16).to_le_bytes());
        rec.extend_from_slice(name);
        // SAFETY: [at, at + len) is inside the sized file (`room`) and past the committed
        // length, which no reader reads beyond; only this writer (the append lock) writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                rec.as_ptr(),
                self.log.region.base().add(at as usize),
                rec.len(),
            );
        }
        self.log
            .region
            .word(16)
            .store(at + len as u64, Ordering::Release);
    }

    /// Every committed node, in the order given out.
    pub fn nodes(&self) -> io::Result<Vec<JournalNode>> {
        let end = self.log.committed("node journal")?;
        // SAFETY: [0, end) is inside the sized file and committed: nobody writes it again.
        let bytes = unsafe { std::slice::from_raw_parts(self.log.region.base(), end) };
        parse_journal(&bytes[JOURNAL_START..])
    }
}

impl crate::namespace::NodeLog for NodeJournal {
    fn node_added(&self, id: NodeId, parent: NodeId, kind: Kind, name: &[u8]) {
        self.append(id, parent, kind, name);
    }
}

fn parse_journal(mut bytes: &[u8]) -> io::Result<Vec<JournalNode>> {
    let mut nodes = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < RECORD_HEAD {
            return Err(bad("node journal: torn record".into()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let len = u16::from_le_bytes([bytes[9], bytes[10]]) as usize;
        let kind = kind_of(bytes[8]).ok_or_else(|| bad("node journal: bad kind".into()))?;
        if bytes.len() < RECORD_HEAD + len {
            return Err(bad("node journal: torn name".into()));
        }
        nodes.push(JournalNode {
            id: u32_at(0).into(),
            parent: u32_at(4).into(),
            kind,
            name: bytes[RECORD_HEAD..RECORD_HEAD + len].to_vec(),
        });
        bytes = &bytes[RECORD_HEAD + len..];
    }
    Ok(nodes)
}

fn kind_code(kind: Kind) -> u8 {
    match kind {
        Kind::File => 1,
        Kind::Dir => 2,
        Kind::Symlink => 3,
        Kind::Fifo => 4,
        Kind::Socket => 5,
        Kind::CharDevice => 6,
        Kind::BlockDevice => 7,
    }
}

fn kind_of(code: u8) -> Option<Kind> {
    Some(match code {
        1 => Kind::File,
        2 => Kind::Dir,
        3 => Kind::Symlink,
        4 => Kind::Fifo,
        5 => Kind::Socket,
        6 => Kind::CharDevice,
        7 => Kind::BlockDevice,
        _ => return None,
    })
}

/// Where a cached block is: a slot of the arena, or a range of a file on the cache's tmpfs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedAt {
    Arena {
        offset: u64,
        len: u64,
    },
    /// In the tmpfs file named `file` (a number), at `offset`.
    File {
        file: u64,
        offset: u64,
        len: u64,
    },
}

/// One change to the memory cache's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheRecord {
    Added {
        version: FileVersion,
        block: u64,
        at: CachedAt,
    },
    Removed {
        version: FileVersion,
        block: u64,
    },
}

/// Record layout (80 bytes): tag u64 (1 arena, 2 file, 3 removed), version (dev, ino, size,
/// mtime, ctime), block, then offset, len, file.
const CACHE_RECORD: usize = 80;
const CACHE_MAGIC: u64 = u64::from_le_bytes(*b"COORFSca");
const CACHE_VERSION: u64 = 1;
const CACHE_RESERVE: usize = 1 << 38;

/// Every change to the memory cache's index, in order: a successor replays it to find the
/// blocks the arena and the tmpfs it takes over hold. A record is written only once its block
/// is (the cache publishes after it copies), so a replayed block is whole.
#[derive(Debug)]
pub struct CacheJournal {
    log: Log,
}

impl CacheJournal {
    pub fn create() -> io::Result<CacheJournal> {
        let log = Log::create(
            "coorfs-cache-index",
            CACHE_RESERVE,
            CACHE_MAGIC,
            CACHE_VERSION,
        )?;
        Ok(CacheJournal { log })
    }

    pub fn open(fd: OwnedFd) -> io::Result<CacheJournal> {
        let log = Log::open(fd, CACHE_RESERVE, CACHE_MAGIC, CACHE_VERSION, "cache index")?;
        Ok(CacheJournal { log })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.log.region.fd.as_fd()
    }

    /// False once an append failed: a successor must not trust the journal.
    pub fn whole(&self) -> bool {
        self.log.whole()
    }

    pub fn append(&self, r: &CacheRecord) {
        let mut words = [0u64; CACHE_RECORD / 8];
        let (tag, version, block, rest) = match *r {
            CacheRecord::Added {
                version,
                block,
                at: CachedAt::Arena { offset, len },
            } => (1, version, block, [offset, len, 0]),
            CacheRecord::Added {
                version,
                block,
                at: CachedAt::File { file, offset, len },
            } => (2, version, block, [offset, len, file]),
            CacheRecord::Removed { version, block } => (3, version, block, [0; 3]),
        };
        words[0] = tag;
        words[1] = version.dev;
        words[2] = version.ino;
        words[3] = version.size;
        words[4] = version.mtime_ns as u64;
        words[5] = version.ctime_ns as u64;
        words[6] = block;
        words[7..10].copy_from_slice(&rest);
        let _g = self.log.append.lock();
        let Some(at) = self.log.room(CACHE_RECORD, "cache index journal") else {
            return;
        };
        let region = &self.log.region;
        for (i, w) in words.iter().enumerate() {
            // Past the committed length: nobody reads these words until the length moves.
            region
                .word(at as usize + i * 8)
                .store(*w, Ordering::Relaxed);
        }
        region
            .word(16)
            .store(at + CACHE_RECORD as u64, Ordering::Release);
    }

    /// Every committed record, in order.
    pub fn records(&self) -> io::Result<Vec<CacheRecord>> {
        let end = self.log.committed("cache index")?;
        if !(end - JOURNAL_START).is_multiple_of(CACHE_RECORD) {
            return Err(bad(format!("cache index: length {end} out of range")));
        }
        let mut out = Vec::with_capacity((end - JOURNAL_START) / CACHE_RECORD);
        let mut at = JOURNAL_START;
        while at < end {
            let w = |i: usize| self.log.region.word(at + i * 8).load(Ordering::Relaxed);
            let version = FileVersion {
                dev: w(1),
                ino: w(2),
                size: w(3),
                mtime_ns: w(4) as i64,
                ctime_ns: w(5) as i64,
            };
            let block = w(6);
            out.push(match w(0) {
                1 => CacheRecord::Added {
                    version,
                    block,
                    at: CachedAt::Arena {
                        offset: w(7),
                        len: w(8),
                    },
                },
                2 => CacheRecord::Added {
                    version,
                    block,
                    at: CachedAt::File {
                        offset: w(7),
                        len: w(8),
                        file: w(9),
                    },
                },
                3 => CacheRecord::Removed { version, block },
                t => return Err(bad(format!("cache index: record kind {t}"))),
            });
            at += CACHE_RECORD;
        }
        Ok(out)
    }

    /// Starts the journal again with `records` (what a successor kept of it), so that it does
    /// not grow with every daemon.
    pub fn rewrite(&self, records: &[CacheRecord]) {
        {
            let _g = self.log.append.lock();
            (self.log.region.word(16)).store(JOURNAL_START as u64, Ordering::Release);
        }
        for r in records {
            self.append(r);
        }
    }
}

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
    index: Mutex<SlotIndex>,
}

#[derive(Debug, Default)]
struct SlotIndex {
    free: Vec<usize>,
    used: usize,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn reopen_fd(fd: BorrowedFd<'_>) -> OwnedFd {
        fd.try_clone_to_owned().unwrap()
    }

    #[test]
    fn the_journal_replays_every_committed_node_in_order() {
        let j = NodeJournal::create().unwrap();
        j.append(2, 1, Kind::Dir, b"train");
        j.append(3, 2, Kind::File, b"a.jpg");
        let long = vec![b'x'; 255];
        j.append(4, 2, Kind::Symlink, &long);
        let again = NodeJournal::open(reopen_fd(j.fd())).unwrap();
        let nodes = again.nodes().unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(
            nodes[1],
            JournalNode {
                id: 3,
                parent: 2,
                kind: Kind::File,
                name: b"a.jpg".to_vec()
            }
        );
        assert_eq!(nodes[2].name, long);
        // Appends after a reopen go on from the end, and the file grows past its first size.
        for i in 0..10_000u64 {
            again.append(5 + i, 2, Kind::File, format!("f{i:06}.bin").as_bytes());
        }
        assert_eq!(j.nodes().unwrap().len(), 10_003);
    }

    #[test]
    fn a_record_written_but_not_committed_is_not_read() {
        let j = NodeJournal::create().unwrap();
        j.append(2, 1, Kind::File, b"whole");
        let committed = j.log.region.word(16).load(Ordering::Acquire);
        j.append(3, 1, Kind::File, b"torn");
        // As a daemon killed between the record and its length leaves it.
        j.log.region.word(16).store(committed, Ordering::Release);
        let nodes = NodeJournal::open(reopen_fd(j.fd()))
            .unwrap()
            .nodes()
            .unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].name, b"whole");
    }

    #[test]
    fn a_region_of_another_kind_or_version_is_refused() {
        let m = Meta::create().unwrap();
        let e = NodeJournal::open(reopen_fd(m.fd())).unwrap_err();
        assert_eq!(e.to_string(), "node journal: not a coorfs state region");
        let j = NodeJournal::create().unwrap();
        j.log.region.word(8).store(9, Ordering::Release);
        let e = NodeJournal::open(reopen_fd(j.fd())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "node journal: format 9, this coorfs reads format 1"
        );
    }

    #[test]
    fn open_handles_survive_and_released_ones_do_not() {
        let s = HandleSlots::create().unwrap();
        for fh in 1..=5 {
            s.open_handle(OpenHandle {
                fh,
                ino: 100 + fh,
                kind: if fh == 2 {
                    HandleKind::Dir
                } else {
                    HandleKind::File
                },
                backing: if fh == 3 { 7 } else { 0 },
            });
        }
        s.close_handle(1);
        s.close_handle(4);
        let again = HandleSlots::open(reopen_fd(s.fd())).unwrap();
        let mut live = again.all();
        live.sort_by_key(|h| h.fh);
        assert_eq!(live.iter().map(|h| h.fh).collect::<Vec<_>>(), vec![2, 3, 5]);
        assert_eq!(again.get(2).unwrap().kind, HandleKind::Dir);
        assert_eq!(again.get(3).unwrap().backing, 7);
        assert_eq!(again.get(1), None);
        assert_eq!(again.next_fh(), 6);
        // Freed slots are reused, not lost.
        again.open_handle(OpenHandle {
            fh: 6,
            ino: 1,
            kind: HandleKind::Control,
            backing: 0,
        });
        again.open_handle(OpenHandle {
            fh: 7,
            ino: 1,
            kind: HandleKind::File,
            backing: 0,
        });
        assert_eq!(again.index.lock().used, 5);
        assert_eq!(again.get(6).unwrap().kind, HandleKind::Control);
    }

    #[test]
    fn the_cache_journal_replays_adds_and_removes_in_order() {
        let j = CacheJournal::create().unwrap();
        let v = FileVersion::of_test(9, 3 << 20);
        let a = CacheRecord::Added {
            version: v,
            block: 0,
            at: CachedAt::Arena {
                offset: 64,
                len: 1 << 20,
            },
        };
        let f = CacheRecord::Added {
            version: v,
            block: 2,
            at: CachedAt::File {
                file: 17,
                offset: 2 << 20,
                len: 1 << 20,
            },
        };
        let r = CacheRecord::Removed {
            version: v,
            block: 0,
        };
        for x in [a, f, r] {
            j.append(&x);
        }
        let again = CacheJournal::open(reopen_fd(j.fd())).unwrap();
        assert_eq!(again.records().unwrap(), vec![a, f, r]);
        again.rewrite(&[f]);
        assert_eq!(j.records().unwrap(), vec![f]);
        let e = CacheJournal::open(reopen_fd(NodeJournal::create().unwrap().fd())).unwrap_err();
        assert_eq!(e.to_string(), "cache index: not a coorfs state region");
    }

    #[test]
    fn meta_keeps_init_and_the_restarts() {
        let m = Meta::create().unwrap();
        assert_eq!(m.negotiated(), None);
        let n = Negotiated {
            abi: (7, 45),
            passthrough: true,
            io_uring: Some(1 << 20),
        };
        m.set_negotiated(n);
        assert_eq!(m.resends(), None);
        m.set_resends(true);
        assert_eq!(m.daemon_starts(), 1);
        m.daemon_ended(Cause::Signal(libc::SIGKILL), 1_000_000_000);
        let again = Meta::open(reopen_fd(m.fd())).unwrap();
        assert_eq!(again.negotiated(), Some(n));
        assert_eq!(again.resends(), Some(true));
        assert_eq!(again.daemon_starts(), 2);
        assert_eq!(again.serving(1_250_000_000), Some(0.25));
        let r = again.restarts();
        assert_eq!(r.count, 1);
        assert_eq!(r.last_cause, Some(Cause::Signal(libc::SIGKILL)));
        assert_eq!(r.last_cause.unwrap().to_string(), "killed by SIGKILL");
        assert!((r.longest_pause - 0.25).abs() < 1e-9);
    }
}
