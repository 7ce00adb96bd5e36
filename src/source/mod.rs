//! The dataset source: the directory that a mount mirrors.
//!
//! [`DatasetSource`] is the I/O boundary below the filesystem core. [`LocalSource`] reads a
//! local (or kernel-mounted network) directory; [`FaultySource`] wraps any source and injects
//! errors and delays for tests, the way mountpoint-s3's `failure_client` does. Every call
//! fails with a [`SourceError`] ([`error`]), which carries its cause up to the reader's log
//! line and maps to the reader's errno in one place.
//!
//! Confinement: every path is resolved beneath a descriptor of the source root with no
//! symlink followed in any component ([`beneath`]), and what was opened is checked with
//! `fstat` against what the caller expects (its kind, its version). Operations that hand a
//! user something run with that user's credentials ([`creds`]), so the source's own
//! permission checks (modes, ACLs, search permission on every directory) apply at that moment.
//!
//! Paths are relative to the source root. A block read opens the file, reads the range and
//! closes it again: no descriptor outlives a read, and the open costs a few microseconds
//! against a block of up to a megabyte.
//!
//! When coorfs manages the memory (`drop_pages`), bytes read from storage must not linger in
//! the source's page cache: that cache is LRU, and the memory belongs to coorfs's cache. A
//! read then uses `O_DIRECT` into the fetcher's page-aligned block ([`crate::block::Block`]):
//! the storage writes straight into the block, with no page-cache copy to allocate, charge to
//! the daemon's memory cgroup, copy out of and drop again. Measured in the setup of
//! `scripts/bench-frameworks.sh` (where every allocation of page cache meets the cgroup's
//! limit and reclaims), that took an epoch of the PyTorch pipeline from 6.8 s to 6.4 s.
//! Filesystems that refuse `O_DIRECT` (ramfs, some FUSE filesystems) answer EINVAL; the
//! source then reads through the page cache for the rest of the mount, and drops the pages
//! each read brought in (`posix_fadvise(DONTNEED)`).

pub mod beneath;
pub mod creds;
pub mod error;
pub mod object;
pub mod ring;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::block::ALIGN;
use crate::namespace::{Attr, DirNames, FileVersion, Kind, SourceMeta};
use beneath::Beneath;
pub use creds::{Creds, as_user};
pub use error::{SourceError, SourceResult};
pub use ring::SmallRead;
use rustix::fs::{AtFlags, OFlags, Statx, StatxFlags};
use std::os::fd::AsFd;

/// One entry of a source directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirItem {
    pub name: OsString,
    /// Its `lstat` when the directory was read.
    pub meta: SourceMeta,
}

/// A directory of the source, open, and the names it held when it was read: what a FUSE
/// listing serves. An entry's attributes are read only when asked for ([`Listing::stat`]):
/// a listing that only lists (`find`, `os.scandir`) costs no `lstat` per entry.
#[derive(Debug)]
pub struct Listing {
    entries: Entries,
    /// The directory's own `fstat`, taken before its names were read: an entry added or
    /// removed since changes its change time.
    pub meta: SourceMeta,
    /// Each entry's name, and its type if the directory said (`d_type`); empty until
    /// [`Listing::read_names`] (or filled by the caller from what it already knew).
    pub names: DirNames,
}

/// Where a listing's names and attributes come from.
#[derive(Debug)]
enum Entries {
    /// A directory open on a local filesystem: names read from it, attributes by `statx`.
    Open(std::os::fd::OwnedFd),
    /// A listing already taken (an object store's): each entry's attributes, by name.
    Known(std::collections::BTreeMap<OsString, SourceMeta>),
}

impl Listing {
    /// A listing of entries already known with their attributes, for sources that list
    /// without a descriptor (object stores).
    pub fn known(
        meta: SourceMeta,
        entries: std::collections::BTreeMap<OsString, SourceMeta>,
    ) -> Self {
        Listing {
            entries: Entries::Known(entries),
            meta,
            names: Vec::new(),
        }
    }

    /// Reads the directory's names, without `.` and `..`, in the order the source lists them.
    pub fn read_names(&mut self) -> SourceResult<()> {
        let fd = match &self.entries {
            Entries::Open(fd) => fd,
            Entries::Known(entries) => {
                let names = entries.iter().map(|(n, m)| (n.clone(), Some(m.attr.kind)));
                self.names.extend(names);
                return Ok(());
            }
        };
        let mut dir = rustix::fs::Dir::read_from(fd)?;
        while let Some(entry) = dir.read() {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let kind = match entry.file_type() {
                rustix::fs::FileType::Unknown => None,
                t => Some(Kind::from_mode(t.as_raw_mode())),
            };
            self.names
                .push((OsStr::from_bytes(name).to_os_string(), kind));
        }
        Ok(())
    }

    /// `lstat` of entry `name`: one `statx` relative to the open directory, so confined.
    pub fn stat(&self, name: &OsStr) -> SourceResult<SourceMeta> {
        let dir = match &self.entries {
            Entries::Open(fd) => fd,
            Entries::Known(entries) => {
                return entries.get(name).copied().ok_or(SourceError::NotFound);
            }
        };
        let name = std::ffi::CString::new(name.as_bytes()).map_err(|_| SourceError::Invalid)?;
        stat_at(dir, &name)
    }
}

