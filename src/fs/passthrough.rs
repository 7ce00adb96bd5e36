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
//! Measured on kernel 6.18 (and so in the kernel's `iomode.c`): an inode's opens are either
//! all passthrough, to one backing file, or all through the page cache; an open that mixes the
//! two, or names a second backing file while the first is open, fails with EIO. Direct-I/O
//! opens are neutral. `FOPEN_KEEP_CACHE` with passthrough is EIO, and `FOPEN_DIRECT_IO` turns
//! passthrough off. The kernel leaves a mode when the last open is closed, before the daemon
//! is sent the RELEASE (measured: 22 of 2,000 OPENs came before the previous RELEASE).
//!
//! So [`InodeModes`] counts, per inode, the opens it granted each mode and drops the count at
//! RELEASE: its view holds every open the kernel still has, and more. An open that wants one
//! mode while the inode is in the other, or another backing file, is given direct I/O, which
//! is always allowed. A backing file is registered with the kernel at the first passthrough
//! open of an inode and unregistered at its last release: the kernel refuses reads through an
//! id closed while its file is open (199 of 200 opens got EIO when the id was dropped at once).
//!
//! # When it is off
//! With `--no-passthrough`, `--fast-open` (no OPEN to answer), a kernel that does not offer
//! `FUSE_PASSTHROUGH` (before 6.9, or built without it), or a daemon the kernel refuses a
//! backing file (it needs `CAP_SYS_ADMIN`): every open goes through the daemon as before. The
//! daemon says which, once, in its log.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

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

/// What an inode's open files are, as the daemon granted them.
#[derive(Debug)]
enum InodeMode {
    PageCache {
        opens: u32,
    },
    Passthrough {
        opens: u32,
        id: u32,
        backing: Backing,
    },
}

/// The mode of each inode with open files (see the module header). Pure: registering and
/// unregistering backing files are the caller's closures.
#[derive(Debug, Default)]
pub struct InodeModes {
    inodes: HashMap<NodeId, InodeMode>,
}

impl InodeModes {
    /// An open of `ino` that would be read as `wanted` (`Passthrough`'s id is ignored: the
    /// backing file is `backing`, registered by `register` if the inode has none). Returns
    /// how it is to be read.
    pub fn open(
        &mut self,
        ino: NodeId,
        wanted: KernelIo,
        backing: Option<Backing>,
        register: impl FnOnce() -> Option<u32>,
    ) -> KernelIo {
        match (wanted, backing, self.inodes.get_mut(&ino)) {
            (KernelIo::Direct, ..) => KernelIo::Direct,
            (KernelIo::Passthrough(_), Some(b), None) => match register() {
                Some(id) => {
                    self.inodes.insert(
                        ino,
                        InodeMode::Passthrough {
                            opens: 1,
                            id,
                            backing: b,
                        },
                    );
                    KernelIo::Passthrough(id)
                }
                None => KernelIo::Direct,
            },
            (
                KernelIo::Passthrough(_),
                Some(b),
                Some(InodeMode::Passthrough { opens, id, backing }),
            ) if *backing == b => {
                *opens += 1;
                KernelIo::Passthrough(*id)
            }
            (KernelIo::PageCache, _, None) => {
                self.inodes.insert(ino, InodeMode::PageCache { opens: 1 });
                KernelIo::PageCache
            }
            (KernelIo::PageCache, _, Some(InodeMode::PageCache { opens })) => {
                *opens += 1;
                KernelIo::PageCache
            }
            // The other mode, another backing file, or passthrough without one.
            _ => KernelIo::Direct,
        }
    }

    /// The release of an open of `ino` granted `io`. Returns a backing file id to unregister
    /// (its last open is gone).
    pub fn release(&mut self, ino: NodeId, io: KernelIo) -> Option<u32> {
        let (opens, id) = match (io, self.inodes.get_mut(&ino)?) {
            (KernelIo::PageCache, InodeMode::PageCache { opens }) => (opens, None),
            (KernelIo::Passthrough(granted), InodeMode::Passthrough { opens, id, .. })
                if granted == *id =>
            {
                (opens, Some(*id))
            }
            _ => return None,
        };
        *opens -= 1;
        if *opens > 0 {
            return None;
        }
        self.inodes.remove(&ino);
        id
    }

    /// Inodes with open files in a mode.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inodes.len()
    }
}

/// Passthrough for one mount: whether the kernel does it, and the inodes' modes.
#[derive(Default)]
pub struct Passthrough {
    /// The kernel's backing files, once the kernel agreed to passthrough at INIT.
    kernel: OnceLock<Box<dyn BackingFiles>>,
    /// Turned off after the kernel refused a backing file.
    refused: AtomicBool,
    modes: Mutex<InodeModes>,
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

    /// True while opens may be passed through.
    pub fn on(&self) -> bool {
        self.kernel.get().is_some() && !self.refused.load(Ordering::Relaxed)
    }

    /// An open of `ino` that would be read as `wanted`, from `backing` if passed through
    /// (`open_fd` opens it, if it must be registered). Returns how it is to be read, and the
    /// error that turned passthrough off if registering failed with EPERM (the caller says it
    /// in the log).
    pub fn open(
        &self,
        ino: NodeId,
        wanted: KernelIo,
        backing: Option<Backing>,
        register: impl FnOnce(&dyn BackingFiles) -> std::io::Result<u32>,
    ) -> (KernelIo, Option<std::io::Error>) {
        let kernel = self.kernel.get().filter(|_| self.on());
        let wanted = match (wanted, kernel) {
            (KernelIo::Passthrough(_), None) => KernelIo::Direct,
            _ => wanted,
        };
        let mut refused = None;
        let io =
            self.modes
                .lock()
                .open(ino, wanted, backing, || match register(kernel?.as_ref()) {
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
                });
        (io, refused)
    }

