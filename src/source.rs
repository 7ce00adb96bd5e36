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
//! When coorfs manages the memory (`drop_pages`), bytes read from storage must not linger in
//! the source's page cache: that cache is LRU, and the memory belongs to coorfs's cache. A
//! read then uses `O_DIRECT` into the fetcher's page-aligned block ([`crate::fetch::Block`]):
//! the storage writes straight into the block, with no page-cache copy to allocate, charge to
//! the daemon's memory cgroup, copy out of and drop again. Measured in the setup of
//! `scripts/bench-frameworks.sh` (where every allocation of page cache meets the cgroup's
//! limit and reclaims), that took an epoch of the PyTorch pipeline from 6.8 s to 6.4 s.
//! Filesystems that refuse `O_DIRECT` (ramfs, some FUSE filesystems) answer EINVAL; the
//! source then reads through the page cache for the rest of the mount, and drops the pages
//! each read brought in (`posix_fadvise(DONTNEED)`).

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::fetch::ALIGN;
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
    /// Reads use `O_DIRECT` (with `drop_pages`, until the filesystem refuses it).
    direct: AtomicBool,
}

impl LocalSource {
    /// A source rooted at `root`. With `drop_pages`, reads leave nothing in the source's page
    /// cache: they use `O_DIRECT` where the filesystem takes it and the buffer is page
    /// aligned, else they drop the pages they brought in.
    pub fn new(root: PathBuf, drop_pages: bool) -> Self {
        LocalSource {
            root,
            drop_pages,
            direct: AtomicBool::new(drop_pages),
        }
    }

    /// True while reads go around the page cache with `O_DIRECT`.
    pub fn direct(&self) -> bool {
        self.direct.load(Ordering::Relaxed)
    }

    /// Opens the file at `path` with `flags` added, checks that it is still `version`, and
    /// reads `buf.len()` bytes at `offset` or up to the end of the file. With `O_DIRECT`,
    /// `buf` must be page aligned and whole pages at a page-aligned offset, and a read that
    /// ends off a page boundary ended at the end of the file.
    fn read_range(
        path: &Path,
        flags: i32,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<(File, usize)> {
        let file = open_with(path, flags)?;
        if meta_from_std(&file.metadata()?).version != *version {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        let direct = flags & libc::O_DIRECT != 0;
        let mut done = 0;
        while done < buf.len() && (!direct || done.is_multiple_of(ALIGN)) {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok((file, done))
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
        let path = self.full(rel);
        let aligned = (buf.as_ptr() as usize).is_multiple_of(ALIGN)
            && buf.len().is_multiple_of(ALIGN)
            && offset.is_multiple_of(ALIGN as u64);
        if aligned && self.direct() {
            match Self::read_range(&path, libc::O_DIRECT, version, offset, buf) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
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
        let (file, done) = Self::read_range(&path, 0, version, offset, buf)?;
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
    open_with(path, 0)
}

/// [`open_for_read`] with `flags` added.
fn open_with(path: &Path, flags: i32) -> io::Result<File> {
    let open = |flags| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)
    };
    match open(flags | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(flags),
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
        let v = src.metadata(Path::new(rel)).unwrap().version;
        let mut block = crate::fetch::Block::zeroed(len).unwrap();
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
        let src = LocalSource::new(dir.path().to_path_buf(), true);
        for name in ["f", "pages"] {
            drop_cached(&dir.path().join(name));
        }
        assert_eq!(read_whole_pages(&src, "f", 0, 10_000), data);
        assert_eq!(read_whole_pages(&src, "f", 8192, 1808), &data[8192..]);
        assert_eq!(read_whole_pages(&src, "pages", 0, 8192), &data[..8192]);
        assert!(src.direct(), "ext4 takes O_DIRECT");
        assert_eq!(resident_pages(&dir.path().join("f")), 0);
        assert_eq!(resident_pages(&dir.path().join("pages")), 0);
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
        let src = LocalSource::new(dir.path().to_path_buf(), true);
        let got = read_whole_pages(&src, "f", 0, 10_000);
        let fell_back = !src.direct();
        let again = read_whole_pages(&src, "f", 4096, 5_904);
        std::process::Command::new("umount")
            .arg(dir.path())
            .status()
            .unwrap();
        assert_eq!(got, data);
        assert!(fell_back, "the EINVAL must turn O_DIRECT off");
        assert_eq!(again, &data[4096..]);
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
