//! The dataset source: the directory that a mount mirrors.
//!
//! [`DatasetSource`] is the I/O boundary below the filesystem core. [`LocalSource`] reads a
//! local (or kernel-mounted network) directory; [`FaultySource`] wraps any source and injects
//! errors and delays for tests, the way mountpoint-s3's `failure_client` does.
//!
//! Paths are relative to the source root. A block read opens the file, reads the range and
//! closes it again: no descriptor outlives a read, so a FUSE handle carries no source state,
//! and the open costs a few microseconds against a block of up to a megabyte.
//!
//! When coorfs manages the memory (`drop_pages`), a read tells the kernel to drop the
//! source's pages it just read (`posix_fadvise(DONTNEED)`), so bytes from storage do not
//! linger in the source's page cache: that cache is LRU, and the memory belongs to coorfs's
//! cache. `O_DIRECT` would avoid the page cache altogether but needs aligned buffers and is
//! not supported by every filesystem a dataset may sit on (tmpfs, some FUSE and network
//! filesystems); the dropped pages cost one extra copy, not memory.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::namespace::{Attr, FileVersion, Kind, SourceMeta};

/// One entry of a source directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirItem {
    pub name: OsString,
    pub kind: Kind,
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

/// Read access to a dataset directory. Paths are relative to its root.
pub trait DatasetSource: Send + Sync + 'static {
    /// The root, for messages.
    fn root(&self) -> &Path;
    /// `lstat` of an entry.
    fn metadata(&self, rel: &Path) -> io::Result<SourceMeta>;
    /// The entries of a directory, without `.` and `..`, in the order the source lists them.
    fn read_dir(&self, rel: &Path) -> io::Result<Vec<DirItem>>;
    /// The target of a symbolic link.
    fn read_link(&self, rel: &Path) -> io::Result<PathBuf>;
    /// Reads into `buf` from `offset` of file `version`, until `buf` is full or the file
    /// ends. Returns the bytes read. Fails with ESTALE if the file at `rel` is no longer
    /// that version.
    fn read_block(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize>;
    /// `statvfs` of the filesystem holding the source.
    fn statfs(&self) -> io::Result<FsStats>;
}

/// A directory on a local or kernel-mounted filesystem.
#[derive(Debug)]
pub struct LocalSource {
    root: PathBuf,
    drop_pages: bool,
}

impl LocalSource {
    /// A source rooted at `root`. With `drop_pages`, every read drops the pages it brought
    /// into the source's page cache.
    pub fn new(root: PathBuf, drop_pages: bool) -> Self {
        LocalSource { root, drop_pages }
    }

    fn full(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }
}

impl DatasetSource for LocalSource {
    fn root(&self) -> &Path {
        &self.root
    }

    fn metadata(&self, rel: &Path) -> io::Result<SourceMeta> {
        std::fs::symlink_metadata(self.full(rel)).map(|m| meta_from_std(&m))
    }

