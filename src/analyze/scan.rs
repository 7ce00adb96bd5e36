//! The scan of a dataset: every regular file's size, and a random sample of files to read.
//!
//! A million files is a million `stat`s. Directories are walked by a few threads that share
//! one stack of directories still to list, so a deep tree, a flat one and a slow network
//! filesystem all keep every thread busy. Each thread keeps its own sizes and sample and
//! they are merged at the end: nothing is locked per file.
//!
//! Regular files only, as the mount's own scan counts them: symlinks are not followed, and
//! FIFOs, sockets and devices are left out (the directory listing's type, no `stat`, tells
//! them apart). A dataset on a pseudo filesystem (proc, sysfs, ...) is refused before the
//! scan ([`pseudo_filesystem`]): its files say one size and read another.
//!
//! The sample is the `k` files with the smallest hash of (seed, relative path), a uniform
//! random sample that does not depend on the order in which the threads happen to find the
//! files, so a seed always picks the same files (for a given build of coorfs: the hash is
//! std's SipHash with fixed keys).

use std::collections::BinaryHeap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};

/// Threads that list and stat: the work waits on metadata I/O (cold disks, network
/// filesystems) more than on CPU, so more threads than this machine's 2 cores pay off.
pub const SCAN_THREADS: usize = 8;

/// Progress is reported every this many files per thread: often enough for a progress bar,
/// rare enough to cost nothing.
const PROGRESS_EVERY: u64 = 1024;

/// A file picked for reading.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SampledFile {
    /// Relative to the dataset's root.
    pub rel: PathBuf,
    /// Bytes.
    pub size: u64,
}

/// What the scan found.
#[derive(Clone, Debug, Default)]
pub struct Scan {
    /// The size of every regular file, bytes, ascending.
    pub sizes: Vec<u64>,
    /// Their sum, bytes.
    pub bytes: u64,
    /// A uniform random sample of the files, in random order.
    pub sample: Vec<SampledFile>,
    /// Directories that could not be listed and entries that could not be examined.
    pub errors: u64,
    /// The first of those, as "path: error".
    pub first_error: Option<String>,
}

/// What one thread found.
#[derive(Default)]
struct Found {
    sizes: Vec<u64>,
    /// Max-heap on the hash: the `k` smallest seen so far.
    sample: BinaryHeap<(u64, SampledFile)>,
    errors: u64,
    first_error: Option<String>,
}

impl Found {
    fn error(&mut self, path: &Path, e: std::io::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{}: {e}", path.display()));
        }
    }
}

/// Directories still to list, and how many threads are listing one (the walk is over when
/// the stack is empty and no thread can push more).
struct Queue {
    dirs: Vec<PathBuf>,
    busy: usize,
}

/// Scans `root` with `threads` threads, sampling `k` files with `seed`; `progress(files,
/// bytes)` is called now and then with running totals, from any of the threads.
pub fn scan(
    root: &Path,
    k: usize,
    seed: u64,
    threads: usize,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Scan {
    let queue = Mutex::new(Queue {
        dirs: vec![PathBuf::new()],
        busy: 0,
    });
    let wake = Condvar::new();
    let files = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let found: Vec<Found> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut found = Found::default();
                    let (mut n, mut b) = (0u64, 0u64);
                    while let Some(dir) = next_dir(&queue, &wake) {
                        list(
                            root, &dir, k, seed, &mut found, &mut n, &mut b, &queue, &wake,
                        );
                        if n >= PROGRESS_EVERY {
                            progress(
                                files.fetch_add(n, Ordering::Relaxed) + n,
                                bytes.fetch_add(b, Ordering::Relaxed) + b,
                            );
                            (n, b) = (0, 0);
                        }
                        queue.lock().busy -= 1;
                        wake.notify_all();
                    }
                    files.fetch_add(n, Ordering::Relaxed);
                    bytes.fetch_add(b, Ordering::Relaxed);
                    found
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    progress(files.into_inner(), bytes.into_inner());
    merge(found, k)
}

/// The next directory to list, or None when the walk is over.
fn next_dir(queue: &Mutex<Queue>, wake: &Condvar) -> Option<PathBuf> {
    let mut q = queue.lock();
    loop {
        if let Some(dir) = q.dirs.pop() {
            q.busy += 1;
            return Some(dir);
        }
        if q.busy == 0 {
            return None;
        }
        wake.wait(&mut q);
    }
}

#[allow(clippy::too_many_arguments)]
fn list(
    root: &Path,
    dir: &Path,
    k: usize,
    seed: u64,
    found: &mut Found,
    files: &mut u64,
    bytes: &mut u64,
    queue: &Mutex<Queue>,
    wake: &Condvar,
) {
    let full = root.join(dir);
    let entries = match std::fs::read_dir(&full) {
        Ok(entries) => entries,
        Err(e) => return found.error(&full, e),
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                found.error(&full, e);
                continue;
            }
        };
        let rel = dir.join(entry.file_name());
        // d_type from the directory listing: no stat for directories and symlinks.
        let kind = match entry.file_type() {
            Ok(kind) => kind,
            Err(e) => {
                found.error(&root.join(&rel), e);
                continue;
            }
        };
        if kind.is_dir() {
            queue.lock().dirs.push(rel);
            wake.notify_one();
        } else if kind.is_file() {
            let size = match entry.metadata() {
                // Replaced by something else since the listing.
                Ok(m) if !m.is_file() => continue,
                Ok(m) => m.len(),
                Err(e) => {
                    found.error(&root.join(&rel), e);
                    continue;
                }
            };
            found.sizes.push(size);
            *files += 1;
            *bytes += size;
            let h = sample_hash(seed, &rel);
            if found.sample.len() < k {
                found.sample.push((h, SampledFile { rel, size }));
            } else if found.sample.peek().is_some_and(|(top, _)| h < *top) {
                found.sample.pop();
                found.sample.push((h, SampledFile { rel, size }));
            }
        }
    }
}

