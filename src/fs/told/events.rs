//! How the kernel tells the daemon of the opens it makes itself: each open's FUSE node id, the
//! opening thread and, where known, its effective uid (see the module above for what they are
//! counted for).
//!
//! Two ways, the first the kernel allows:
//! - **eBPF** (`told.bpf.c`, built by `src/build.rs` where clang is): a program on the exits of
//!   the open system calls (`openat`, `openat2`, `open` tracepoints) looks up the new
//!   descriptor's inode and, for a regular file of the mount's device, writes 16 bytes into a
//!   ring buffer of 1 MiB that the daemon reads in place. It costs an opener some 0.5 us,
//!   against fanotify's 1.5-2 us (an event allocated, the file's handle encoded, a merge looked
//!   for, a copy to the daemon and a free; docs/BENCHMARKS.md, "Hot 100 KiB files"), and it
//!   needs no mark: a directory made later is told of too. It sees only those system calls:
//!   a file opened through io_uring is not told of (its misses' READs are still counted, as
//!   reads of an open nobody told of). The program runs at every open on the machine while the
//!   mount is up, and returns at once for another device's file.
//! - **fanotify**: an inode mark on every directory (`FAN_OPEN` of its children), events with
//!   the file's handle (`FAN_REPORT_FID`, which on FUSE is the node id) and thread
//!   (`FAN_REPORT_TID`). A mount mark would be one mark, but fanotify gives file handles on a
//!   FUSE mount only for inode marks.
//!
//! `COORFS_TOLD_BY=fanotify` chooses fanotify where eBPF would be used (`ebpf` asks for eBPF
//! and nothing else).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use parking_lot::Mutex;

use crate::namespace::NodeId;

/// The program `src/build.rs` built; empty where clang was missing.
static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/told.bpf.o"));
/// Its tracepoints, by program name; the first is needed, the others are taken where the
/// kernel has them (`open` is no system call on arm64, `openat2` came in 5.6).
const TRACEPOINTS: [(&str, &str); 3] = [
    ("exit_openat", "sys_exit_openat"),
    ("exit_openat2", "sys_exit_openat2"),
    ("exit_open", "sys_exit_open"),
];
/// The environment variable that chooses how opens are told.
pub const TOLD_BY_ENV: &str = "COORFS_TOLD_BY";

/// One open the kernel told of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Told {
    pub node: NodeId,
    pub tid: u32,
    /// The opener's effective uid, where the way knows it (eBPF).
    pub uid: Option<u32>,
}

/// Where opens are told from.
pub(super) enum OpenEvents {
    Bpf(Box<BpfOpens>),
    Fanotify(Fanotify),
}

impl std::fmt::Debug for OpenEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.how())
    }
}

/// How `COORFS_TOLD_BY` asks to be told of opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToldBy {
    /// Unset (or empty): eBPF where the kernel loads it, else fanotify.
    Either,
    Ebpf,
    Fanotify,
}

/// `COORFS_TOLD_BY`, checked: unset or empty, `ebpf` or `fanotify`.
pub fn told_by() -> Result<ToldBy, String> {
    match std::env::var(TOLD_BY_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(ToldBy::Either),
        Ok(v) => match v.as_str() {
            "" => Ok(ToldBy::Either),
            "ebpf" => Ok(ToldBy::Ebpf),
            "fanotify" => Ok(ToldBy::Fanotify),
            _ => Err(format!("{TOLD_BY_ENV}={v}: must be ebpf or fanotify")),
        },
        Err(e) => Err(format!("{TOLD_BY_ENV}: {e}")),
    }
}

