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
//! skipped: the measurement goes on with the others.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
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
    /// Their bytes.
    pub bytes: u64,
    /// Wall-clock seconds, until the last read in flight ended.
    pub seconds: f64,
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

/// Reads `files` at each of `depths` for `per_depth` each; `progress(elapsed)` is called
/// about ten times a second with the time spent so far.
pub fn measure(
    files: &[PathBuf],
    depths: &[usize],
    per_depth: Duration,
    path: ReadPath,
    progress: &(dyn Fn(Duration) + Sync),
) -> Measurement {
    let cursor = AtomicUsize::new(0);
    let failed: Vec<AtomicBool> = files.iter().map(|_| AtomicBool::new(false)).collect();
    let unreadable = AtomicUsize::new(0);
    let first_error = Mutex::new(None);
    let started = Instant::now();
    let mut results = Vec::new();
    for &depth in depths {
        let files_read = AtomicU64::new(0);
        let bytes = AtomicU64::new(0);
        let start = Instant::now();
        let deadline = start + per_depth;
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..depth)
                .map(|_| {
                    s.spawn(|| {
                        let mut buf = vec![0u8; BUFFER];
                        // Every reader tries at least one file, however short the time.
                        let mut tried = false;
                        while (!tried || Instant::now() < deadline)
                            && unreadable.load(Ordering::Relaxed) < files.len()
                        {
                            tried = true;
                            let i = cursor.fetch_add(1, Ordering::Relaxed) % files.len();
                            if failed[i].load(Ordering::Relaxed) {
                                continue;
                            }
                            match read_whole(&files[i], &mut buf, path) {
                                Ok(n) => {
                                    files_read.fetch_add(1, Ordering::Relaxed);
                                    bytes.fetch_add(n, Ordering::Relaxed);
                                }
                                Err(e) => {
                                    if !failed[i].swap(true, Ordering::Relaxed) {
                                        unreadable.fetch_add(1, Ordering::Relaxed);
                                        first_error.lock().get_or_insert_with(|| {
                                            format!("{}: {e}", files[i].display())
                                        });
                                    }
                                }
                            }
                        }
                    })
                })
                .collect();
            while !workers.iter().all(|w| w.is_finished()) {
                progress(started.elapsed());
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let seconds = start.elapsed().as_secs_f64();
        let (files, bytes) = (files_read.into_inner(), bytes.into_inner());
        results.push(DepthResult {
            depth,
            files,
            bytes,
            seconds,
            files_per_sec: files as f64 / seconds,
            mib_per_sec: bytes as f64 / seconds / (1u64 << 20) as f64,
        });
    }
    progress(started.elapsed());
    Measurement {
        depths: results,
        unreadable: unreadable.into_inner() as u64,
        first_error: first_error.into_inner(),
    }
}

/// Reads `path` whole; returns its bytes.
fn read_whole(path: &std::path::Path, buf: &mut [u8], how: ReadPath) -> std::io::Result<u64> {
    let mut file = crate::source::open_for_read(path)?;
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
    loop {
        match file.read(buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    drop_pages();
    Ok(total)
}

/// The best useful depth: the smallest whose throughput is within 10% of the fastest's.
pub fn best_useful(depths: &[DepthResult]) -> Option<&DepthResult> {
    let fastest = depths.iter().map(|d| d.mib_per_sec).fold(0.0f64, f64::max);
    depths
        .iter()
        .filter(|d| d.files > 0 && d.mib_per_sec >= USEFUL * fastest)
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
            files.push(p);
        }
        files.push(dir.path().join("missing"));
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
}