/// A source file opened for a caller ([`DatasetSource::open_file`]).
#[derive(Debug)]
pub enum SourceFile {
    /// A file of a local filesystem, held open (`O_PATH` for the daemon's own opens): reads
    /// of a file replaced or changed while open still reach the file that was opened.
    Local(File),
    /// An object: nothing is held open. Its bytes are read by version (each ranged read is
    /// conditional on it), so a changed object fails the reads of an open of the old one.
    Object(SourceMeta),
}

impl SourceFile {
    /// What the open file is now: its `fstat` (an object's version is the one it was opened
    /// as: the store is not asked again).
    pub fn stat(&self) -> SourceResult<SourceMeta> {
        match self {
            SourceFile::Local(file) => stat_fd(file),
            SourceFile::Object(meta) => Ok(*meta),
        }
    }

    /// Reads into `buf` at `offset` of the open file itself, until `buf` is full or the file
    /// ends (see [`read_open_file`]). An object has no open file to fall back on: the version
    /// it was opened as is gone from the store, ESTALE.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> SourceResult<usize> {
        match self {
            SourceFile::Local(file) => read_open_file(file, offset, buf),
            SourceFile::Object(_) => Err(SourceError::Changed),
        }
    }

    /// The local file, which the kernel may read by itself (passthrough); None for an object.
    pub fn local(&self) -> Option<&File> {
        match self {
            SourceFile::Local(file) => Some(file),
            SourceFile::Object(_) => None,
        }
    }
}

/// Capacity figures of the filesystem holding the source (`statvfs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStats {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    /// Bytes.
    pub bsize: u32,
    /// Bytes.
    pub namelen: u32,
    /// Bytes.
    pub frsize: u32,
}

