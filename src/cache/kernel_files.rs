//! Cached files the kernel can read by itself: one file per cached file version, on a tmpfs
//! that only the daemon can reach.
//!
//! FUSE passthrough maps a file of the mount 1:1 onto a backing file, and the kernel then
//! serves every read from that file's pages without a round trip to the daemon
//! (`crate::fs`'s `passthrough.rs`). The arena cannot be a backing file: it holds every file
//! at an offset of its own. So where passthrough may be used, MinIO keeps the blocks of files
//! over [`MIN_FILE`] in files of their own, each block at its offset in its file, and the
//! arena keeps the rest.
//!
//! - **Where:** a tmpfs made with `fsopen`/`fsmount` and never attached to any directory: no
//!   path reaches it, it lives as long as the daemon's descriptor of its root, and its size
//!   limit is the cache's budget (a flaw in the accounting would show as a refused block,
//!   never as more memory). Not one memfd per file: that holds a descriptor per cached file,
//!   and `RLIMIT_NOFILE` (20,000 on this machine, and not raisable in its containers) would
//!   cap the cache at 20,000 files.
//! - **Memory:** tmpfs pages, charged to the daemon's memory cgroup as the arena's are, and
//!   like them never reclaimed (there is nothing to write them back to but swap). The budget
//!   counts each block at whole pages plus [`FILE_OVERHEAD`] for the tmpfs inode and dentry
//!   and the kernel's registration of the file, charged per block so that it is counted
//!   whichever block of a file comes first.
//! - **Never rewritten:** a block is written once, before the cache's index publishes it,
//!   and never overwritten: a passthrough open may read the file at any time. When an
//!   elastic budget shrinks, the cache takes back the newest blocks of a file that was never
//!   opened whole ([`KernelFiles::cut`], then [`KernelFiles::punch`]: a shard of 1 GiB gives
//!   back the 32 MiB asked, not its every block), and drops a file that was opened whole
//!   ([`KernelFiles::remove`]): the file is unlinked, and its pages go back to the kernel
//!   once the last descriptor of it (an open file's backing, the kernel's registration) is
//!   closed; until then those opens read its bytes as before.
//! - **Small files stay in the arena:** a file of up to [`MIN_FILE`] would take a whole page
//!   and an inode for a few hundred bytes, and costs its open's round trip, not its bytes;
//!   such files are served from the kernel's page cache as before (`crate::fs`'s `open.rs`).
//!
//! The daemon's own reads of these blocks (opens that cannot use passthrough, peers) map the
//! block's pages read-only ([`KernelFiles::view`]): no copy, no fault a page.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use rustix::fs::{Mode, OFlags};
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags};

use crate::namespace::FileVersion;

/// Files of up to this size stay in the arena (see the module header). It is also the size up
/// to which a miss is read through the kernel's page cache (`BUFFERED_MISS_MAX`).
pub const MIN_FILE: u64 = 64 << 10;

/// Memory of one tmpfs file beyond its pages, as the budget counts it: its inode (shmem's,
/// about 0.8 KiB) and dentry (0.2 KiB), and the kernel's registration of it as a backing
/// file, kept while the daemon lives (a `struct file` and its record, about 0.3 KiB), rounded
/// up.
pub const FILE_OVERHEAD: u64 = 1536;

const PAGE: u64 = 4096;

/// One cached file version's file.
#[derive(Debug)]
struct KernelFile {
    /// Its name on the tmpfs.
    name: String,
    /// Bytes of it published in the cache's index.
    stored: AtomicU64,
    /// It was opened whole for the kernel ([`KernelFiles::open_whole`]): a passthrough open
    /// may read any byte of it, so no block of it is ever taken back alone.
    opened_whole: AtomicBool,
}

