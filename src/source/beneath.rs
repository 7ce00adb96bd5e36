//! Resolving dataset-relative paths beneath the source root, following no symlink.
//!
//! The daemon runs as root; a user who can write inside the source could otherwise swap a
//! directory for a symlink (`mv z z.old && ln -s /etc z`) between the kernel's lookup and the
//! daemon's open, and have root read `/etc/shadow` for them. Every path the daemon touches in
//! the source is therefore resolved from a descriptor of the source root, held since the mount:
//! - with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` (Linux
//!   5.6): the kernel refuses `..` above the root, absolute paths, and a symlink in any
//!   component (`ELOOP`, or `EXDEV` for an escape);
//! - on kernels without `openat2` (`ENOSYS`), by walking the components one `openat` at a
//!   time, each intermediate one `O_PATH | O_DIRECTORY | O_NOFOLLOW` (a symlink there fails
//!   with `ENOTDIR`), the last with `O_NOFOLLOW`, and no component other than a plain name.
//!
//! Symlinks of the dataset still appear as symlinks in the mount: the daemon reads them with
//! `readlinkat` on their own `O_PATH` descriptor, and the kernel resolves them in the
//! reader's namespace, as a local process would.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// A held descriptor of the source root, and how to resolve paths beneath it.
#[derive(Debug)]
pub struct Beneath {
    root: OwnedFd,
    /// `openat2` is available (else the component walk).
    openat2: bool,
}

/// How `openat2` resolves a path beneath the root: no symlink anywhere, no magic link, never
/// out of the root.
pub const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// How many times a resolution interrupted by a concurrent rename (`EAGAIN`) is retried.
const RENAME_RETRIES: usize = 8;

impl Beneath {
    /// Opens the root at `root` (an absolute, canonical path) and probes for `openat2`.
    pub fn open(root: &Path) -> io::Result<Beneath> {
        let fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut beneath = Beneath {
            root: fd,
            openat2: true,
        };
        match beneath.openat2(Path::new("."), OFlags::PATH) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => beneath.openat2 = false,
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        Ok(beneath)
    }

    /// As [`Beneath::open`], but resolving by the component walk whatever the kernel offers:
    /// the fallback, for tests.
    #[cfg(test)]
    pub fn open_walking(root: &Path) -> io::Result<Beneath> {
        let mut beneath = Beneath::open(root)?;
        beneath.openat2 = false;
        Ok(beneath)
    }

    /// True if paths are resolved with `openat2`.
    #[cfg(test)]
    pub fn uses_openat2(&self) -> bool {
        self.openat2
    }

    /// The root's descriptor, where paths are resolved with `openat2` (with [`RESOLVE`]), for
    /// opens made elsewhere the same way (`super::ring`).
    pub fn openat2_root(&self) -> Option<BorrowedFd<'_>> {
        self.openat2.then(|| self.root.as_fd())
    }

    /// The root's descriptor.
    pub fn root(&self) -> impl AsFd + '_ {
        self.root.as_fd()
    }

    /// Opens `rel` (relative to the root; empty for the root itself) with `flags`, following
    /// no symlink anywhere and never leaving the root. `O_NOFOLLOW` and `O_CLOEXEC` are
    /// always added: a symlink as the last component opens only with `O_PATH` (the link
    /// itself), and fails with `ELOOP` otherwise.
    pub fn open_at(&self, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if self.openat2 {
            let rel = if rel.as_os_str().is_empty() {
                Path::new(".")
            } else {
                rel
            };
            self.openat2(rel, flags)
        } else {
            self.walk(rel, flags)
        }
    }

    fn openat2(&self, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        let resolve = RESOLVE;
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(&self.root, rel, flags, Mode::empty(), resolve) {
                Err(rustix::io::Errno::AGAIN) if tries < RENAME_RETRIES => tries += 1,
                other => return other.map_err(io::Error::from),
            }
        }
    }

    fn walk(&self, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        let names = plain_names(rel)?;
        let Some((last, dirs)) = names.split_last() else {
            return Ok(rustix::fs::openat(&self.root, ".", flags, Mode::empty())?);
        };
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut at: Option<OwnedFd> = None;
        for name in dirs {
            let parent = at.as_ref().map_or(self.root.as_fd(), |fd| fd.as_fd());
            at = Some(rustix::fs::openat(parent, *name, dir_flags, Mode::empty())?);
        }
        let parent = at.as_ref().map_or(self.root.as_fd(), |fd| fd.as_fd());
        Ok(rustix::fs::openat(parent, *last, flags, Mode::empty())?)
    }
}

/// The components of `rel`, each a plain name (no `..`, no root, `.` skipped).
fn plain_names(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut names = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(name) if !name.as_bytes().contains(&b'/') => names.push(name),
            Component::CurDir => {}
            _ => return Err(io::Error::from_raw_os_error(libc::EXDEV)),
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourceError;
    use std::os::unix::fs::symlink;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f"), b"inside").unwrap();
        std::fs::write(dir.path().join("outside"), b"secret").unwrap();
        symlink("../outside", root.join("a/up")).unwrap();
        symlink(dir.path(), root.join("abs")).unwrap();
        symlink("b", root.join("a/bb")).unwrap();
        dir
    }

    fn read(b: &Beneath, rel: &str) -> io::Result<Vec<u8>> {
        let fd = b.open_at(Path::new(rel), OFlags::RDONLY)?;
        std::fs::read(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&fd)
        ))
    }

    #[test]
    fn both_resolvers_stay_beneath_the_root_and_follow_no_symlink() {
        let dir = tree();
        let root = dir.path().join("root");
        for b in [
            Beneath::open(&root).unwrap(),
            Beneath::open_walking(&root).unwrap(),
        ] {
            assert_eq!(read(&b, "a/b/f").unwrap(), b"inside");
            assert_eq!(read(&b, "./a/./b/f").unwrap(), b"inside");
            for escape in [
                "a/up",
                "abs/outside",
                "a/bb/f",
                "../outside",
                "a/../../outside",
            ] {
                let err = SourceError::from(read(&b, escape).unwrap_err());
                assert!(err.is_moved(), "{escape}: {err} ({})", b.uses_openat2());
            }
            let err = b
                .open_at(Path::new("/etc/passwd"), OFlags::RDONLY)
                .unwrap_err();
            let err = SourceError::from(err);
            assert!(err.is_moved(), "absolute: {err}");
            // A symlink itself opens as O_PATH, never its target.
            let link = b.open_at(Path::new("a/up"), OFlags::PATH).unwrap();
            let target = rustix::fs::readlinkat(&link, "", Vec::new()).unwrap();
            assert_eq!(target.as_bytes(), b"../outside");
            assert!(b.open_at(Path::new(""), OFlags::PATH).is_ok());
        }
    }
}
