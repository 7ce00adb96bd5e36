//! Reads the kernel serves by itself: FUSE passthrough.
//!
//! An OPEN may be answered with a backing file: the kernel then serves the open file's reads
//! (and `mmap`) from that file's pages, with no READ round trip to the daemon and no copy
//! through it. The daemon still answers every OPEN, so permissions are checked at each open as
//! the caller, and the open is counted in its job's epoch as before (`open.rs`). Two kinds of
//! file take this path:
//! - **Cached files over 64 KiB**: the cache keeps their bytes in a file of their own on a
//!   private tmpfs ([`crate::cache::kernel_files`]); the open is a hit, counted at open.
//! - **Files the cache will not keep** (a full MinIO cache, `--policy none`), none of whose
//!   blocks the prefetcher staged: the backing file is the source file the open opened as
//!   the caller; the open is a miss whose whole size is counted from the source at open. Not
//!   with a disk tier that has room or in a cluster: the daemon's own reads feed those.
//!
//! Everything else goes through the daemon as before: misses the cache will keep (its reads
//! fill it), staged files (served from staging), small files (the kernel's page cache).
//!
//! # What the kernel allows, and how the table keeps to it
//! Measured on kernel 6.18 (and so in the kernel's `iomode.c`): while an inode has a backing
//! file attached, every open of it must be a passthrough open of that same backing file, or
//! the open fails with EIO, direct I/O included; and an inode open through the page cache
//! cannot take a passthrough open. `FOPEN_KEEP_CACHE` with passthrough is EIO too, and
//! `FOPEN_DIRECT_IO` turns passthrough off. The kernel lets go of an inode's backing file when
//! its last open is closed, before it sends the daemon the RELEASE (measured: 22 of 2,000
//! OPENs came before the previous RELEASE).
//!
//! So [`InodeModes`] counts, per inode, the opens it granted each way and drops the count at
//! RELEASE; the kernel's count is never above it. While an inode has passthrough opens, every
//! open of it is given the same registration, even one that wanted the daemon (a staged file
//! reads its bytes from the backing file). An open of a file that changed since that backing
//! file was registered first waits up to [`RELEASE_WAIT`] for those opens' RELEASE, which the
//! kernel sends after the descriptors are closed: close, change, open reads the new version.
//! Only an open made while a descriptor of the old version is really still open reads what
//! that descriptor reads, until all of them are closed. While it has opens through the daemon, a
//! passthrough open goes through the daemon too. A backing file is registered with the
//! kernel at the first passthrough open of an inode and kept until its last release (an id
//! unregistered while its file is open made 199 of 200 opens fail with EIO); then a source
//! file's is unregistered, and a cached file's kept for the file's next open, since the cache
//! never drops the file: a hit then costs no `open` of the cache's file and no `ioctl` pair
//! (each kept registration holds a `struct file` and the kernel's record of it, counted in the
//! budget with the file, [`crate::cache::kernel_files::FILE_OVERHEAD`]).

//! # When it is off
//! With `--no-passthrough`, `--fast-open` (no OPEN to answer), `--read-delay` (the daemon
//! delays each read of the source, as slow storage would), a kernel that does not offer
//! `FUSE_PASSTHROUGH` (before 6.9, or built without it), or a daemon the kernel refuses a
//! backing file (it needs `CAP_SYS_ADMIN`): every open goes through the daemon as before. The
//! daemon says which, once, in its log. Once the kernel opens files itself (`--opens`,
//! `told/`): it opens them through its page cache, which it refuses (EIO) for an inode with
//! a backing file, so before that switch no new inode is passed through and the switch waits
//! for the last release of those that are ([`Passthrough::close`]).

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::handover::state::{HandleKind, HandleSlots, OpenHandle};
use crate::namespace::{FileVersion, NodeId};

