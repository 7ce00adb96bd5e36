//! Measuring how fast files come: random whole-file reads of sampled files, at several queue
//! depths, for a bounded time each.
//!
//! The queue depth is the number of threads reading at once, each one file at a time, whole,
//! the way a DataLoader's workers read (and coorfs's fetch threads). Files are taken from the
//! sample in its (random) order, continuing across depths, so that each depth reads files
//! the previous one did not, as long as the sample lasts.
//!
//! The storage path must bypass the page cache, or it measures memory: each file's pages are
//! dropped (`posix_fadvise(DONTNEED)`) before it is read and again after, so the analysis
//! leaves the page cache as it found it. Reads are buffered, like a training job's: the
//! kernel's readahead and its whole-page reads are part of what is measured. The hit path
//! reads files that a mount has cached, through the mount, and drops nothing.
//!
//! A file that cannot be opened or read is counted, remembered (not tried again) and
//! skipped: the measurement goes on with the others. So is anything that is not a regular
//! file by the time it is opened (a FIFO would block the open, a device could stream
//! forever): it is opened without blocking and without following a symlink, and checked.
//!
//! Every read is bounded, in bytes and in time. A file is read up to the size the scan
//! found, never further (a file in /proc says 0 and reads on without end), and the deadline
//! is checked between read calls, so a depth ends within one read call of its time however
//! large the files: a file cut off at the deadline adds the bytes it gave, and the fraction
//! of it that was read to the files per second.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

/// The queue depths measured: one reader, a few DataLoader workers, a busy node, and as
/// deep as coorfs's fetch threads go (`io_threads`).
pub const DEPTHS: [usize; 4] = [1, 4, 16, 64];

/// The best useful depth is the smallest whose throughput is at least this fraction of the
/// fastest depth's: deeper queues buy less than 10% more and cost threads, memory and
/// latency (and a job needs that many reads in flight to get it).
const USEFUL: f64 = 0.9;

/// Bytes per read call: a whole typical sample in one call, as a DataLoader reads.
const BUFFER: usize = 1 << 20;

/// Whether reads must bypass the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPath {
    /// Drop each file's pages before and after reading it: the storage itself.
    Storage,
    /// Read as it comes: a mount's cached files.
    Cached,
}

/// What one depth read.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DepthResult {
    /// Files read at once.
    pub depth: usize,
    /// Files read whole.
    pub files: u64,
    /// Bytes read: those files', and what the files cut off at the deadline gave.
    pub bytes: u64,
    /// Wall-clock seconds, until the last read in flight ended.
    pub seconds: f64,
    /// Files read whole, plus the fractions read of those cut off, per second.
    pub files_per_sec: f64,
    /// MiB (2^20 bytes) per second.
    pub mib_per_sec: f64,
}

/// Every depth's result and the files that could not be read.
#[derive(Clone, Debug, Default)]
pub struct Measurement {
    pub depths: Vec<DepthResult>,
    /// Distinct files that could not be opened or read.
    pub unreadable: u64,
    /// The first of them, as "path: error".
    pub first_error: Option<String>,
}

/// Reads `files` (each a path and the size the scan found, the most that is read of it) at
/// each of `depths` for `per_depth` each; `progress(elapsed)` is called about ten times a
/// second with the time spent so far.
pub fn measure(
    files: &[(PathBuf, u64)],
    depths: &[usize],
    per_depth: Duration,
    path: ReadPath,
    progress: &(dyn Fn(Duration) + Sync),
) -> Measurement {
    let readers = Readers {
        files,
        path,
        cursor: AtomicUsize::new(0),
        failed: files.iter().map(|_| AtomicBool::new(false)).collect(),
        unreadable: AtomicUsize::new(0),
        first_error: Mutex::new(None),
    };
    let started = Instant::now();
    let results = depths
        .iter()
        .map(|&depth| readers.at_depth(depth, per_depth, &|| progress(started.elapsed())))
        .collect();
    progress(started.elapsed());
    Measurement {
        depths: results,
        unreadable: readers.unreadable.into_inner() as u64,
        first_error: readers.first_error.into_inner(),
    }
}

/// The sampled files and what every depth's readers share of them: the next file to read,
/// and the files that failed (each is tried once, at whatever depth).
struct Readers<'a> {
    files: &'a [(PathBuf, u64)],
    path: ReadPath,
    cursor: AtomicUsize,
    failed: Vec<AtomicBool>,
    unreadable: AtomicUsize,
    first_error: Mutex<Option<String>>,
}

/// What one depth's readers read.
#[derive(Default)]
struct DepthCount {
    files: AtomicU64,
    bytes: AtomicU64,
}