    fn read_dir(&self, rel: &Path) -> io::Result<Vec<DirItem>> {
        let mut items = Vec::new();
        for entry in std::fs::read_dir(self.full(rel))? {
            let entry = entry?;
            let kind = kind_from_std(entry.file_type()?);
            items.push(DirItem {
                name: entry.file_name(),
                kind,
            });
        }
        Ok(items)
    }

    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        std::fs::read_link(self.full(rel))
    }

    fn read_block(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let file = open_for_read(&self.full(rel))?;
        if meta_from_std(&file.metadata()?).version != *version {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
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

    fn statfs(&self) -> io::Result<FsStats> {
        let path = std::ffi::CString::new(self.root.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `statvfs` is plain old data; zeroed is a valid value for it.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is a NUL-terminated string and `st` a valid out-pointer.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
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

/// Opens a file for reading without updating its access time where the kernel allows it
/// (`O_NOATIME` needs the file's owner or CAP_FOWNER), so that reading a dataset does not
/// write to the disk that holds it.
pub fn open_for_read(path: &Path) -> io::Result<File> {
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(path)
    {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => File::open(path),
        other => other,
    }
}

/// The kind of a `std` file type.
pub fn kind_from_std(t: std::fs::FileType) -> Kind {
    if t.is_dir() {
        Kind::Dir
    } else if t.is_symlink() {
        Kind::Symlink
    } else if t.is_fifo() {
        Kind::Fifo
    } else if t.is_socket() {
        Kind::Socket
    } else if t.is_char_device() {
        Kind::CharDevice
    } else if t.is_block_device() {
        Kind::BlockDevice
    } else {
        Kind::File
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

/// Attributes and version from a `std` metadata (of an `lstat`).
pub fn meta_from_std(m: &std::fs::Metadata) -> SourceMeta {
    SourceMeta {
        attr: Attr {
            ino: 0,
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            kind: kind_from_std(m.file_type()),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: m.blksize() as u32,
        },
        version: FileVersion {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec()),
        },
    }
}

/// A source that fails or slows down reads on request: for tests, and for `--read-delay`
/// (network-like latency in benchmarks).
#[derive(Debug)]
pub struct FaultySource<S> {
    inner: S,
    /// Every read of a path containing this string fails with EIO.
    pub fail_paths_containing: parking_lot::Mutex<Option<String>>,
    /// Added to every `read_block`.
    pub read_delay: parking_lot::Mutex<Duration>,
    reads: AtomicU64,
}

impl<S: DatasetSource> FaultySource<S> {
    /// Wraps `inner` with no faults injected yet.
    pub fn new(inner: S) -> Self {
        FaultySource {
            inner,
            fail_paths_containing: parking_lot::Mutex::new(None),
            read_delay: parking_lot::Mutex::new(Duration::ZERO),
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
    fn metadata(&self, rel: &Path) -> io::Result<SourceMeta> {
        self.inner.metadata(rel)
    }
    fn read_dir(&self, rel: &Path) -> io::Result<Vec<DirItem>> {
        self.inner.read_dir(rel)
    }
    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        self.inner.read_link(rel)
    }
    fn read_block(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let delay = *self.read_delay.lock();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        if let Some(needle) = self.fail_paths_containing.lock().as_deref()
            && rel.to_string_lossy().contains(needle)
        {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.read_block(rel, version, offset, buf)
    }
    fn statfs(&self) -> io::Result<FsStats> {
        self.inner.statfs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ranges_and_stops_at_end_of_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
        let src = LocalSource::new(dir.path().to_path_buf(), true);
        let v = src.metadata(Path::new("f")).unwrap().version;
        let mut buf = [0u8; 4];
        assert_eq!(src.read_block(Path::new("f"), &v, 3, &mut buf).unwrap(), 4);
        assert_eq!(&buf, b"3456");
        assert_eq!(src.read_block(Path::new("f"), &v, 8, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"89");
        assert_eq!(src.read_block(Path::new("f"), &v, 20, &mut buf).unwrap(), 0);
        let err = src
            .read_block(Path::new("missing"), &v, 0, &mut buf)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        std::fs::write(dir.path().join("f"), b"changed!").unwrap();
        let err = src.read_block(Path::new("f"), &v, 0, &mut buf).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESTALE));
    }

    #[test]
    fn metadata_carries_size_and_version() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"abc").unwrap();
        let src = LocalSource::new(dir.path().to_path_buf(), false);
        let meta = src.metadata(Path::new("f")).unwrap();
        assert_eq!(meta.attr.size, 3);
        assert_eq!(meta.attr.kind, Kind::File);
        assert_eq!(meta.version.size, 3);
        let root = src.metadata(Path::new("")).unwrap();
        assert_eq!(root.attr.kind, Kind::Dir);
    }

    #[test]
    fn faulty_source_fails_matching_paths_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("good"), b"x").unwrap();
        std::fs::write(dir.path().join("bad"), b"x").unwrap();
        let src = FaultySource::new(LocalSource::new(dir.path().to_path_buf(), false));
        *src.fail_paths_containing.lock() = Some("bad".into());
        let mut buf = [0u8; 1];
        let good = src.metadata(Path::new("good")).unwrap().version;
        let bad = src.metadata(Path::new("bad")).unwrap().version;
        assert_eq!(
            src.read_block(Path::new("good"), &good, 0, &mut buf)
                .unwrap(),
            1
        );
        let err = src
            .read_block(Path::new("bad"), &bad, 0, &mut buf)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        assert_eq!(src.reads(), 2);
    }
}