impl OpenEvents {
    /// Told of the opens of files on the mount at `mountpoint`: by eBPF where the kernel loads
    /// the program (and `COORFS_TOLD_BY` does not say fanotify), else by fanotify, whose marks
    /// the caller then places ([`OpenEvents::needs_marks`]).
    pub fn new(mountpoint: &Path) -> Result<OpenEvents, String> {
        let wanted = told_by()?;
        let bpf_why = match wanted {
            ToldBy::Fanotify => format!("{TOLD_BY_ENV}=fanotify"),
            ToldBy::Ebpf | ToldBy::Either => match BpfOpens::new(mountpoint) {
                Ok(b) => return Ok(OpenEvents::Bpf(Box::new(b))),
                Err(why) if wanted == ToldBy::Ebpf => return Err(format!("eBPF: {why}")),
                Err(why) => why,
            },
        };
        tracing::info!("opens: told by fanotify (not eBPF: {bpf_why})");
        Fanotify::new()
            .map(OpenEvents::Fanotify)
            .map_err(|e| format!("fanotify: {e} (not eBPF: {bpf_why})"))
    }

    /// "eBPF" or "fanotify", for the stats.
    pub fn how(&self) -> &'static str {
        match self {
            OpenEvents::Bpf(_) => "eBPF",
            OpenEvents::Fanotify(_) => "fanotify",
        }
    }

    /// Each directory must be marked for its files' opens to be told (fanotify).
    pub fn needs_marks(&self) -> bool {
        matches!(self, OpenEvents::Fanotify(_))
    }

    /// Tells opens of the files in directory `path` (fanotify; eBPF tells every file's).
    pub fn mark(&self, path: &Path) -> std::io::Result<()> {
        match self {
            OpenEvents::Bpf(_) => Ok(()),
            OpenEvents::Fanotify(f) => f.mark(path),
        }
    }

    /// Readable when opens are queued: for poll.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            OpenEvents::Bpf(b) => b.fd.as_fd(),
            OpenEvents::Fanotify(f) => f.fd.as_fd(),
        }
    }

    /// Reads queued opens, handing each to `each` (`buf` is fanotify's read buffer); returns
    /// false once none was left.
    pub fn read(&self, buf: &mut [u8], each: impl FnMut(Told)) -> bool {
        match self {
            OpenEvents::Bpf(b) => b.read(each),
            OpenEvents::Fanotify(f) => f.read(buf, each),
        }
    }

    /// True if the ring holds opens that cannot be read yet (eBPF). A program writes its record
    /// in three steps (room taken, bytes copied, record marked done), and a reader stops at
    /// the first record not done: a thread whose CPU is taken from it between the first and
    /// the last (by the kernel, or by the hypervisor from a virtual CPU) holds back every open
    /// told after it, for as long as it waits. fanotify has no such state.
    pub fn held_back(&self) -> bool {
        match self {
            OpenEvents::Bpf(b) => b.held_back(),
            OpenEvents::Fanotify(_) => false,
        }
    }

    /// Opens lost so far because they came faster than they were read (eBPF; fanotify's
    /// overflow is logged as it is read).
    pub fn lost(&self) -> u64 {
        match self {
            OpenEvents::Bpf(b) => b.lost(),
            OpenEvents::Fanotify(_) => 0,
        }
    }
}

/// Where the kernel's tracing filesystem belongs, through which a tracepoint is found by name.
const TRACEFS: &str = "/sys/kernel/tracing";

/// Mounts the tracing filesystem at [`TRACEFS`] if nothing is mounted there, as an init
/// system does at boot: a machine whose init does not (a container's, a sandbox's) has the
/// tracepoints all the same, but the program could not be attached to them by name. Left
/// mounted, as it would have been; a failure is the attach's to report.
fn mount_tracefs() {
    const TRACEFS_MAGIC: u64 = 0x7472_6163;
    let mounted = rustix::fs::statfs(TRACEFS).is_ok_and(|st| st.f_type as u64 == TRACEFS_MAGIC);
    if !mounted {
        use rustix::mount::{MountFlags, mount};
        let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
        match mount("tracefs", TRACEFS, "tracefs", flags, None) {
            Ok(()) => tracing::info!("opens: mounted the tracing filesystem at {TRACEFS}"),
            Err(e) => tracing::debug!("opens: mounting tracefs at {TRACEFS}: {e}"),
        }
    }
}