/// Read access to a dataset directory. Paths are relative to its root; `who` names the
/// credentials an operation runs with ([`Creds::DAEMON`] for the daemon's own work: the
/// scan, fetches and prefetches of files a user already opened or will open).
pub trait DatasetSource: Send + Sync + 'static {
    /// The root, for messages.
    fn root(&self) -> &Path;
    /// `lstat` of an entry, reached with `who`'s search permission on every directory.
    fn metadata(&self, rel: &Path, who: &Creds) -> SourceResult<SourceMeta>;
    /// Opens a directory that `who` may read, with its `fstat` and no names yet.
    fn open_dir(&self, rel: &Path, who: &Creds) -> SourceResult<Listing>;
    /// Opens a directory that `who` may read and reads its names, without `.` and `..`, in
    /// the order the source lists them.
    fn list_dir(&self, rel: &Path, who: &Creds) -> SourceResult<Listing> {
        let mut listing = self.open_dir(rel, who)?;
        listing.read_names()?;
        Ok(listing)
    }
    /// The directory's `fstat` (taken before its names were read) and its entries, each
    /// with its `lstat` (an entry gone between the listing and its `lstat` is left out, as a
    /// fresh listing would), for a directory that `who` may read.
    fn read_dir(&self, rel: &Path, who: &Creds) -> SourceResult<(SourceMeta, Vec<DirItem>)> {
        let listing = self.list_dir(rel, who)?;
        let items = listing
            .names
            .iter()
            .filter_map(|(name, _)| {
                let meta = listing.stat(name).ok()?;
                Some(DirItem {
                    name: name.clone(),
                    meta,
                })
            })
            .collect();
        Ok((listing.meta, items))
    }
    /// The target of a symbolic link.
    fn read_link(&self, rel: &Path) -> SourceResult<PathBuf>;
    /// Opens regular file `rel` for reading as `who`: the source applies its modes, ACLs and
    /// search permissions now. Returns the open file and what its `fstat` says. For the
    /// daemon's own credentials (root, who may read anything) the file may be opened
    /// `O_PATH` only: read it with [`read_open_file`].
    fn open_file(&self, rel: &Path, who: &Creds) -> SourceResult<(SourceFile, SourceMeta)>;
    /// The index of the first of `files` that `who` may not read (searching every
    /// directory on the way), if any.
    fn first_unreadable(
        &self,
        files: &mut dyn Iterator<Item = PathBuf>,
        who: &Creds,
    ) -> SourceResult<Option<usize>>;
    /// The value of POSIX ACL attribute `name` (`system.posix_acl_access` or `_default`)
    /// of file or directory `rel`, None if it has none.
    fn acl(&self, rel: &Path, name: &str) -> SourceResult<Option<Vec<u8>>>;
    /// Reads into `buf` from `offset` of file `version`, until `buf` is full or the file
    /// ends. Returns the bytes read. Fails with ESTALE if the file at `rel` is no longer
    /// that version.
    fn read_block(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<usize>;
    /// Reads from `offset` of file `version` into `blocks`, one after another, each to its
    /// length (each allocated as the read reaches it), and hands each to `filled` once it is
    /// full, until all are, the file ends or a read or an allocation fails; returns the bytes
    /// read. An object store reads them in one request (a part,
    /// see `tier/fetch/parts.rs`) and hands a block over as soon as the body has filled it, before
    /// the request ends; by default, one `read_block` each.
    fn read_blocks(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        blocks: &mut crate::block::RunBlocks,
        filled: &mut dyn FnMut(crate::block::Block),
    ) -> SourceResult<usize> {
        let mut done = 0;
        for block in blocks {
            let mut block = block?;
            let want = block.len();
            let n = self.read_block(
                rel,
                version,
                offset + done as u64,
                &mut block.whole_mut()[..want],
            )?;
            done += n;
            if n < want {
                break;
            }
            filled(block);
        }
        Ok(done)
    }
    /// Reads each of `reads` (whole small files, see [`SmallRead`]) as `read_block` at offset
    /// 0 would, filling in its result. A source that reads them together (a directory's, see
    /// [`ring`]) says so with [`DatasetSource::reads_together`]; by default one by one.
    fn read_small(&self, reads: &mut [SmallRead<'_>]) {
        for read in reads {
            read.result = Some(self.read_block(read.rel, read.version, 0, read.buf));
        }
    }
    /// True if [`DatasetSource::read_small`] reads files together rather than one by one.
    fn reads_together(&self) -> bool {
        false
    }
    /// Sends now the request of a [`DatasetSource::read_blocks`] of `len` bytes from `offset`
    /// of file `version` that a reader is expected to make soon, so that its wait is behind it
    /// when the read comes: an object store's GET, whose body waits in the connection (a few
    /// hundred KiB the store sent before the window closed) until that read takes it. By
    /// default nothing: a directory's read has no wait to hide.
    fn send_ahead(&self, _rel: &Path, _version: &FileVersion, _offset: u64, _len: usize) {}
    /// The bytes of the read sent ahead from `offset` of file `version`
    /// ([`DatasetSource::send_ahead`]), if one waits: a read of exactly those takes it.
    fn sent_ahead(&self, _rel: &Path, _version: &FileVersion, _offset: u64) -> Option<usize> {
        None
    }
    /// `statvfs` of the filesystem holding the source.
    fn statfs(&self) -> SourceResult<FsStats>;
    /// Bytes of memory the source keeps of the dataset's names beside the node table (an
    /// object store's listing); 0 for a directory.
    fn memory(&self) -> u64 {
        0
    }
    /// Threads the scan lists directories on, if not one per CPU: a source whose listings
    /// wait on a network's latency (an object store) keeps many in flight.
    fn scan_threads(&self) -> Option<usize> {
        None
    }
}

/// A directory on a local or kernel-mounted filesystem, every path resolved beneath a
/// descriptor of its root ([`Beneath`]).
#[derive(Debug)]
pub struct LocalSource {
    root: PathBuf,
    beneath: Beneath,
    drop_pages: bool,
    /// Reads use `O_DIRECT` (with `drop_pages`, until the filesystem refuses it).
    direct: AtomicBool,
    /// The rings small files are read together through ([`ring`]).
    rings: ring::Rings,
}

/// The flags every open of a file for its bytes carries: never block (a FIFO swapped in, a
/// lease held by its owner), never become the daemon's terminal.
fn file_flags() -> OFlags {
    OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY
}

impl LocalSource {
    /// A source rooted at `root` (absolute and canonical). With `drop_pages`, reads leave
    /// nothing in the source's page cache: they use `O_DIRECT` where the filesystem takes it
    /// and the buffer is page aligned, else they drop the pages they brought in.
    pub fn new(root: PathBuf, drop_pages: bool) -> io::Result<Self> {
        Ok(LocalSource {
            beneath: Beneath::open(&root)?,
            root,
            drop_pages,
            direct: AtomicBool::new(drop_pages),
            rings: ring::Rings::default(),
        })
    }

    /// True while reads go around the page cache with `O_DIRECT`.
    pub fn direct(&self) -> bool {
        self.direct.load(Ordering::Relaxed)
    }

    /// Opens `rel` with `flags`, and `O_NOATIME` where the kernel allows it (the file's owner
    /// or CAP_FOWNER), so that reading a dataset does not write to its disk.
    fn open_noatime(&self, rel: &Path, flags: OFlags) -> io::Result<std::os::fd::OwnedFd> {
        if flags.contains(OFlags::PATH) {
            // openat2 takes no other flag beside O_PATH (and an O_PATH open reads nothing).
            return self.beneath.open_at(rel, flags);
        }
        match self.beneath.open_at(rel, flags | OFlags::NOATIME) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => self.beneath.open_at(rel, flags),
            other => other,
        }
    }

    /// Opens regular file `rel` with `flags` (see [`LocalSource::open_noatime`]) and checks
    /// that it is one.
    fn open_regular(&self, rel: &Path, flags: OFlags) -> SourceResult<(File, SourceMeta)> {
        let fd = self.open_noatime(rel, flags)?;
        let meta = stat_fd(&fd)?;
        let file = File::from(fd);
        if meta.attr.kind != Kind::File {
            return Err(SourceError::Changed);
        }
        Ok((file, meta))
    }

    /// Reads `buf.len()` bytes at `offset` of file `rel` (checked to be `version`), or up to
    /// its end: through the source's page cache if it holds every page of the range already
    /// (no I/O, and no page brought in), else with `O_DIRECT`, which reads around the page
    /// cache but never from it: a shard the page cache held was read from the disk again at a
    /// fraction of the speed a reader of the source gets. `buf` and `offset` are page aligned.
    fn read_resident_or_direct(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(File, usize)> {
        let (file, meta) = self.open_regular(rel, file_flags())?;
        if meta.version != *version {
            return Err(SourceError::Changed);
        }
        let len = (buf.len() as u64).min(version.size.saturating_sub(offset));
        let direct = direct_unless_resident(&file, offset, len)?;
        let done = read_at_most(&file, offset, buf, direct)?;
        Ok((file, done))
    }

    /// Opens file `rel` with `flags`, checks that it is still `version`, and reads
    /// `buf.len()` bytes at `offset` or up to the end of the file. With `O_DIRECT`, `buf`
    /// must be page aligned and whole pages at a page-aligned offset, and a read that ends
    /// off a page boundary ended at the end of the file.
    fn read_range(
        &self,
        rel: &Path,
        flags: OFlags,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(File, usize)> {
        let (file, meta) = self.open_regular(rel, flags)?;
        if meta.version != *version {
            return Err(SourceError::Changed);
        }
        let done = read_at_most(&file, offset, buf, flags.contains(OFlags::DIRECT))?;
        Ok((file, done))
    }
}

/// Turns `file` to `O_DIRECT` unless the page cache holds bytes `offset..offset + len` of it
/// whole (then reading them brings nothing in); returns true if it did.
fn direct_unless_resident(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    if resident(file, offset, len) {
        return Ok(false);
    }
    let flags = rustix::fs::fcntl_getfl(file)? | OFlags::DIRECT;
    rustix::fs::fcntl_setfl(file, flags)?;
    Ok(true)
}

/// True if the page cache holds every page of bytes `offset..offset + len` of `file`
/// (`cachestat`, Linux 6.5; false where the kernel lacks it). Asking brings nothing in.
fn resident(file: &File, offset: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let pages = (offset + len).div_ceil(ALIGN as u64) - offset / ALIGN as u64;
    cached_pages(file, offset, len).is_some_and(|n| n >= pages)
}

/// How many pages of bytes `offset..offset + len` of `file` the page cache holds
/// (`cachestat`, Linux 6.5; None where the kernel lacks it). Asking brings nothing in.
pub fn cached_pages(file: &File, offset: u64, len: u64) -> Option<u64> {
    /// `struct cachestat_range` and `struct cachestat` (linux/mman.h).
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    /// The system call's number on x86_64 and aarch64 (and every architecture since 6.5).
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: offset, len };
    let mut stat = Stat::default();
    // SAFETY: `range` and `stat` are live, properly laid out structs for the call's length;
    // the kernel reads the first and writes the second, nothing else.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    (rc == 0).then_some(stat.nr_cache)
}

/// True if the page cache holds every page of the first `len` bytes of an open source file
/// ([`SourceFile::local`]); an `O_PATH` descriptor, which `cachestat` does not take, is opened
/// again for reading through its `/proc/self/fd` link. Asking brings nothing in.
pub fn resident_open_file(file: &File, len: u64) -> bool {
    if resident(file, 0, len) {
        return true;
    }
    // SAFETY: F_GETFL reads the descriptor's flags and touches no memory.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_PATH != 0 && reopened(file).is_ok_and(|f| resident(&f, 0, len))
}

/// `file` opened again for reading through its `/proc/self/fd` link, which names the very file
/// it pins (even one since removed): an `O_PATH` descriptor reads nothing itself.
fn reopened(file: &File) -> io::Result<File> {
    open_for_read(Path::new(&format!("/proc/self/fd/{}", file.as_raw_fd())))
}

/// Reads into `buf` at `offset` of a file from [`DatasetSource::open_file`], until `buf` is
/// full or the file ends. An `O_PATH` descriptor is opened again for reading through its
/// `/proc/self/fd` link, which names the very file it pins (even one since removed).
pub fn read_open_file(file: &File, offset: u64, buf: &mut [u8]) -> SourceResult<usize> {
    match read_at_most(file, offset, buf, false) {
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => {
            Ok(read_at_most(&reopened(file)?, offset, buf, false)?)
        }
        other => Ok(other?),
    }
}

/// Reads into `buf` at `offset` of `file` until it is full or the file ends. With `direct`,
/// a short read off a page boundary is the end of the file.
pub fn read_at_most(file: &File, offset: u64, buf: &mut [u8], direct: bool) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() && (!direct || done.is_multiple_of(ALIGN)) {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

impl DatasetSource for LocalSource {
    fn root(&self) -> &Path {
        &self.root
    }

    fn metadata(&self, rel: &Path, who: &Creds) -> SourceResult<SourceMeta> {
        as_user(who, || stat_fd(&self.beneath.open_at(rel, OFlags::PATH)?))
    }

    fn open_dir(&self, rel: &Path, who: &Creds) -> SourceResult<Listing> {
        let dir = as_user(who, || {
            self.beneath
                .open_at(rel, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NONBLOCK)
        })?;
        let meta = stat_fd(&dir)?;
        Ok(Listing {
            entries: Entries::Open(dir),
            meta,
            names: Vec::new(),
        })
    }

    fn read_link(&self, rel: &Path) -> SourceResult<PathBuf> {
        let fd = self.beneath.open_at(rel, OFlags::PATH)?;
        let target = rustix::fs::readlinkat(&fd, "", Vec::new())?;
        Ok(PathBuf::from(OsString::from_vec(target.into_bytes())))
    }

    fn open_file(&self, rel: &Path, who: &Creds) -> SourceResult<(SourceFile, SourceMeta)> {
        let (file, meta) = if who.is_daemon() {
            // Nothing to check for root: an O_PATH descriptor pins the file (for reads of a
            // file replaced while open) at a fraction of a real open's cost, on the path of
            // every hit.
            self.open_regular(rel, OFlags::PATH)?
        } else {
            as_user(who, || self.open_regular(rel, file_flags()))?
        };
        Ok((SourceFile::Local(file), meta))
    }

    fn first_unreadable(
        &self,
        files: &mut dyn Iterator<Item = PathBuf>,
        who: &Creds,
    ) -> SourceResult<Option<usize>> {
        // One switch of credentials for the whole list, and one open per directory: a
        // directory the user may not search fails its open, and every file in it is "no".
        // A hint names ImageNet's 1.28 M files in 1,000 directories: 1,000 opens and one
        // faccessat a file.
        const MAX_DIRS: usize = 4096; // descriptors held at once, far below RLIMIT_NOFILE
        as_user(who, || {
            let mut dirs: std::collections::HashMap<PathBuf, Option<std::os::fd::OwnedFd>> =
                Default::default();
            for (i, rel) in files.enumerate() {
                let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
                    return Ok(Some(i));
                };
                if dirs.len() >= MAX_DIRS && !dirs.contains_key(parent) {
                    dirs.clear();
                }
                let dir = dirs.entry(parent.to_path_buf()).or_insert_with(|| {
                    self.beneath
                        .open_at(parent, OFlags::PATH | OFlags::DIRECTORY)
                        .ok()
                });
                let ok = dir.as_ref().is_some_and(|dir| {
                    rustix::fs::accessat(
                        dir,
                        name,
                        rustix::fs::Access::READ_OK,
                        AtFlags::EACCESS | AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .is_ok()
                });
                if !ok {
                    return Ok(Some(i));
                }
            }
            Ok(None)
        })
    }

    fn acl(&self, rel: &Path, name: &str) -> SourceResult<Option<Vec<u8>>> {
        // Only files and directories carry ACLs; opening anything else could block or act.
        let kind = stat_fd(&self.beneath.open_at(rel, OFlags::PATH)?)?
            .attr
            .kind;
        let flags = match kind {
            Kind::File => file_flags(),
            Kind::Dir => OFlags::RDONLY | OFlags::DIRECTORY,
            _ => return Ok(None),
        };
        let fd = self.open_noatime(rel, flags)?;
        let mut value = Vec::with_capacity(256);
        loop {
            value.clear();
            match rustix::fs::fgetxattr(&fd, name, rustix::buffer::spare_capacity(&mut value)) {
                Ok(_) => return Ok(Some(value)),
                Err(rustix::io::Errno::NODATA) | Err(rustix::io::Errno::NOTSUP) => {
                    return Ok(None);
                }
                // The value grew between the size and the read: ask again, larger.
                Err(rustix::io::Errno::RANGE) if value.capacity() < XATTR_SIZE_MAX => {
                    value.reserve(value.capacity() * 4);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn read_block(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<usize> {
        let aligned = (buf.as_ptr() as usize).is_multiple_of(ALIGN)
            && buf.len().is_multiple_of(ALIGN)
            && offset.is_multiple_of(ALIGN as u64);
        if aligned && self.direct() {
            match self.read_resident_or_direct(rel, version, offset, buf) {
                Err(e) if e.errno() == libc::EINVAL => {
                    if self.direct.swap(false, Ordering::Relaxed) {
                        tracing::info!(
                            "{}: the filesystem refuses O_DIRECT; reading through its page cache",
                            self.root.display()
                        );
                    }
                }
                other => return other.map(|(_, done)| done),
            }
        }
        let (file, done) = self.read_range(rel, file_flags(), version, offset, buf)?;
        if self.drop_pages && done > 0 {
            // SAFETY: `file` is an open descriptor for the duration of the call; fadvise only
            // gives the kernel advice about its page cache and touches no memory of ours.
            unsafe {
                libc::posix_fadvise(
                    file.as_raw_fd(),
                    offset as libc::off_t,
                    done as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                );
            }
        }
        Ok(done)
    }

    fn read_small(&self, reads: &mut [SmallRead<'_>]) {
        if self.reads_together() {
            for batch in reads.chunks_mut(ring::BATCH_MAX) {
                self.rings.read(&self.beneath, batch);
            }
        }
        for read in reads.iter_mut().filter(|r| r.result.is_none()) {
            read.result = Some(self.read_block(read.rel, read.version, 0, read.buf));
        }
    }

    fn reads_together(&self) -> bool {
        // Together only where one by one would read around the page cache too (`O_DIRECT`
        // for what it does not hold): the batch makes the same choice for each file.
        self.direct() && self.rings.usable() && self.beneath.openat2_root().is_some()
    }

    fn statfs(&self) -> SourceResult<FsStats> {
        let st = rustix::fs::fstatvfs(self.beneath.root())?;
        Ok(FsStats {
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            bsize: st.f_bsize as u32,
            namelen: st.f_namemax as u32,
            frsize: st.f_frsize as u32,
        })
    }
}

/// The kernel's limit on an extended attribute's value.
const XATTR_SIZE_MAX: usize = 64 << 10;

/// Opens a file for reading without updating its access time where the kernel allows it
/// (`O_NOATIME` needs the file's owner or CAP_FOWNER), so that reading a dataset does not
/// write to the disk that holds it.
pub fn open_for_read(path: &Path) -> io::Result<File> {
    let open = |flags| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)
    };
    match open(libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(0),
        other => other,
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nsecs = nsecs.clamp(0, 999_999_999) as u32;
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::new(secs as u64, nsecs)
    } else {
        SystemTime::UNIX_EPOCH - Duration::new(secs.unsigned_abs(), 0) + Duration::new(0, nsecs)
    }
}

/// What `statx` says of an open descriptor (an `O_PATH` one included).
pub fn stat_fd(fd: impl AsFd) -> SourceResult<SourceMeta> {
    let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS)?;
    Ok(meta_from_statx(&st))
}

/// What `statx` says of entry `name` of open directory `dir`, not following a symlink.
fn stat_at(dir: impl AsFd, name: &std::ffi::CStr) -> SourceResult<SourceMeta> {
    let st = rustix::fs::statx(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )?;
    Ok(meta_from_statx(&st))
}

/// Attributes and version from a `statx`.
pub fn meta_from_statx(st: &Statx) -> SourceMeta {
    let t = |ts: &rustix::fs::StatxTimestamp| time(ts.tv_sec, ts.tv_nsec as i64);
    let n = |ts: &rustix::fs::StatxTimestamp| nanos(ts.tv_sec, ts.tv_nsec as i64);
    let mode = u32::from(st.stx_mode);
    SourceMeta {
        attr: Attr {
            ino: 0,
            size: st.stx_size,
            blocks: st.stx_blocks,
            atime: t(&st.stx_atime),
            mtime: t(&st.stx_mtime),
            ctime: t(&st.stx_ctime),
            kind: Kind::from_mode(mode),
            perm: (mode & 0o7777) as u16,
            nlink: st.stx_nlink,
            uid: st.stx_uid,
            gid: st.stx_gid,
            rdev: libc::makedev(st.stx_rdev_major, st.stx_rdev_minor) as u32,
            blksize: st.stx_blksize,
        },
        version: FileVersion {
            dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
            ino: st.stx_ino,
            size: st.stx_size,
            mtime_ns: n(&st.stx_mtime),
            ctime_ns: n(&st.stx_ctime),
        },
    }
}

fn nanos(secs: i64, nsecs: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nsecs)
}

/// A source that fails or slows down reads on request: for tests, and for `--read-delay`
/// (network-like latency in benchmarks).
#[derive(Debug)]
pub struct FaultySource<S> {
    inner: S,
    /// Every read of a path containing this string fails with EIO.
    pub fail_paths_containing: parking_lot::Mutex<Option<String>>,
    /// Every read of a path containing this string panics (a bug in a source).
    pub panic_paths_containing: parking_lot::Mutex<Option<String>>,
    /// Added to every `read_block`.
    pub read_delay: parking_lot::Mutex<Duration>,
    /// Between the first block of a run read at once and the next: a body that arrives slowly.
    pub run_pause: parking_lot::Mutex<Duration>,
    /// Runs sent ahead, `(path, offset, bytes)`, kept here instead of by the inner source
    /// while this is `Some` (as an object store keeps its GETs): a read of one takes it.
    pub sent: parking_lot::Mutex<Option<Vec<(PathBuf, u64, usize)>>>,
    reads: AtomicU64,
}

impl<S: DatasetSource> FaultySource<S> {
    /// Wraps `inner` with no faults injected yet.
    pub fn new(inner: S) -> Self {
        FaultySource {
            inner,
            fail_paths_containing: parking_lot::Mutex::new(None),
            panic_paths_containing: parking_lot::Mutex::new(None),
            read_delay: parking_lot::Mutex::new(Duration::ZERO),
            run_pause: parking_lot::Mutex::new(Duration::ZERO),
            sent: parking_lot::Mutex::new(None),
            reads: AtomicU64::new(0),
        }
    }

    /// How many `read_block` calls reached this source.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

impl<S: DatasetSource> DatasetSource for FaultySource<S> {
    fn root(&self) -> &Path {
        self.inner.root()
    }
    fn metadata(&self, rel: &Path, who: &Creds) -> SourceResult<SourceMeta> {
        self.inner.metadata(rel, who)
    }
    fn open_dir(&self, rel: &Path, who: &Creds) -> SourceResult<Listing> {
        self.inner.open_dir(rel, who)
    }
    fn read_link(&self, rel: &Path) -> SourceResult<PathBuf> {
        self.inner.read_link(rel)
    }
    fn open_file(&self, rel: &Path, who: &Creds) -> SourceResult<(SourceFile, SourceMeta)> {
        self.inner.open_file(rel, who)
    }
    fn first_unreadable(
        &self,
        files: &mut dyn Iterator<Item = PathBuf>,
        who: &Creds,
    ) -> SourceResult<Option<usize>> {
        self.inner.first_unreadable(files, who)
    }
    fn acl(&self, rel: &Path, name: &str) -> SourceResult<Option<Vec<u8>>> {
        self.inner.acl(rel, name)
    }
    fn read_block(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<usize> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let delay = *self.read_delay.lock();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        if let Some(needle) = self.fail_paths_containing.lock().as_deref()
            && rel.to_string_lossy().contains(needle)
        {
            return Err(SourceError::Io(io::Error::from_raw_os_error(libc::EIO)));
        }
        let panics = self
            .panic_paths_containing
            .lock()
            .as_deref()
            .is_some_and(|needle| rel.to_string_lossy().contains(needle));
        if panics {
            panic!("injected panic reading {}", rel.display());
        }
        self.inner.read_block(rel, version, offset, buf)
    }
    fn read_blocks(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        blocks: &mut crate::block::RunBlocks,
        filled: &mut dyn FnMut(crate::block::Block),
    ) -> SourceResult<usize> {
        if let Some(sent) = self.sent.lock().as_mut() {
            sent.retain(|(p, o, _)| !(p == rel && *o == offset));
        }
        if blocks.len() != 1 {
            // One read however many blocks: as slow as one, and counted once.
            self.reads.fetch_add(1, Ordering::Relaxed);
            let delay = *self.read_delay.lock();
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
            let pause = *self.run_pause.lock();
            let mut first = true;
            let mut filled = |block| {
                filled(block);
                if std::mem::take(&mut first) {
                    std::thread::sleep(pause);
                }
            };
            return self
                .inner
                .read_blocks(rel, version, offset, blocks, &mut filled);
        }
        let mut block = blocks.next().expect("one block")?;
        let want = block.len();
        let n = self.read_block(rel, version, offset, &mut block.whole_mut()[..want])?;
        if n == want {
            filled(block);
        }
        Ok(n)
    }
    fn send_ahead(&self, rel: &Path, version: &FileVersion, offset: u64, len: usize) {
        match self.sent.lock().as_mut() {
            Some(sent) => sent.push((rel.to_path_buf(), offset, len)),
            None => self.inner.send_ahead(rel, version, offset, len),
        }
    }
    fn sent_ahead(&self, rel: &Path, version: &FileVersion, offset: u64) -> Option<usize> {
        match self.sent.lock().as_ref() {
            Some(sent) => (sent.iter())
                .find(|(p, o, _)| p == rel && *o == offset)
                .map(|s| s.2),
            None => self.inner.sent_ahead(rel, version, offset),
        }
    }
    fn statfs(&self) -> SourceResult<FsStats> {
        self.inner.statfs()
    }
    fn memory(&self) -> u64 {
        self.inner.memory()
    }
    fn scan_threads(&self) -> Option<usize> {
        self.inner.scan_threads()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ranges_and_stops_at_end_of_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
        let src = LocalSource::new(dir.path().to_path_buf(), true).unwrap();
        let v = src
            .metadata(Path::new("f"), &Creds::DAEMON)
            .unwrap()
            .version;
        let mut buf = [0u8; 4];
        assert_eq!(src.read_block(Path::new("f"), &v, 3, &mut buf).unwrap(), 4);
        assert_eq!(&buf, b"3456");
        assert_eq!(src.read_block(Path::new("f"), &v, 8, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"89");
        assert_eq!(src.read_block(Path::new("f"), &v, 20, &mut buf).unwrap(), 0);
        let err = src
            .read_block(Path::new("missing"), &v, 0, &mut buf)
            .unwrap_err();
        assert!(matches!(err, SourceError::NotFound), "{err}");
        std::fs::write(dir.path().join("f"), b"changed!").unwrap();
        let err = src.read_block(Path::new("f"), &v, 0, &mut buf).unwrap_err();
        assert!(matches!(err, SourceError::Changed), "{err}");
    }

    /// Pages of the file at `path` in the page cache.
    fn resident_pages(path: &Path) -> usize {
        let file = File::open(path).unwrap();
        // SAFETY: a private read-only mapping of a file nobody truncates during the test;
        // only its residency is asked, no byte of it is read.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let pages = map.len().div_ceil(4096);
        let mut vec = vec![0u8; pages];
        // SAFETY: `map` is a live mapping of `map.len()` bytes and `vec` has one byte per page.
        let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    fn drop_cached(path: &Path) {
        let file = File::open(path).unwrap();
        file.sync_all().unwrap(); // dirty pages cannot be dropped
        // SAFETY: advice about an open descriptor's page cache.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(resident_pages(path), 0);
    }

    /// Reads block `offset..offset + len` of `rel` into a fetch buffer, as the fetcher does.
    fn read_whole_pages(src: &LocalSource, rel: &str, offset: u64, len: usize) -> Vec<u8> {
        let v = src
            .metadata(Path::new(rel), &Creds::DAEMON)
            .unwrap()
            .version;
        let mut block = crate::block::Block::zeroed(len).unwrap();
        let n = src
            .read_block(Path::new(rel), &v, offset, block.whole_mut())
            .unwrap();
        block.whole_mut()[..n].to_vec()
    }

    #[test]
    fn reads_around_the_page_cache_and_keeps_no_page_of_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        std::fs::write(dir.path().join("pages"), &data[..8192]).unwrap();
        let src = LocalSource::new(dir.path().to_path_buf(), true).unwrap();
        for name in ["f", "pages"] {
            drop_cached(&dir.path().join(name));
        }
        assert_eq!(read_whole_pages(&src, "f", 0, 10_000), data);
        assert_eq!(read_whole_pages(&src, "f", 8192, 1808), &data[8192..]);
        assert_eq!(read_whole_pages(&src, "pages", 0, 8192), &data[..8192]);
        assert!(src.direct(), "ext4 takes O_DIRECT");
        assert_eq!(resident_pages(&dir.path().join("f")), 0);
        assert_eq!(resident_pages(&dir.path().join("pages")), 0);
        // A file the page cache holds is read from it, and keeps its pages.
        let f = File::open(dir.path().join("f")).unwrap();
        assert!(!resident(&f, 0, 10_000));
        std::fs::read(dir.path().join("f")).unwrap();
        assert!(resident(&f, 0, 10_000) && resident(&f, 8192, 1808));
        assert_eq!(read_whole_pages(&src, "f", 0, 10_000), data);
        assert_eq!(resident_pages(&dir.path().join("f")), 3);
    }

    #[test]
    fn falls_back_to_the_page_cache_where_o_direct_is_refused() {
        // ramfs has no O_DIRECT: open answers EINVAL.
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "ramfs", "ramfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(mounted.success(), "mounting ramfs (the tests run as root)");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let src = LocalSource::new(dir.path().to_path_buf(), true).unwrap();
        let got = read_whole_pages(&src, "f", 0, 10_000);
        let fell_back = !src.direct();
        let again = read_whole_pages(&src, "f", 4096, 5_904);
        // The source holds the root open: it must be gone before the ramfs can be unmounted.
        drop(src);
        let unmounted = std::process::Command::new("umount")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(unmounted.success(), "unmounting the test's ramfs");
        assert_eq!(got, data);
        // Every page of a ramfs file is in the page cache: it is read from there, and
        // O_DIRECT is never asked for (nor refused).
        assert!(!fell_back, "resident pages are read through the page cache");
        assert_eq!(again, &data[4096..]);
    }

    #[test]
    fn metadata_carries_size_and_version() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"abc").unwrap();
        let src = LocalSource::new(dir.path().to_path_buf(), false).unwrap();
        let meta = src.metadata(Path::new("f"), &Creds::DAEMON).unwrap();
        assert_eq!(meta.attr.size, 3);
        assert_eq!(meta.attr.kind, Kind::File);
        assert_eq!(meta.version.size, 3);
        let root = src.metadata(Path::new(""), &Creds::DAEMON).unwrap();
        assert_eq!(root.attr.kind, Kind::Dir);
    }

    #[test]
    fn faulty_source_fails_matching_paths_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("good"), b"x").unwrap();
        std::fs::write(dir.path().join("bad"), b"x").unwrap();
        let src = FaultySource::new(LocalSource::new(dir.path().to_path_buf(), false).unwrap());
        *src.fail_paths_containing.lock() = Some("bad".into());
        let mut buf = [0u8; 1];
        let good = src
            .metadata(Path::new("good"), &Creds::DAEMON)
            .unwrap()
            .version;
        let bad = src
            .metadata(Path::new("bad"), &Creds::DAEMON)
            .unwrap()
            .version;
        assert_eq!(
            src.read_block(Path::new("good"), &good, 0, &mut buf)
                .unwrap(),
            1
        );
        let err = src
            .read_block(Path::new("bad"), &bad, 0, &mut buf)
            .unwrap_err();
        assert_eq!(err.errno(), libc::EIO);
        assert_eq!(src.reads(), 2);
    }
}