/// The kernel's table of backing files: the FUSE adapter's, over the session's device.
pub trait BackingFiles: Send + Sync {
    /// Registers `fd` as a backing file; returns its id for an OPEN reply.
    fn register(&self, fd: BorrowedFd<'_>) -> std::io::Result<u32>;
    /// Unregisters backing file `id`.
    fn unregister(&self, id: u32);
}

/// Which backing file an open wants: the cache's file of a version, or the source's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    Cached(FileVersion),
    Source(FileVersion),
}

impl Backing {
    /// The version of the file it holds.
    pub fn version(&self) -> FileVersion {
        match self {
            Backing::Cached(v) | Backing::Source(v) => *v,
        }
    }
}

/// How long an open of a file that changed waits for the RELEASE of its inode's passthrough
/// opens of the old version: the kernel sends it after the descriptor is closed, in the
/// background, and the daemon may see the next OPEN first (measured: 22 of 2,000 OPENs); an
/// open that would otherwise read the old version's backing file.
pub const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// How the kernel reads an open file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelIo {
    /// Through its page cache (with or without `keep_cache`).
    PageCache,
    /// Every read is sent to the daemon.
    Direct,
    /// From backing file `id`.
    Passthrough(u32),
}

/// How an open was granted: from a backing file, or through the daemon as it wanted.
#[derive(Debug, PartialEq, Eq)]
pub enum Granted<D> {
    Passthrough { id: u32, backing: Backing },
    Daemon(D),
}

/// What an inode's open files are, as the daemon granted them.
#[derive(Debug)]
enum InodeMode {
    /// Read through the daemon: the page cache or direct I/O, in any mix.
    Daemon { opens: u32 },
    Passthrough {
        opens: u32,
        id: u32,
        backing: Backing,
    },
}

/// The mode of each inode with open files (see the module header), and the registrations
/// kept for cached files. Pure: registering a backing file and choosing the daemon's way are
/// the caller's closures, and what is to be unregistered is returned.
#[derive(Debug, Default)]
pub struct InodeModes {
    inodes: HashMap<NodeId, InodeMode>,
    /// The registrations of the cache's files, kept after their last release: the cache never
    /// drops a file, and its next open (next epoch) then costs no registration.
    kept: HashMap<FileVersion, u32>,
    /// No inode takes up passthrough any more (the kernel is to open files itself): only
    /// inodes with passthrough opens still give theirs.
    closed: bool,
}

impl InodeModes {
    /// An open of `ino` that would be read from `backing` if it may (registered by
    /// `register` if the inode has no registration), else through the daemon as `daemon`
    /// says. An inode open by passthrough gives every open its registration, whatever it
    /// wanted: the kernel refuses any other open of it.
    pub fn open<D>(
        &mut self,
        ino: NodeId,
        backing: Option<Backing>,
        register: impl FnOnce(Backing) -> Option<u32>,
        daemon: impl FnOnce() -> D,
    ) -> Granted<D> {
        match (self.inodes.get_mut(&ino), backing) {
            (Some(InodeMode::Passthrough { opens, id, backing }), _) => {
                *opens += 1;
                Granted::Passthrough {
                    id: *id,
                    backing: *backing,
                }
            }
            (None, Some(b)) if !self.closed => {
                let kept = match b {
                    Backing::Cached(v) => self.kept.get(&v).copied(),
                    Backing::Source(_) => None,
                };
                if let Some(id) = kept.or_else(|| register(b)) {
                    let mode = InodeMode::Passthrough {
                        opens: 1,
                        id,
                        backing: b,
                    };
                    self.inodes.insert(ino, mode);
                    return Granted::Passthrough { id, backing: b };
                }
                self.inodes.insert(ino, InodeMode::Daemon { opens: 1 });
                Granted::Daemon(daemon())
            }
            (Some(InodeMode::Daemon { opens }), _) => {
                *opens += 1;
                Granted::Daemon(daemon())
            }
            (None, _) => {
                self.inodes.insert(ino, InodeMode::Daemon { opens: 1 });
                Granted::Daemon(daemon())
            }
        }
    }