/// The eBPF program, attached (detached when dropped), and its ring buffer.
pub(super) struct BpfOpens {
    /// The ring's descriptor, for poll.
    fd: OwnedFd,
    ring: Mutex<aya::maps::RingBuf<aya::maps::MapData>>,
    lost: aya::maps::Array<aya::maps::MapData, u64>,
    /// The ring's consumer and producer positions (its first two pages, mapped read-only
    /// beside aya's mapping: each at the start of its page), to tell a ring with opens held
    /// back from an empty one.
    positions: Option<memmap2::Mmap>,
    /// The programs and their links: the tracepoints are attached while this lives.
    _bpf: aya::Ebpf,
}

/// Opens taken from the ring in one read, so that a READ draining it is not held long.
const RING_BATCH: usize = 4096;

impl BpfOpens {
    fn new(mountpoint: &Path) -> Result<BpfOpens, String> {
        if PROGRAM.is_empty() {
            return Err("built without it (no clang at build time)".into());
        }
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(mountpoint)
            .map_err(|e| format!("{}: {e}", mountpoint.display()))?
            .dev();
        let dev = kernel_dev(dev);
        mount_tracefs();
        let mut bpf = aya::EbpfLoader::new()
            .override_global("target_dev", &dev, true)
            .load(PROGRAM)
            .map_err(|e| first_line(&e))?;
        for (i, (name, tracepoint)) in TRACEPOINTS.into_iter().enumerate() {
            let program: &mut aya::programs::TracePoint = bpf
                .program_mut(name)
                .ok_or_else(|| format!("no program {name}"))?
                .try_into()
                .map_err(|e| first_line(&e))?;
            let attached = program.load().map_err(|e| first_line(&e)).and_then(|()| {
                (program.attach("syscalls", tracepoint))
                    .map_err(|e| format!("{tracepoint}: {}", first_line(&e)))
            });
            match attached {
                Ok(_) => {}
                Err(why) if i == 0 => return Err(why),
                Err(why) => tracing::debug!("opens: not told of {tracepoint} ({why})"),
            }
        }
        let ring = bpf.take_map("opens").ok_or("no ring buffer")?;
        let ring = aya::maps::RingBuf::try_from(ring).map_err(|e| first_line(&e))?;
        let lost = bpf.take_map("lost").ok_or("no lost count")?;
        let lost = aya::maps::Array::try_from(lost).map_err(|e| first_line(&e))?;
        let fd = ring
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| e.to_string())?;
        // SAFETY: sysconf only reads a constant of the system.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        // SAFETY: a read-only shared mapping of the ring's two position pages, which the
        // kernel allows whatever else maps them; only read through atomic loads below.
        let positions = unsafe { memmap2::MmapOptions::new().len(2 * page).map(&fd) };
        if let Err(e) = &positions {
            tracing::debug!("opens: the ring's positions cannot be mapped: {e}");
        }
        Ok(BpfOpens {
            fd,
            ring: Mutex::new(ring),
            lost,
            positions: positions.ok(),
            _bpf: bpf,
        })
    }

    /// See [`OpenEvents::held_back`]: the producer's position is past the consumer's, yet
    /// the ring gave nothing (read with the drain's lock held, or right after it).
    fn held_back(&self) -> bool {
        let Some(map) = &self.positions else {
            return false;
        };
        let at = |offset: usize| {
            // SAFETY: `offset` is 0 or one page into a mapping of two pages (page-aligned,
            // so 8-aligned); the kernel and aya update these words atomically.
            let word =
                unsafe { &*(map.as_ptr().add(offset) as *const std::sync::atomic::AtomicU64) };
            word.load(std::sync::atomic::Ordering::Acquire)
        };
        let consumer = at(0);
        let producer = at(map.len() / 2);
        producer > consumer
    }

    fn read(&self, mut each: impl FnMut(Told)) -> bool {
        let mut ring = self.ring.lock();
        let mut n = 0;
        while n < RING_BATCH {
            let Some(item) = ring.next() else { break };
            n += 1;
            if let Some(told) = parse_told(&item) {
                each(told);
            }
        }
        n > 0
    }

    fn lost(&self) -> u64 {
        self.lost.get(&0, 0).unwrap_or(0)
    }
}