/// The tmpfs and its files.
#[derive(Debug)]
pub struct KernelFiles {
    root: OwnedFd,
    files: Mutex<HashMap<FileVersion, Arc<KernelFile>>>,
    next: AtomicU64,
    /// New blocks may go here (false once passthrough turned out unavailable: they go to the
    /// arena, and what is here already is still served).
    taking: AtomicBool,
    /// A write failed and was said once in the log.
    warned: AtomicBool,
}

/// Pages of the cached files: huge ones where a file covers them whole, or small ones only
/// ([`pages_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pages {
    Huge,
    Small,
}

/// The pages for the cached files of a mount of `source`. Huge pages make a cached file read
/// fast later: the kernel copies a huge folio at a time, as out of ext4's large folios (a hot
/// 1 GiB file by passthrough: 0.13-0.15 s with small pages, 0.05 s with huge ones, 0.056 s
/// native). The price is paid at the miss: a block written into a fresh huge folio zeroes
/// the rest of it first, and a fresh huge folio is often memory that the machine's host took
/// back (a VM that reports free memory does so in blocks of 2 MiB), faulted in again at its
/// first touch; small pages come from memory freed moments ago. From a local disk the price
/// is small beside what it buys. From an object store a miss costs the network's CPU too, on
/// CPUs the readers want, and misses decide an epoch there, where a hit's copy is a small part
/// of it: an epoch of shards from S3 in a pod of 384 MiB took 1.22-1.36 s and 1.37-1.63
/// CPU-seconds with huge pages, 1.09-1.18 s and 1.11-1.32 with small ones, the later epochs
/// no slower; 512 MiB read cold from S3 cost 1.2-3.7 CPU-seconds a GiB with huge pages (the
/// dear runs those after another reader had freed memory), 1.4-1.9 with small ones
/// (docs/BENCHMARKS.md, "What a file and a byte cost"). So huge pages for a directory, small
/// ones for an object store.
pub fn pages_for(source: &std::path::Path) -> Pages {
    if crate::source::object::ObjectUrl::is_url(source) {
        Pages::Small
    } else {
        Pages::Huge
    }
}

/// A private tmpfs of `capacity` bytes in `pages`, its root held by the returned descriptor.
/// Fails without `CAP_SYS_ADMIN`, or on a kernel without the mount API (before 5.2).
pub fn tmpfs(capacity: u64, pages: Pages) -> io::Result<OwnedFd> {
    let fs = rustix::mount::fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)?;
    let size = capacity.div_ceil(PAGE).max(1) * PAGE;
    rustix::mount::fsconfig_set_string(&fs, "size", size.to_string())?;
    rustix::mount::fsconfig_set_string(&fs, "mode", "0700")?;
    // Huge pages where a file covers them whole (no page beyond a file's size). A kernel
    // without shmem THP refuses the option: none then.
    let huge = match pages {
        Pages::Huge => "within_size",
        Pages::Small => "never",
    };
    let _ = rustix::mount::fsconfig_set_string(&fs, "huge", huge);
    rustix::mount::fsconfig_create(&fs)?;
    let attrs = MountAttrFlags::MOUNT_ATTR_NOEXEC
        | MountAttrFlags::MOUNT_ATTR_NOSUID
        | MountAttrFlags::MOUNT_ATTR_NODEV;
    Ok(rustix::mount::fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        attrs,
    )?)
}

impl KernelFiles {
    /// A private tmpfs of `capacity` bytes in `pages`. Fails without `CAP_SYS_ADMIN`, or on
    /// a kernel without the mount API (before 5.2).
    pub fn new(capacity: u64, pages: Pages) -> io::Result<Self> {
        Ok(Self::on(tmpfs(capacity, pages)?))
    }

    /// The files on the tmpfs whose root is `root` (one from [`tmpfs`]), none known yet: a
    /// successor daemon then enters those its predecessor published ([`KernelFiles::restore`]).
    pub fn on(root: OwnedFd) -> Self {
        KernelFiles {
            root,
            files: Mutex::default(),
            next: AtomicU64::new(0),
            taking: AtomicBool::new(true),
            warned: AtomicBool::new(false),
        }
    }