    /// The release of an open of `ino` that was granted `io`. Returns a backing file id to
    /// unregister: its inode's last open is gone, and it is the source's, or a cached file's
    /// that the cache no longer `holds` (a cached file's is kept while the cache holds it).
    pub fn release(
        &mut self,
        ino: NodeId,
        io: KernelIo,
        holds: impl FnOnce(&FileVersion) -> bool,
    ) -> Option<u32> {
        let (opens, registered) = match (self.inodes.get_mut(&ino)?, io) {
            (InodeMode::Daemon { opens }, KernelIo::PageCache | KernelIo::Direct) => (opens, None),
            (InodeMode::Passthrough { opens, id, backing }, KernelIo::Passthrough(granted))
                if granted == *id =>
            {
                (opens, Some((*id, *backing)))
            }
            _ => return None,
        };
        *opens -= 1;
        if *opens > 0 {
            return None;
        }
        self.inodes.remove(&ino);
        match registered? {
            (id, Backing::Cached(v)) if holds(&v) => {
                self.kept.insert(v, id);
                None
            }
            (id, _) => Some(id),
        }
    }

    /// The cache dropped `version` (an elastic budget shrank): returns its kept registration,
    /// to unregister. An inode still open on it keeps its registration until its last release
    /// (which then finds the cache no longer holds it).
    pub fn forget(&mut self, version: &FileVersion) -> Option<u32> {
        self.kept.remove(version)
    }

    /// Registrations kept for cached files.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.kept.len()
    }

    /// The backing file of `ino`'s passthrough opens, if it has any.
    pub fn backing_of(&self, ino: NodeId) -> Option<Backing> {
        match self.inodes.get(&ino)? {
            InodeMode::Passthrough { backing, .. } => Some(*backing),
            InodeMode::Daemon { .. } => None,
        }
    }

    /// Inodes open by passthrough.
    pub fn passed_through(&self) -> usize {
        let through = |m: &&InodeMode| matches!(m, InodeMode::Passthrough { .. });
        self.inodes.values().filter(through).count()
    }

    /// Inodes with open files.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inodes.len()
    }
}

/// A backing file registration kept past its opens is kept for a successor in the handle
/// slots as a handle of its own: this bit and its id (real handle numbers never reach it).
const KEPT_REGISTRATION: u64 = 1 << 63;

fn kept_registration(id: u32) -> OpenHandle {
    OpenHandle {
        fh: KEPT_REGISTRATION | u64::from(id),
        ino: 0,
        kind: HandleKind::File,
        backing: id,
    }
}

/// The version of a file opened by a previous daemon, which did not leave it.
const UNKNOWN_VERSION: FileVersion = FileVersion {
    dev: 0,
    ino: 0,
    size: 0,
    mtime_ns: 0,
    ctime_ns: 0,
};

/// Passthrough for one mount: whether the kernel does it, and the inodes' modes.
#[derive(Default)]
pub struct Passthrough {
    /// Where kept registrations are recorded for a successor daemon, if there is a keeper.
    slots: OnceLock<Arc<HandleSlots>>,
    /// The kernel's backing files, once the kernel agreed to passthrough at INIT.
    kernel: OnceLock<Box<dyn BackingFiles>>,
    /// Turned off after the kernel refused a backing file.
    refused: AtomicBool,
    modes: Mutex<InodeModes>,
    /// Signalled at every release of a passthrough open.
    released: parking_lot::Condvar,
}

impl std::fmt::Debug for Passthrough {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Passthrough")
            .field("on", &self.on())
            .finish_non_exhaustive()
    }
}

impl Passthrough {
    /// Reads may be passed through from now on, to backing files registered with `kernel`.
    pub fn start(&self, kernel: Box<dyn BackingFiles>) {
        let _ = self.kernel.set(kernel);
    }

    /// True once the kernel agreed to passthrough (even if it refused a backing file since).
    pub fn started(&self) -> bool {
        self.kernel.get().is_some()
    }