/// A record of the ring: node id, thread, uid (`struct told` of `told.bpf.c`).
fn parse_told(item: &[u8]) -> Option<Told> {
    let node = u64::from_ne_bytes(item.get(0..8)?.try_into().ok()?);
    let tid = u32::from_ne_bytes(item.get(8..12)?.try_into().ok()?);
    let uid = u32::from_ne_bytes(item.get(12..16)?.try_into().ok()?);
    Some(Told {
        node,
        tid,
        uid: Some(uid),
    })
}

/// A device number as `stat` gives it, as the kernel keeps it (`MKDEV`: major above 20 bits of
/// minor), which the program compares with each file's superblock's.
fn kernel_dev(dev: u64) -> u32 {
    (libc::major(dev) << 20) | libc::minor(dev)
}

fn first_line(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    text.lines().next().unwrap_or("failed").to_string()
}

/// A fanotify group that reports opens of files by node id and thread.
#[derive(Debug)]
pub(super) struct Fanotify {
    fd: OwnedFd,
}

impl Fanotify {
    fn new() -> std::io::Result<Fanotify> {
        let flags = libc::FAN_CLASS_NOTIF
            | libc::FAN_CLOEXEC
            | libc::FAN_NONBLOCK
            | libc::FAN_REPORT_FID
            | libc::FAN_REPORT_TID;
        // SAFETY: a plain system call with flag arguments.
        let fd = unsafe { libc::fanotify_init(flags, (libc::O_RDONLY | libc::O_LARGEFILE) as u32) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fanotify_init returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Fanotify { fd })
    }

    /// Tells opens of the files in directory `path` (not of its subdirectories').
    fn mark(&self, path: &Path) -> std::io::Result<()> {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        let rc = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                libc::FAN_MARK_ADD,
                libc::FAN_OPEN | libc::FAN_EVENT_ON_CHILD,
                libc::AT_FDCWD,
                c.as_ptr(),
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads the queued events into `buf` and hands each open to `each`; returns false once
    /// the queue is empty. An overflow (events lost) is logged.
    fn read(&self, buf: &mut [u8], mut each: impl FnMut(Told)) -> bool {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return false;
        }
        for event in parse_events(&buf[..n as usize]) {
            match event {
                Event::Open { node, tid } => each(Told {
                    node,
                    tid,
                    uid: None,
                }),
                Event::Overflow => tracing::warn!(
                    "opens came faster than they could be counted: some hits are not counted"
                ),
            }
        }
        true
    }
}

/// One fanotify event, as far as it concerns the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Open { node: NodeId, tid: u32 },
    Overflow,
}

/// FUSE's file handle type: node id (two 32-bit halves, high first) and generation.
const FILEID_INO64_GEN: i32 = 0x81;
/// `FAN_EVENT_INFO_TYPE_FID`.
const INFO_TYPE_FID: u8 = 1;