impl Readers<'_> {
    /// `depth` readers at once for `per_depth`, calling `progress` while they read.
    fn at_depth(&self, depth: usize, per_depth: Duration, progress: &dyn Fn()) -> DepthResult {
        let read = DepthCount::default();
        let start = Instant::now();
        let deadline = start + per_depth;
        let cut_off: f64 = std::thread::scope(|s| {
            let workers: Vec<_> = (0..depth)
                .map(|_| s.spawn(|| self.read_until(deadline, &read)))
                .collect();
            while !workers.iter().all(|w| w.is_finished()) {
                progress();
                // Often enough to see the readers end soon after the deadline.
                let left = deadline.saturating_duration_since(Instant::now());
                std::thread::sleep(
                    left.clamp(Duration::from_millis(2), Duration::from_millis(100)),
                );
            }
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_default())
                .sum()
        });
        let seconds = start.elapsed().as_secs_f64();
        let (files, bytes) = (read.files.into_inner(), read.bytes.into_inner());
        DepthResult {
            depth,
            files,
            bytes,
            seconds,
            files_per_sec: (files as f64 + cut_off) / seconds,
            mib_per_sec: bytes as f64 / seconds / (1u64 << 20) as f64,
        }
    }

    /// One reader: reads the next file, whole, until `deadline`, counting in `read`. Returns
    /// the fractions of files cut off at the deadline.
    fn read_until(&self, deadline: Instant, read: &DepthCount) -> f64 {
        let files = self.files;
        let mut buf = vec![0u8; BUFFER];
        let mut cut_off = 0.0;
        // Every reader tries at least one file, however short the time.
        let mut tried = false;
        while (!tried || Instant::now() < deadline)
            && self.unreadable.load(Ordering::Relaxed) < files.len()
        {
            tried = true;
            let i = self.cursor.fetch_add(1, Ordering::Relaxed) % files.len();
            if self.failed[i].load(Ordering::Relaxed) {
                continue;
            }
            let (file, size) = &files[i];
            match read_file(file, *size, &mut buf, self.path, deadline) {
                Ok(Outcome::Whole(n)) => {
                    read.files.fetch_add(1, Ordering::Relaxed);
                    read.bytes.fetch_add(n, Ordering::Relaxed);
                }
                Ok(Outcome::CutOff(n)) => {
                    read.bytes.fetch_add(n, Ordering::Relaxed);
                    cut_off += n as f64 / *size as f64;
                }
                Err(e) => {
                    if !self.failed[i].swap(true, Ordering::Relaxed) {
                        self.unreadable.fetch_add(1, Ordering::Relaxed);
                        self.first_error
                            .lock()
                            .get_or_insert_with(|| format!("{}: {e}", file.display()));
                    }
                }
            }
        }
        cut_off
    }
}

/// How a file's read ended, with the bytes it gave.
enum Outcome {
    /// Read to its end, or to the size the scan found.
    Whole(u64),
    /// Stopped at the deadline.
    CutOff(u64),
}