    /// True while opens may be passed through.
    pub fn on(&self) -> bool {
        self.kernel.get().is_some() && !self.refused.load(Ordering::Relaxed)
    }

    /// True while new inodes may be passed through: [`Passthrough::on`] and not closed.
    pub fn open_to_new(&self) -> bool {
        self.on() && !self.modes.lock().closed
    }

    /// An open of `ino`: from `backing` by the kernel if it may (`register` registers the
    /// backing file with the kernel's table if the inode has none), else through the daemon as
    /// `daemon` says. Also returns the error that turned passthrough off if the kernel refused
    /// a registration with EPERM (the caller says it in the log).
    pub fn open<D>(
        &self,
        ino: NodeId,
        version: FileVersion,
        backing: Option<Backing>,
        register: impl FnOnce(&dyn BackingFiles, Backing) -> std::io::Result<u32>,
        daemon: impl FnOnce() -> D,
    ) -> (Granted<D>, Option<std::io::Error>) {
        let kernel = self.kernel.get().filter(|_| self.on());
        let Some(kernel) = kernel else {
            return (Granted::Daemon(daemon()), None);
        };
        let mut refused = None;
        let register = |b| match register(kernel.as_ref(), b) {
            Ok(id) => Some(id),
            Err(e) => {
                if e.raw_os_error() == Some(libc::EPERM) {
                    self.refused.store(true, Ordering::Relaxed);
                    refused = Some(e);
                } else {
                    tracing::debug!("registering a backing file: {e}");
                }
                None
            }
        };
        let mut modes = self.modes.lock();
        // The inode's passthrough opens read another version: they are most likely closed, with
        // their RELEASE still on its way. Only if one is really still open does this open read
        // what it reads (the kernel allows one backing file per inode).
        let deadline = std::time::Instant::now() + RELEASE_WAIT;
        while modes
            .backing_of(ino)
            .is_some_and(|b| b.version() != version)
        {
            if self.released.wait_until(&mut modes, deadline).timed_out() {
                tracing::debug!(
                    "inode {ino} changed while open: read as the open descriptor reads"
                );
                break;
            }
        }
        let granted = modes.open(ino, backing, register, daemon);
        drop(modes);
        (granted, refused)
    }

    /// The release of an open of `ino` that was granted `io`; `holds` says whether the cache
    /// still holds a file (whose registration is then kept).
    pub fn release(&self, ino: NodeId, io: KernelIo, holds: impl FnOnce(&FileVersion) -> bool) {
        if self.kernel.get().is_none() {
            return;
        }
        let (registered, kept, left) = {
            let mut modes = self.modes.lock();
            let backing = modes.backing_of(ino);
            let registered = modes.release(ino, io, holds);
            let kept = match backing {
                Some(Backing::Cached(v)) if registered.is_none() => modes.kept.get(&v).copied(),
                _ => None,
            };
            (
                registered,
                kept,
                backing.is_some() && modes.backing_of(ino).is_none(),
            )
        };
        if left {
            self.released.notify_all();
        }
        if let (Some(id), Some(slots)) = (kept, self.slots.get()) {
            slots.open_handle(kept_registration(id));
        }
        if let (Some(id), Some(kernel)) = (registered, self.kernel.get()) {
            kernel.unregister(id);
        }
    }

    /// Passes no new inode through from now on, and waits up to `within` for the last release
    /// of every inode open by passthrough; returns how many are still open so (0: none is,
    /// and none will be). Before the kernel opens files itself: it opens them through its
    /// page cache, which it refuses (EIO) for an inode that has a backing file.
    pub fn close(&self, within: std::time::Duration) -> usize {
        let deadline = std::time::Instant::now() + within;
        let mut modes = self.modes.lock();
        modes.closed = true;
        while modes.passed_through() > 0 {
            if self.released.wait_until(&mut modes, deadline).timed_out() {
                break;
            }
        }
        modes.passed_through()
    }

