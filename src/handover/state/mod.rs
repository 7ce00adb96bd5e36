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

mod cache;
mod meta;
mod nodes;
mod slots;

pub use cache::{CacheJournal, CacheRecord, CachedAt};
pub use meta::{Cause, Meta, Negotiated, Restarts};
pub use nodes::{JournalNode, NodeJournal};
pub use slots::{HandleKind, HandleSlots, OpenHandle};

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

/// The time on CLOCK_MONOTONIC in nanoseconds, which every process of the machine shares.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

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