    /// The number that names the file of `version`, if it has one.
    pub fn number_of(&self, version: &FileVersion) -> Option<u64> {
        self.files.lock().get(version)?.name.parse().ok()
    }

    /// `len` bytes of `version`, published by a previous daemon in its file numbered `number`,
    /// are in the cache's index again. False if that file is not on the tmpfs.
    pub fn restore(&self, version: &FileVersion, number: u64, len: u64) -> bool {
        let name = number.to_string();
        if rustix::fs::statat(
            &self.root,
            name.as_str(),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .is_err()
        {
            return false;
        }
        self.next.fetch_max(number + 1, Ordering::Relaxed);
        let mut files = self.files.lock();
        let file = files.entry(*version).or_insert_with(|| {
            Arc::new(KernelFile {
                name,
                stored: AtomicU64::new(0),
                // The previous daemon's passthrough opens of it may still be reading it.
                opened_whole: AtomicBool::new(true),
            })
        });
        file.stored.fetch_add(len, Ordering::Release);
        true
    }

    /// Unlinks every file on the tmpfs that no version names (a predecessor's files that did
    /// not make it into the index, or were dropped from it): their memory goes back.
    pub fn sweep(&self) -> usize {
        let named: std::collections::HashSet<String> =
            self.files.lock().values().map(|f| f.name.clone()).collect();
        let Ok(dir) = rustix::fs::openat(
            &self.root,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return 0;
        };
        let Ok(mut entries) = rustix::fs::Dir::read_from(&dir) else {
            return 0;
        };
        let mut swept = 0;
        while let Some(Ok(entry)) = entries.next() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." || named.contains(&name) {
                continue;
            }
            if rustix::fs::unlinkat(&self.root, name.as_str(), rustix::fs::AtFlags::empty()).is_ok()
            {
                swept += 1;
            }
        }
        swept
    }

    /// True if the blocks of a file of `size` bytes go here.
    pub fn takes(&self, size: u64) -> bool {
        size > MIN_FILE && self.taking.load(Ordering::Relaxed)
    }

    /// From now on new blocks go to the arena.
    pub fn stop_taking(&self) {
        self.taking.store(false, Ordering::Relaxed);
    }

    /// The memory a block of `len` bytes takes here: whole pages and the file's overhead.
    pub fn footprint(len: u64) -> u64 {
        len.div_ceil(PAGE) * PAGE + FILE_OVERHEAD
    }

    /// The file of `version`, made if it has none.
    fn file_of(&self, version: &FileVersion) -> Arc<KernelFile> {
        let mut files = self.files.lock();
        files
            .entry(*version)
            .or_insert_with(|| {
                Arc::new(KernelFile {
                    name: self.next.fetch_add(1, Ordering::Relaxed).to_string(),
                    stored: AtomicU64::new(0),
                    opened_whole: AtomicBool::new(false),
                })
            })
            .clone()
    }

    fn open(&self, name: &str, flags: OFlags) -> io::Result<OwnedFd> {
        let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        Ok(rustix::fs::openat(
            &self.root,
            name,
            flags,
            Mode::RUSR | Mode::WUSR,
        )?)
    }

    /// Writes a block of `version` at `offset`. Not yet served: see [`KernelFiles::published`].
    /// Returns the number that names the file.
    pub fn write(&self, version: &FileVersion, offset: u64, data: &[u8]) -> io::Result<u64> {
        let file = self.file_of(version);
        let number = file.name.parse().unwrap_or(0);
        let fd = self.open(&file.name, OFlags::WRONLY | OFlags::CREATE)?;
        let mut done = 0;
        while done < data.len() {
            match rustix::io::pwrite(&fd, &data[done..], offset + done as u64) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(number)
    }

    /// Says a failed write once in the log (the block goes to the arena instead).
    pub fn write_failed(&self, e: &io::Error) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "caching a block in a file the kernel can read: {e}; such blocks go to the arena, \
                 and their files are read through the daemon"
            );
        }
    }

    /// `len` bytes of `version` written here are now in the cache's index (or, with `len`
    /// negative, no longer).
    pub fn published(&self, version: &FileVersion, len: i64) {
        let file = self.file_of(version);
        if len >= 0 {
            file.stored.fetch_add(len as u64, Ordering::Release);
        } else {
            file.stored.fetch_sub(len.unsigned_abs(), Ordering::Release);
        }
    }

    /// `len` bytes of `version` at `offset` (a block's, so page-aligned), mapped read-only:
    /// the file's own pages, neither copied nor faulted in one by one. The block was written
    /// before it was published and is never rewritten, so the view holds its bytes for as long
    /// as it lives, the file's removal included; the cache punches no block out of a file
    /// while a view of it lives (its shrink lock, `BlockCache::get`).
    pub fn view(
        &self,
        version: &FileVersion,
        offset: u64,
        len: usize,
    ) -> io::Result<memmap2::Mmap> {
        let name = self.files.lock().get(version).map(|f| f.name.clone());
        let name = name.ok_or(io::ErrorKind::NotFound)?;
        let fd = self.open(&name, OFlags::RDONLY)?;
        // SAFETY: the range was written before the block was published, and the file is never
        // written to or truncated again (see the module header): the mapped bytes do not change
        // under the view, and no access reaches past the file's end.
        unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len.max(1))
                .populate()
                .map(&fd)
        }
    }

    /// Drops the file of `version`: no new open finds it, and its memory goes back to the
    /// kernel when the last descriptor of it is closed. True if there was one.
    pub fn remove(&self, version: &FileVersion) -> bool {
        let Some(file) = self.files.lock().remove(version) else {
            return false;
        };
        match rustix::fs::unlinkat(&self.root, file.name.as_str(), rustix::fs::AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => tracing::warn!("dropping a cached file: {e}"),
        }
        true
    }

    /// Takes `bytes` of `version`'s blocks out of what is published, before
    /// [`KernelFiles::punch`] gives their pages back: from then on the file is not whole, and
    /// no new passthrough open takes it. False, and nothing changes, if the file was ever
    /// opened whole: such an open may read those blocks at any time, and only the whole file
    /// may go ([`KernelFiles::remove`]).
    pub fn cut(&self, version: &FileVersion, bytes: u64) -> bool {
        let files = self.files.lock();
        let Some(file) = files.get(version) else {
            return false;
        };
        if file.opened_whole.load(Ordering::Relaxed) {
            return false;
        }
        file.stored.fetch_sub(bytes, Ordering::AcqRel);
        true
    }

    /// Gives back the pages of `version`'s blocks at `(offset, len)` (blocks cut from it,
    /// [`KernelFiles::cut`]): they read as zeros from now on. The caller makes sure nobody
    /// reads them (no view of them lives, and no open file has the file for its backing).
    pub fn punch(&self, version: &FileVersion, blocks: impl IntoIterator<Item = (u64, u64)>) {
        let name = self.files.lock().get(version).map(|f| f.name.clone());
        let Some(name) = name else { return };
        let how = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
        let punched = self.open(&name, OFlags::WRONLY).and_then(|fd| {
            for (offset, len) in blocks {
                rustix::fs::fallocate(&fd, how, offset, len.div_ceil(PAGE) * PAGE)?;
            }
            Ok(())
        });
        if let Err(e) = punched {
            tracing::warn!("giving a cached block's memory back: {e}");
        }
    }

    /// True if every byte of `version` is here.
    pub fn holds(&self, version: &FileVersion) -> bool {
        let files = self.files.lock();
        files
            .get(version)
            .is_some_and(|f| f.stored.load(Ordering::Acquire) >= version.size)
    }

    /// A read-only descriptor of the file of `version` if every byte of it is here: the
    /// backing file of a passthrough open.
    pub fn open_whole(&self, version: &FileVersion) -> Option<io::Result<OwnedFd>> {
        let name = {
            let files = self.files.lock();
            let file = files.get(version)?;
            if file.stored.load(Ordering::Acquire) < version.size {
                return None;
            }
            file.opened_whole.store(true, Ordering::Relaxed);
            file.name.clone()
        };
        Some(self.open(&name, OFlags::RDONLY))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn version(ino: u64, size: u64) -> FileVersion {
        FileVersion::of_test(ino, size)
    }

    /// Pages of `map` that are part of a huge folio, read from `/proc/self/pagemap` and
    /// `/proc/kpageflags` (None where they cannot be read: not root).
    fn huge_pages_in(map: &[u8]) -> Option<usize> {
        use std::io::{Read, Seek, SeekFrom};
        let mut pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
        let mut flags = std::fs::File::open("/proc/kpageflags").ok()?;
        let (mut huge, mut word) = (0, [0u8; 8]);
        for page in map.chunks(PAGE as usize) {
            let at = page.as_ptr() as u64 / PAGE * 8;
            pagemap.seek(SeekFrom::Start(at)).ok()?;
            pagemap.read_exact(&mut word).ok()?;
            let entry = u64::from_ne_bytes(word);
            let pfn = entry & ((1 << 55) - 1);
            // Not present, or a pfn hidden from a reader without CAP_SYS_ADMIN.
            if entry >> 63 == 0 || pfn == 0 {
                return None;
            }
            flags.seek(SeekFrom::Start(pfn * 8)).ok()?;
            flags.read_exact(&mut word).ok()?;
            // KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL.
            huge += usize::from(u64::from_ne_bytes(word) & (1 << 15 | 1 << 16) != 0);
        }
        Some(huge)
    }

    #[test]
    fn an_object_stores_files_are_in_small_pages_a_directorys_in_huge_ones() {
        assert_eq!(pages_for(Path::new("s3://bucket/train")), Pages::Small);
        assert_eq!(pages_for(Path::new("/data/train")), Pages::Huge);
        let mut seen = Vec::new();
        for pages in [Pages::Huge, Pages::Small] {
            let Ok(files) = KernelFiles::new(16 << 20, pages) else {
                return;
            };
            // 8 MiB written a MiB at a time, in order, as a part's blocks arrive.
            let v = version(3, 8 << 20);
            let block: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
            for at in 0..8u64 {
                files.write(&v, at << 20, &block).unwrap();
            }
            let view = files.view(&v, 0, 8 << 20).unwrap();
            assert!(view.chunks(1 << 20).all(|b| b == &block[..]));
            let Some(huge) = huge_pages_in(&view) else {
                return;
            };
            seen.push(huge);
        }
        // A kernel without shmem THP has none in either (the option is refused).
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
            .is_ok_and(|s| !s.contains("[deny]"));
        assert_eq!(seen[1], 0, "small pages only: {seen:?}");
        if thp {
            assert!(seen[0] > 0, "huge pages where a file covers them: {seen:?}");
        }
    }

    #[test]
    fn blocks_read_back_and_a_file_is_whole_only_once_every_byte_is_published() {
        let files = match KernelFiles::new(1 << 20, Pages::Huge) {
            Ok(f) => f,
            // Without CAP_SYS_ADMIN there is no private tmpfs: nothing to test here (the
            // cache then keeps every block in the arena, tested in mod.rs).
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => return,
            Err(e) => panic!("{e}"),
        };
        let v = version(7, 100_000);
        let first: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        let second = vec![9u8; 100_000 - 65536];
        files.write(&v, 0, &first).unwrap();
        files.published(&v, first.len() as i64);
        assert!(
            files.open_whole(&v).is_none(),
            "half a file is no backing file"
        );
        files.write(&v, 65536, &second).unwrap();
        files.published(&v, second.len() as i64);
        let fd = files.open_whole(&v).unwrap().unwrap();
        let mut whole = vec![0u8; 100_001];
        let n = rustix::io::pread(&fd, &mut whole, 0).unwrap();
        assert_eq!(n, 100_000);
        assert_eq!(&whole[..65536], &first[..]);
        assert_eq!(&whole[65536..n], &second[..]);
        // A block's view: its bytes, the file's end included.
        assert_eq!(
            &files.view(&v, 65536, second.len()).unwrap()[..],
            &second[..]
        );
        assert_eq!(&files.view(&v, 0, 65536).unwrap()[..], &first[..]);
        files.published(&v, -(second.len() as i64));
        assert!(
            files.open_whole(&v).is_none(),
            "a removed block makes a hole"
        );
        assert!(files.takes(MIN_FILE + 1) && !files.takes(MIN_FILE));
        files.stop_taking();
        assert!(!files.takes(MIN_FILE + 1));
    }

    #[test]
    fn a_cut_block_gives_its_pages_back_and_a_file_opened_whole_is_never_cut() {
        let Ok(files) = KernelFiles::new(1 << 20, Pages::Huge) else {
            return;
        };
        let (v, w) = (version(1, 3 * 65536), version(2, 65536));
        for block in 0..3u8 {
            let at = u64::from(block) * 65536;
            files.write(&v, at, &[block + 1; 65536]).unwrap();
        }
        files.write(&w, 0, &[9; 65536]).unwrap();
        files.published(&v, 3 * 65536);
        files.published(&w, 65536);
        let pages = |version: &FileVersion| {
            let name = files.files.lock()[version].name.clone();
            let st = rustix::fs::statat(&files.root, name.as_str(), rustix::fs::AtFlags::empty());
            st.unwrap().st_blocks as u64 * 512
        };
        assert_eq!(pages(&v), 3 * 65536);
        assert!(files.cut(&v, 65536));
        files.punch(&v, [(2 * 65536, 65536)]);
        assert_eq!(pages(&v), 2 * 65536, "the cut block's pages went back");
        assert!(!files.holds(&v) && files.open_whole(&v).is_none());
        assert_eq!(&files.view(&v, 65536, 65536).unwrap()[..], &[2; 65536][..]);
        // Opened whole once: a passthrough open may read any of it, so it is not cut.
        let _open = files.open_whole(&w).unwrap().unwrap();
        assert!(!files.cut(&w, 65536));
        assert!(files.holds(&w));
    }

    #[test]
    fn a_removed_file_is_gone_for_new_opens_and_whole_for_open_ones() {
        let Ok(files) = KernelFiles::new(1 << 20, Pages::Huge) else {
            return;
        };
        let v = version(3, 100_000);
        files.write(&v, 0, &[5u8; 100_000]).unwrap();
        files.published(&v, 100_000);
        let open = files.open_whole(&v).unwrap().unwrap();
        assert!(files.remove(&v));
        assert!(!files.remove(&v));
        assert!(files.open_whole(&v).is_none() && !files.holds(&v));
        let mut back = vec![0u8; 100_000];
        assert_eq!(rustix::io::pread(&open, &mut back, 0).unwrap(), 100_000);
        assert!(back.iter().all(|&b| b == 5));
        // Its name is free: the same version cached again is a new file.
        files.write(&v, 0, &[6u8; 100_000]).unwrap();
        files.published(&v, 100_000);
        let again = files.open_whole(&v).unwrap().unwrap();
        assert_eq!(rustix::io::pread(&again, &mut back, 0).unwrap(), 100_000);
        assert!(back.iter().all(|&b| b == 6));
    }

    #[test]
    fn the_tmpfs_holds_no_more_than_its_budget() {
        let Ok(files) = KernelFiles::new(128 << 10, Pages::Huge) else {
            return;
        };
        let v = version(1, 1 << 20);
        files.write(&v, 0, &[1u8; 128 << 10]).unwrap();
        let err = files.write(&v, 128 << 10, &[1u8; 4096]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    }
}