/// Reads at most `size` bytes of `path` (a regular file), stopping between reads once
/// `deadline` has passed.
fn read_file(
    path: &Path,
    size: u64,
    buf: &mut [u8],
    how: ReadPath,
    deadline: Instant,
) -> std::io::Result<Outcome> {
    let mut file = open_regular(path)?;
    let fd = file.as_raw_fd();
    let drop_pages = || {
        if how == ReadPath::Storage {
            // SAFETY: `fd` stays open until `file` drops, after the last call; fadvise only
            // advises the kernel about its page cache and touches no memory of ours.
            unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    };
    drop_pages();
    let mut total = 0u64;
    let mut cut_off = false;
    while total < size {
        let want = (size - total).min(buf.len() as u64) as usize;
        match file.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if total < size && Instant::now() >= deadline {
            cut_off = true;
            break;
        }
    }
    drop_pages();
    Ok(if cut_off {
        Outcome::CutOff(total)
    } else {
        Outcome::Whole(total)
    })
}

/// Opens `path` for reading if it is a regular file: without following a symlink and
/// without blocking (a FIFO's open would wait for a writer), then checked, then set back to
/// blocking reads. With `O_NOATIME` where allowed, as coorfs's own source reads, so that
/// measuring leaves access times alone.
fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |flags| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)
    };
    let flags = libc::O_NONBLOCK | libc::O_NOFOLLOW;
    let file = match open(flags | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(flags),
        other => other,
    }?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    // SAFETY: fcntl on a descriptor `file` owns; F_GETFL/F_SETFL touch no memory of ours.
    unsafe {
        let fd = file.as_raw_fd();
        let status = libc::fcntl(fd, libc::F_GETFL);
        if status < 0 || libc::fcntl(fd, libc::F_SETFL, status & !libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(file)
}

/// The best useful depth: the smallest whose throughput is within 10% of the fastest's.
pub fn best_useful(depths: &[DepthResult]) -> Option<&DepthResult> {
    let fastest = depths.iter().map(|d| d.mib_per_sec).fold(0.0f64, f64::max);
    depths
        .iter()
        .filter(|d| (d.files > 0 || d.bytes > 0) && d.mib_per_sec >= USEFUL * fastest)
        .min_by_key(|d| d.depth)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(depth: usize, mib_per_sec: f64) -> DepthResult {
        DepthResult {
            depth,
            files: 10,
            mib_per_sec,
            ..Default::default()
        }
    }

    #[test]
    fn the_best_useful_depth_is_the_smallest_near_the_fastest() {
        // (depth, MiB/s) rows, and the best useful depth.
        type Case<'a> = (&'a [(usize, f64)], Option<usize>);
        let table: &[Case] = &[
            (&[(1, 200.0), (4, 205.0), (16, 204.0), (64, 199.0)], Some(1)),
            (&[(1, 100.0), (4, 360.0), (16, 380.0), (64, 390.0)], Some(4)),
            (
                &[(1, 100.0), (4, 200.0), (16, 400.0), (64, 300.0)],
                Some(16),
            ),
            (&[], None),
        ];
        for (rows, want) in table {
            let rows: Vec<_> = rows.iter().map(|&(d, m)| depth(d, m)).collect();
            assert_eq!(best_useful(&rows).map(|d| d.depth), *want, "{rows:?}");
        }
        let none_read = [DepthResult::default()];
        assert!(best_useful(&none_read).is_none());
    }

    #[test]
    fn reads_every_byte_and_counts_unreadable_files_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        for i in 0..8 {
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, vec![1u8; 5000]).unwrap();
            files.push((p, 5000));
        }
        files.push((dir.path().join("missing"), 5000));
        let m = measure(
            &files,
            &[1, 4],
            Duration::from_millis(100),
            ReadPath::Storage,
            &|_| {},
        );
        assert_eq!(m.unreadable, 1);
        assert!(m.first_error.unwrap().contains("missing"));
        for d in &m.depths {
            assert!(d.files > 0, "{d:?}");
            assert_eq!(d.bytes, d.files * 5000);
            assert!(d.seconds >= 0.1);
        }
    }

    /// Measures in a thread and fails, rather than hangs, if that takes `limit` or more.
    fn measure_within(
        limit: Duration,
        files: Vec<(PathBuf, u64)>,
        per_depth: Duration,
    ) -> Measurement {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let m = measure(&files, &[1, 4], per_depth, ReadPath::Storage, &|_| {});
            let _ = tx.send(m);
        });
        rx.recv_timeout(limit)
            .unwrap_or_else(|_| panic!("the measurement took more than {limit:?}"))
    }

    #[test]
    fn reads_stop_at_the_scanned_size_and_skip_what_is_not_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let grown = dir.path().join("grown");
        std::fs::write(&grown, vec![1u8; 10_000]).unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&grown, &link).unwrap();
        let files = vec![
            // Scanned at 4,000 bytes, 10,000 now: 4,000 are read.
            (grown, 4000),
            // Size 0, and without end.
            (PathBuf::from("/proc/self/pagemap"), 0),
            // Would block the open.
            (fifo, 100),
            // Replaced by a symlink since the scan.
            (link, 4000),
        ];
        let m = measure_within(Duration::from_secs(5), files, Duration::from_millis(100));
        assert_eq!(m.unreadable, 2, "{:?}", m.first_error);
        for d in &m.depths {
            assert!(d.files > 0, "{d:?}");
            // Every whole file read is the first (4,000 bytes) or pagemap (0 bytes).
            assert!(d.bytes <= d.files * 4000 && d.bytes > 0, "{d:?}");
            assert_eq!(d.bytes % 4000, 0, "{d:?}");
        }
    }

    #[test]
    fn a_depth_ends_at_its_deadline_however_large_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let huge = dir.path().join("huge");
        // Sparse: 64 GiB of holes, far more than 2 x 200 ms of reading.
        let size = 64u64 << 30;
        std::fs::File::create(&huge).unwrap().set_len(size).unwrap();
        let m = measure_within(
            Duration::from_secs(3),
            vec![(huge, size)],
            Duration::from_millis(200),
        );
        for d in &m.depths {
            assert_eq!(d.files, 0, "{d:?}");
            assert!(d.bytes > 0 && d.bytes < size, "{d:?}");
            assert!(d.files_per_sec > 0.0 && d.mib_per_sec > 0.0, "{d:?}");
            assert!(d.seconds >= 0.2 && d.seconds < 1.5, "{d:?}");
        }
        assert!(best_useful(&m.depths).is_some());
    }
}