/// The events in `buf`, a read of a fanotify group with `FAN_REPORT_FID`: a 24-byte
/// metadata header (length, version, reserved, header length, mask, fd, pid), then info
/// records (type, padding, length; for a FID: the fsid's 8 bytes, then a `file_handle`:
/// its byte count, its type and the handle).
fn parse_events(buf: &[u8]) -> Vec<Event> {
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(len) = u32_at(buf, at) {
        let len = len as usize;
        let Some(event) = buf.get(at..at + len).filter(|_| len >= 24) else {
            break;
        };
        at += len;
        let mask = u64::from_ne_bytes(event[8..16].try_into().unwrap_or_default());
        let pid = u32_at(event, 20).unwrap_or(0);
        if mask & libc::FAN_Q_OVERFLOW != 0 {
            out.push(Event::Overflow);
            continue;
        }
        let header = u16::from_ne_bytes([event[6], event[7]]) as usize;
        let mut info = header;
        while info + 4 <= event.len() {
            let (kind, size) = (
                event[info],
                u16::from_ne_bytes([event[info + 2], event[info + 3]]),
            );
            let record = &event[info..(info + size as usize).min(event.len())];
            info += (size as usize).max(4);
            if kind != INFO_TYPE_FID || record.len() < 4 + 8 + 8 + 12 {
                continue;
            }
            let handle = &record[12..];
            let (bytes, kind) = (u32_at(handle, 0), u32_at(handle, 4).map(|k| k as i32));
            if bytes == Some(12) && kind == Some(FILEID_INO64_GEN) {
                let (hi, lo) = (u32_at(handle, 8), u32_at(handle, 12));
                if let (Some(hi), Some(lo)) = (hi, lo) {
                    let node = (u64::from(hi) << 32) | u64::from(lo);
                    out.push(Event::Open { node, tid: pid });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event as the kernel writes it: metadata, then a FID record with FUSE's handle.
    fn event(node: u64, pid: u32, mask: u64) -> Vec<u8> {
        let mut fid = Vec::new();
        fid.extend_from_slice(&[INFO_TYPE_FID, 0]);
        fid.extend_from_slice(&(4u16 + 8 + 8 + 12).to_ne_bytes());
        fid.extend_from_slice(&[0; 8]); // fsid
        fid.extend_from_slice(&12u32.to_ne_bytes());
        fid.extend_from_slice(&FILEID_INO64_GEN.to_ne_bytes());
        fid.extend_from_slice(&((node >> 32) as u32).to_ne_bytes());
        fid.extend_from_slice(&(node as u32).to_ne_bytes());
        fid.extend_from_slice(&0u32.to_ne_bytes()); // generation
        let len = 24 + fid.len() as u32;
        let mut e = Vec::new();
        e.extend_from_slice(&len.to_ne_bytes());
        e.extend_from_slice(&[3, 0]); // version, reserved
        e.extend_from_slice(&24u16.to_ne_bytes());
        e.extend_from_slice(&mask.to_ne_bytes());
        e.extend_from_slice(&(-1i32).to_ne_bytes());
        e.extend_from_slice(&pid.to_ne_bytes());
        e.extend(fid);
        e
    }

    #[test]
    fn events_give_the_node_and_thread_of_each_open_and_an_overflow() {
        let mut buf = event(3189, 77, libc::FAN_OPEN);
        buf.extend(event((5 << 32) | 9, 78, libc::FAN_OPEN));
        let mut overflow = event(0, 0, libc::FAN_Q_OVERFLOW);
        overflow.truncate(24);
        overflow[0..4].copy_from_slice(&24u32.to_ne_bytes());
        buf.extend(overflow);
        assert_eq!(
            parse_events(&buf),
            vec![
                Event::Open {
                    node: 3189,
                    tid: 77
                },
                Event::Open {
                    node: (5 << 32) | 9,
                    tid: 78
                },
                Event::Overflow
            ]
        );
        // A torn read ends where the whole events end.
        assert_eq!(parse_events(&buf[..buf.len() - 30]).len(), 1);
    }

    #[test]
    fn a_ring_record_gives_node_thread_and_uid_and_a_short_one_nothing() {
        let mut rec = ((7u64 << 32) | 5).to_ne_bytes().to_vec();
        rec.extend_from_slice(&4242u32.to_ne_bytes());
        rec.extend_from_slice(&1000u32.to_ne_bytes());
        assert_eq!(
            parse_told(&rec),
            Some(Told {
                node: (7 << 32) | 5,
                tid: 4242,
                uid: Some(1000)
            })
        );
        assert_eq!(parse_told(&rec[..15]), None);
    }

    #[test]
    fn a_device_number_is_the_kernels_whatever_the_size_of_its_minor() {
        // FUSE's anonymous devices: major 0; a minor past 255 is split by stat's encoding.
        assert_eq!(kernel_dev(libc::makedev(0, 57)), 57);
        assert_eq!(kernel_dev(libc::makedev(0, 300)), 300);
        assert_eq!(kernel_dev(libc::makedev(8, 1)), (8 << 20) | 1);
    }
}