    /// Undoes [`Passthrough::close`]: the kernel is not to open files itself after all.
    pub fn reopen(&self) {
        self.modes.lock().closed = false;
    }

    /// Keeps every backing file registration that outlives its opens in `slots` from now on,
    /// so that a successor daemon can give it back.
    pub fn keep_in(&self, slots: Arc<HandleSlots>) {
        let _ = self.slots.set(slots);
    }

    /// Takes over the opens a previous daemon of the mount granted, `handles` (those the kernel
    /// still holds): each inode's mode as it was, so that its new opens are granted as the
    /// kernel allows and its last release gives its registration back. Registrations it kept
    /// for cached files are given back now (a file's next open registers it again); returns
    /// how many.
    pub fn adopt(&self, handles: &[OpenHandle]) -> usize {
        let mut modes = self.modes.lock();
        let mut dropped = Vec::new();
        for h in handles {
            if h.fh & KEPT_REGISTRATION != 0 {
                dropped.push(h);
                continue;
            }
            if h.kind != HandleKind::File {
                continue;
            }
            let mode = modes.inodes.entry(h.ino).or_insert(match h.backing {
                0 => InodeMode::Daemon { opens: 0 },
                // Its version is not known: an open of another version waits for this one's
                // release as it would for any (`RELEASE_WAIT`).
                id => InodeMode::Passthrough {
                    opens: 0,
                    id,
                    backing: Backing::Source(UNKNOWN_VERSION),
                },
            });
            match mode {
                InodeMode::Daemon { opens } | InodeMode::Passthrough { opens, .. } => *opens += 1,
            }
        }
        drop(modes);
        for h in &dropped {
            if let Some(kernel) = self.kernel.get() {
                kernel.unregister(h.backing);
            }
            if let Some(slots) = self.slots.get() {
                slots.close_handle(h.fh);
            }
        }
        dropped.len()
    }