    /// The release of an open of `ino` that was granted `io`.
    pub fn release(&self, ino: NodeId, io: KernelIo) {
        let id = self.modes.lock().release(ino, io);
        if let (Some(id), Some(kernel)) = (id, self.kernel.get()) {
            kernel.unregister(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(ino: u64) -> FileVersion {
        FileVersion {
            dev: 1,
            ino,
            size: 100,
            mtime_ns: 1,
            ctime_ns: 1,
        }
    }

    const PT: KernelIo = KernelIo::Passthrough(0);

    #[test]
    fn an_inode_is_in_one_mode_with_one_backing_file_until_its_last_release() {
        let mut m = InodeModes::default();
        let cached = Some(Backing::Cached(version(1)));
        let source = Some(Backing::Source(version(1)));
        let mut next = 10;
        let mut reg = || {
            next += 1;
            Some(next)
        };
        // Two opens share one registration; a page-cache open and another backing file get
        // direct I/O meanwhile.
        assert_eq!(m.open(5, PT, cached, &mut reg), KernelIo::Passthrough(11));
        assert_eq!(m.open(5, PT, cached, &mut reg), KernelIo::Passthrough(11));
        assert_eq!(
            m.open(5, KernelIo::PageCache, None, &mut reg),
            KernelIo::Direct
        );
        assert_eq!(m.open(5, PT, source, &mut reg), KernelIo::Direct);
        // Releases of the neutral opens change nothing; the last passthrough one unregisters.
        assert_eq!(m.release(5, KernelIo::Direct), None);
        assert_eq!(m.release(5, KernelIo::Passthrough(11)), None);
        assert_eq!(m.release(5, KernelIo::Passthrough(11)), Some(11));
        assert_eq!(m.len(), 0);
        // Then the page cache may have the inode, and passthrough waits for it to be done.
        assert_eq!(
            m.open(5, KernelIo::PageCache, None, &mut reg),
            KernelIo::PageCache
        );
        assert_eq!(m.open(5, PT, source, &mut reg), KernelIo::Direct);
        assert_eq!(m.release(5, KernelIo::PageCache), None);
        assert_eq!(m.open(5, PT, source, &mut reg), KernelIo::Passthrough(12));
        // Other inodes are their own.
        assert_eq!(
            m.open(6, KernelIo::PageCache, None, &mut reg),
            KernelIo::PageCache
        );
    }

    #[test]
    fn a_refused_registration_is_direct_io_and_leaves_no_mode() {
        let mut m = InodeModes::default();
        let b = Some(Backing::Cached(version(1)));
        assert_eq!(m.open(5, PT, b, || None), KernelIo::Direct);
        assert_eq!(m.open(5, PT, None, || Some(1)), KernelIo::Direct);
        assert_eq!(m.len(), 0);
        assert_eq!(
            m.open(5, KernelIo::PageCache, None, || None),
            KernelIo::PageCache
        );
    }

    /// A random sequence of opens and releases never puts an inode in two modes, or in
    /// passthrough with two backing files, and every registration is unregistered once.
    #[test]
    fn random_opens_and_releases_keep_the_kernels_rules() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(29);
        let mut m = InodeModes::default();
        let mut open: Vec<(NodeId, KernelIo, Option<Backing>)> = Vec::new();
        let (mut registered, mut unregistered) = (0u32, Vec::new());
        for _ in 0..20_000 {
            if open.is_empty() || rng.random_bool(0.55) {
                let ino = rng.random_range(1..4);
                let backing = match rng.random_range(0..3) {
                    0 => Some(Backing::Cached(version(ino))),
                    1 => Some(Backing::Source(version(ino))),
                    _ => None,
                };
                let wanted = [PT, KernelIo::PageCache, KernelIo::Direct][rng.random_range(0..3)];
                let io = m.open(ino, wanted, backing, || {
                    registered += 1;
                    Some(registered)
                });
                // The kernel's rules, against what is open now.
                for &(other, other_io, other_backing) in open.iter().filter(|o| o.0 == ino) {
                    match (io, other_io) {
                        (KernelIo::PageCache, KernelIo::Passthrough(_))
                        | (KernelIo::Passthrough(_), KernelIo::PageCache) => {
                            panic!("inode {other} in two modes")
                        }
                        (KernelIo::Passthrough(a), KernelIo::Passthrough(b)) => {
                            assert_eq!(a, b);
                            assert_eq!(backing, other_backing);
                        }
                        _ => {}
                    }
                }
                open.push((ino, io, backing));
            } else {
                let (ino, io, _) = open.swap_remove(rng.random_range(0..open.len()));
                if let Some(id) = m.release(ino, io) {
                    assert!(!open.iter().any(|o| o.1 == KernelIo::Passthrough(id)));
                    unregistered.push(id);
                }
            }
        }
        for (ino, io, _) in open.drain(..) {
            unregistered.extend(m.release(ino, io));
        }
        unregistered.sort_unstable();
        assert_eq!(unregistered, (1..=registered).collect::<Vec<_>>());
        assert_eq!(m.len(), 0);
    }
}