/// Pseudo filesystems by their `statfs` magic (linux/magic.h): their files are made up by
/// the kernel as they are read, sizes say nothing (0 in /proc, 4096 in sysfs) and some read
/// on without end (/proc/self/pagemap).
const PSEUDO_FILESYSTEMS: &[(u32, &str)] = &[
    (0x0000_9fa0, "proc"),
    (0x6265_6572, "sysfs"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0x0027_e0eb, "cgroup"),
    (0x6367_7270, "cgroup2"),
    (0x0000_1cd1, "devpts"),
    (0x7363_6673, "securityfs"),
    (0xcafe_4a11, "bpf"),
    (0x6165_676c, "pstore"),
    (0xde5e_81e4, "efivarfs"),
    (0x6265_6570, "configfs"),
    (0xf97c_ff8c, "selinuxfs"),
    (0x4341_5d53, "smackfs"),
    (0x6573_5543, "fusectl"),
    (0x4249_4e4d, "binfmt_misc"),
    (0x1980_0202, "mqueue"),
    (0x6e73_6673, "nsfs"),
    (0x0765_5821, "resctrl"),
    (0x0000_9fa1, "openpromfs"),
];

/// The name of the pseudo filesystem `path` is on, if it is on one (and `statfs` answers).
pub fn pseudo_filesystem(path: &Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statfs` is plain old data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` a valid out-pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // f_type's C type differs between architectures; the magic numbers are 32 bits.
    let magic = st.f_type as u32;
    PSEUDO_FILESYSTEMS
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, name)| *name)
}

/// The hash that orders files for the sample.
fn sample_hash(seed: u64, rel: &Path) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    seed.hash(&mut h);
    rel.hash(&mut h);
    h.finish()
}

fn merge(found: Vec<Found>, k: usize) -> Scan {
    let mut scan = Scan::default();
    let mut sample = Vec::new();
    for f in found {
        scan.sizes.extend(f.sizes);
        sample.extend(f.sample.into_vec());
        scan.errors += f.errors;
        if scan.first_error.is_none() {
            scan.first_error = f.first_error;
        }
    }
    scan.sizes.sort_unstable();
    scan.bytes = scan.sizes.iter().sum();
    sample.sort();
    sample.truncate(k);
    scan.sample = sample.into_iter().map(|(_, f)| f).collect();
    scan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path, files: usize) -> u64 {
        let mut total = 0;
        for i in 0..files {
            let dir = root.join(format!("a{}/b{}", i % 3, i % 7));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("f{i}")), vec![0u8; i * 10]).unwrap();
            total += i as u64 * 10;
        }
        total
    }

    #[test]
    fn finds_every_regular_file_and_skips_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let total = tree(dir.path(), 300);
        std::os::unix::fs::symlink(dir.path().join("a0"), dir.path().join("link")).unwrap();
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        let calls = AtomicU64::new(0);
        let scan = scan(dir.path(), 50, 1, 4, &|_, _| {
            calls.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(scan.sizes.len(), 300);
        assert_eq!(scan.bytes, total);
        assert!(scan.sizes.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(scan.errors, 0);
        assert_eq!(scan.sample.len(), 50);
        assert!(calls.load(Ordering::Relaxed) >= 1);
        for f in &scan.sample {
            assert_eq!(
                std::fs::metadata(dir.path().join(&f.rel)).unwrap().len(),
                f.size
            );
        }
    }

    #[test]
    fn fifos_sockets_and_symlinks_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data"), [7u8; 100]).unwrap();
        let fifo =
            std::ffi::CString::new(dir.path().join("fifo").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let _socket = std::os::unix::net::UnixListener::bind(dir.path().join("socket")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("data"), dir.path().join("link")).unwrap();
        let scan = scan(dir.path(), 10, 0, 2, &|_, _| {});
        assert_eq!(scan.sizes, [100]);
        assert_eq!(scan.errors, 0);
        assert_eq!(scan.sample.len(), 1);
        assert_eq!(scan.sample[0].rel, Path::new("data"));
    }

    #[test]
    fn pseudo_filesystems_are_recognised() {
        assert_eq!(pseudo_filesystem(Path::new("/proc/self")), Some("proc"));
        if Path::new("/sys/kernel").is_dir() {
            assert_eq!(pseudo_filesystem(Path::new("/sys/kernel")), Some("sysfs"));
        }
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(pseudo_filesystem(dir.path()), None);
        assert_eq!(pseudo_filesystem(&dir.path().join("missing")), None);
    }

    #[test]
    fn the_sample_depends_on_the_seed_not_on_the_threads() {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path(), 200);
        let a = scan(dir.path(), 20, 7, 1, &|_, _| {}).sample;
        let b = scan(dir.path(), 20, 7, 8, &|_, _| {}).sample;
        let c = scan(dir.path(), 20, 8, 8, &|_, _| {}).sample;
        assert_eq!(a, b);
        assert_ne!(a, c);
        let all = scan(dir.path(), 1000, 7, 2, &|_, _| {}).sample;
        assert_eq!(all.len(), 200);
    }
}