    /// The cache dropped `versions`: their kept registrations go, so that the kernel lets go
    /// of their files and their memory returns (see [`InodeModes::forget`]).
    pub fn forget(&self, versions: &[FileVersion]) {
        let Some(kernel) = self.kernel.get() else {
            return;
        };
        let ids: Vec<u32> = {
            let mut modes = self.modes.lock();
            versions.iter().filter_map(|v| modes.forget(v)).collect()
        };
        for id in ids {
            kernel.unregister(id);
            if let Some(slots) = self.slots.get() {
                slots.close_handle(kept_registration(id).fh);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(ino: u64) -> FileVersion {
        FileVersion::of_test(ino, 100)
    }

    fn pt<D>(id: u32, backing: Backing) -> Granted<D> {
        Granted::Passthrough { id, backing }
    }

    #[test]
    fn an_inode_open_by_passthrough_gives_every_open_its_one_registration() {
        let mut m = InodeModes::default();
        let cached = Backing::Cached(version(1));
        let source = Backing::Source(version(1));
        let mut next = 10;
        let mut reg = |_| {
            next += 1;
            Some(next)
        };
        let page = || KernelIo::PageCache;
        assert_eq!(m.open(5, Some(cached), &mut reg, page), pt(11, cached));
        // Whatever the next opens want, they share it while it is open.
        assert_eq!(m.open(5, Some(source), &mut reg, page), pt(11, cached));
        assert_eq!(
            m.open(5, None, &mut reg, || KernelIo::Direct),
            pt(11, cached)
        );
        assert_eq!(m.release(5, KernelIo::Passthrough(11), |_| true), None);
        assert_eq!(m.release(5, KernelIo::Passthrough(11), |_| true), None);
        // The cached file's registration is kept, for its next open.
        assert_eq!(m.release(5, KernelIo::Passthrough(11), |_| true), None);
        assert_eq!((m.len(), m.kept()), (0, 1));
        assert_eq!(m.open(5, Some(cached), |_| None, page), pt(11, cached));
        assert_eq!(m.release(5, KernelIo::Passthrough(11), |_| true), None);
        // Through the daemon, a passthrough open waits until the inode's opens are gone.
        assert_eq!(
            m.open(5, None, &mut reg, page),
            Granted::Daemon(KernelIo::PageCache)
        );
        let direct = || KernelIo::Direct;
        assert_eq!(
            m.open(5, Some(source), &mut reg, direct),
            Granted::Daemon(KernelIo::Direct)
        );
        assert_eq!(m.release(5, KernelIo::PageCache, |_| true), None);
        assert_eq!(m.release(5, KernelIo::Direct, |_| true), None);
        assert_eq!(m.open(5, Some(source), &mut reg, page), pt(12, source));
        // A source file's registration goes at its last release.
        assert_eq!(m.release(5, KernelIo::Passthrough(12), |_| true), Some(12));
        // Other inodes are their own.
        assert_eq!(
            m.open(6, None, &mut reg, page),
            Granted::Daemon(KernelIo::PageCache)
        );
    }

    #[test]
    fn once_closed_only_an_inode_still_open_by_passthrough_gives_its_registration() {
        let mut m = InodeModes::default();
        let (a, b) = (Backing::Source(version(1)), Backing::Source(version(2)));
        let mut next = 30;
        let mut reg = |_| {
            next += 1;
            Some(next)
        };
        let page = || KernelIo::PageCache;
        assert_eq!(m.open(5, Some(a), &mut reg, page), pt(31, a));
        m.closed = true;
        assert_eq!(m.passed_through(), 1);
        // Inode 5's next open must share its backing file (the kernel refuses any other)...
        assert_eq!(m.open(5, None, &mut reg, page), pt(31, a));
        // ...and another inode no longer takes one up.
        assert_eq!(
            m.open(6, Some(b), &mut reg, page),
            Granted::Daemon(KernelIo::PageCache)
        );
        assert_eq!(m.release(5, KernelIo::Passthrough(31), |_| true), None);
        assert_eq!(m.release(5, KernelIo::Passthrough(31), |_| true), Some(31));
        assert_eq!(m.passed_through(), 0);
        assert_eq!(
            m.open(5, Some(a), &mut reg, page),
            Granted::Daemon(KernelIo::PageCache)
        );
        assert_eq!(m.passed_through(), 0);
    }

    #[test]
    fn closing_waits_for_the_last_release_of_a_passed_through_inode() {
        struct Table;
        impl BackingFiles for Table {
            fn register(&self, _: BorrowedFd<'_>) -> std::io::Result<u32> {
                Ok(7)
            }
            fn unregister(&self, _: u32) {}
        }
        let p = Arc::new(Passthrough::default());
        p.start(Box::new(Table));
        let v = version(1);
        let (granted, _) = p.open(5, v, Some(Backing::Source(v)), |_, _| Ok(7), || ());
        assert_eq!(granted, pt(7, Backing::Source(v)));
        // Still open: closing gives up after its time, with the inode counted.
        assert_eq!(p.close(std::time::Duration::from_millis(10)), 1);
        let releaser = {
            let p = p.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                p.release(5, KernelIo::Passthrough(7), |_| false);
            })
        };
        assert_eq!(p.close(std::time::Duration::from_secs(10)), 0);
        releaser.join().unwrap();
        let (granted, _) = p.open(5, v, Some(Backing::Source(v)), |_, _| Ok(8), || ());
        assert_eq!(granted, Granted::Daemon(()));
        assert!(!p.open_to_new());
        // A switch that does not happen gives passthrough back.
        p.reopen();
        assert!(p.open_to_new());
        let (granted, _) = p.open(6, v, Some(Backing::Source(v)), |_, _| Ok(9), || ());
        assert_eq!(granted, pt(9, Backing::Source(v)));
    }

    #[test]
    fn a_dropped_cached_file_loses_its_kept_registration_and_an_open_one_at_release() {
        let mut m = InodeModes::default();
        let (a, b) = (Backing::Cached(version(1)), Backing::Cached(version(2)));
        let mut next = 20;
        let mut reg = |_| {
            next += 1;
            Some(next)
        };
        let page = || KernelIo::PageCache;
        assert_eq!(m.open(5, Some(a), &mut reg, page), pt(21, a));
        assert_eq!(m.release(5, KernelIo::Passthrough(21), |_| true), None);
        assert_eq!(m.open(6, Some(b), &mut reg, page), pt(22, b));
        // Both dropped by the cache: a's kept registration goes now, b's at its release.
        assert_eq!(m.forget(&version(1)), Some(21));
        assert_eq!(m.forget(&version(2)), None);
        assert_eq!(m.release(6, KernelIo::Passthrough(22), |_| false), Some(22));
        assert_eq!((m.len(), m.kept()), (0, 0));
        // Cached again later: a new registration.
        assert_eq!(m.open(5, Some(a), &mut reg, page), pt(23, a));
    }

    #[test]
    fn a_refused_registration_goes_through_the_daemon() {
        let mut m = InodeModes::default();
        let b = Backing::Cached(version(1));
        let granted = m.open(5, Some(b), |_| None, || KernelIo::Direct);
        assert_eq!(granted, Granted::Daemon(KernelIo::Direct));
        assert_eq!(m.release(5, KernelIo::Direct, |_| true), None);
        assert_eq!(m.len(), 0);
    }

    /// A random sequence of opens and releases keeps the kernel's rules: an inode with a
    /// passthrough open has only passthrough opens, of one registration, and every
    /// registration is unregistered once, after its last open, or kept for a cached file.
    #[test]
    fn random_opens_and_releases_keep_the_kernels_rules() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(29);
        let mut m = InodeModes::default();
        let mut open: Vec<(NodeId, KernelIo)> = Vec::new();
        let mut registered = 0u32;
        let mut unregistered: Vec<u32> = Vec::new();
        for _ in 0..20_000 {
            if open.is_empty() || rng.random_bool(0.55) {
                let ino = rng.random_range(1..5);
                let backing = match rng.random_range(0..3) {
                    0 => Some(Backing::Cached(version(ino))),
                    1 => Some(Backing::Source(version(ino))),
                    _ => None,
                };
                let daemon = [KernelIo::PageCache, KernelIo::Direct][rng.random_range(0..2)];
                let refuse = rng.random_bool(0.1);
                let granted = m.open(
                    ino,
                    backing,
                    |_| {
                        (!refuse).then(|| {
                            registered += 1;
                            registered
                        })
                    },
                    || daemon,
                );
                let io = match granted {
                    Granted::Passthrough { id, .. } => KernelIo::Passthrough(id),
                    Granted::Daemon(io) => io,
                };
                for &(_, other) in open.iter().filter(|o| o.0 == ino) {
                    match (io, other) {
                        (KernelIo::Passthrough(a), KernelIo::Passthrough(b)) => assert_eq!(a, b),
                        (KernelIo::Passthrough(_), _) | (_, KernelIo::Passthrough(_)) => {
                            panic!("inode {ino}: {io:?} beside {other:?}")
                        }
                        _ => {}
                    }
                }
                if let KernelIo::Passthrough(id) = io {
                    assert!(!unregistered.contains(&id), "{id} was unregistered");
                }
                open.push((ino, io));
            } else {
                let (ino, io) = open.swap_remove(rng.random_range(0..open.len()));
                if let Some(id) = m.release(ino, io, |_| true) {
                    assert!(!open.iter().any(|o| o.1 == KernelIo::Passthrough(id)));
                    unregistered.push(id);
                }
            }
        }
        for (ino, io) in open.drain(..) {
            unregistered.extend(m.release(ino, io, |_| true));
        }
        unregistered.sort_unstable();
        unregistered.dedup();
        assert_eq!(unregistered.len() + m.kept(), registered as usize);
        assert_eq!(m.len(), 0);
    }
}
