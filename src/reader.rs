//! `coorfs read`: reads a directory the way a training job does (every file once per
//! epoch, whole, in a fresh random order, split across worker processes) and reports the
//! throughput of each epoch.
//!
//! It exists so that benchmarks can compare coorfs with the native path without the
//! interpreter overhead of a Python reader (about 5 us a file, a quarter of a hot native
//! read of a 100 KiB file) hiding the difference. Workers are forked processes of the same
//! process group, like a PyTorch DataLoader's, and, like the DataLoader's default
//! (`persistent_workers=False`), new ones are forked every epoch.

use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::Serialize;

/// What to read and how.
#[derive(Clone, Debug)]
pub struct ReadPlan {
    /// The directory whose files are read (recursively).
    pub dir: PathBuf,
    /// Worker processes.
    pub procs: usize,
    /// Epochs.
    pub epochs: usize,
    /// Seed of the per-epoch shuffles (epoch e uses seed + e).
    pub seed: u64,
    /// Read the files in sorted order instead of shuffling.
    pub sorted: bool,
    /// Bytes per read call.
    pub buffer: usize,
    /// Hand each epoch's order to the coorfs mount at `dir` before reading it.
    pub hint: bool,
}

/// One epoch's figures.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct EpochReport {
    pub epoch: usize,
    pub files: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Seconds of wall-clock time.
    pub seconds: f64,
    pub files_per_sec: f64,
    /// MiB per second.
    pub mib_per_sec: f64,
}

/// Why a read run failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}: {1}")]
    List(PathBuf, io::Error),
    #[error("{0}: no regular files")]
    Empty(PathBuf),
    #[error("starting a worker: {0}")]
    Worker(io::Error),
    #[error("handing the order to {0}: {1}")]
    Hint(PathBuf, io::Error),
}

/// The order file of a coorfs mount (see `fs/order.rs`).
pub const ORDER_FILE: &str = ".coorfs-order";

/// Tells the coorfs mount at `mount` that this job will read `order` (paths below `mount`)
/// next.
pub fn write_hint(mount: &Path, order: &[PathBuf]) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut text = Vec::new();
    for path in order {
        let rel = path.strip_prefix(mount).unwrap_or(path);
        text.extend_from_slice(rel.as_os_str().as_bytes());
        text.push(b'\n');
    }
    send_hint(mount, &text)
}

/// Hands hint `text` (relative paths, one per line) to the coorfs mount at `mount`: over its
/// control socket (`fs/control.rs`), or where this process cannot reach it, through its order
/// file: the text in chunks, then a commit (`fs/order.rs`). The error is the mount's verdict
/// on a rejected hint.
pub fn send_hint(mount: &Path, text: &[u8]) -> io::Result<()> {
    let daemon = xattr::get(mount, crate::stats::xattr_name(crate::stats::Stat::Pid))
        .ok()
        .flatten()
        .and_then(|v| String::from_utf8(v).ok()?.trim().parse::<u32>().ok());
    if let Some(pid) = daemon
        && let Some(verdict) = crate::fs::control::send(mount, pid, text)
    {
        return verdict;
    }
    send_hint_by_file(mount, text)
}

/// [`send_hint`] through the order file.
pub fn send_hint_by_file(mount: &Path, text: &[u8]) -> io::Result<()> {
    use crate::fs::order::{HINT_CHUNK, HINT_COMMIT, chunks};
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(mount.join(ORDER_FILE))?;
    let ioctl = |cmd: u32, arg: *mut u8| {
        // SAFETY: `arg` is null or points to a chunk of the size `cmd` names, alive for
        // the call; the descriptor is open.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), cmd as _, arg) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    for mut chunk in chunks(text) {
        ioctl(HINT_CHUNK, chunk.as_mut_ptr())?;
    }
    ioctl(HINT_COMMIT, std::ptr::null_mut())
}

/// Every regular file below `dir`, sorted.
pub fn list_files(dir: &Path) -> Result<Vec<PathBuf>, ReadError> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| ReadError::List(d.clone(), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| ReadError::List(d.clone(), e))?;
            let t = entry
                .file_type()
                .map_err(|e| ReadError::List(entry.path(), e))?;
            if t.is_dir() {
                stack.push(entry.path());
            } else if t.is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The order of epoch `epoch`: a shuffle seeded with `seed + epoch`, or the sorted order.
/// (`coorfs analyze` shuffles file indices with it, so its simulated epochs are the orders
/// `coorfs read` would use.)
pub fn epoch_order<T: Clone>(files: &[T], seed: u64, epoch: usize, sorted: bool) -> Vec<T> {
    let mut order = files.to_vec();
    if !sorted {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(epoch as u64));
        order.shuffle(&mut rng);
    }
    order
}

/// Reads all epochs of `plan`, calling `report` after each.
pub fn run(
    plan: &ReadPlan,
    mut report: impl FnMut(&EpochReport),
) -> Result<Vec<EpochReport>, ReadError> {
    let files = list_files(&plan.dir)?;
    if files.is_empty() {
        return Err(ReadError::Empty(plan.dir.clone()));
    }
    let mut reports = Vec::new();
    for epoch in 1..=plan.epochs {
        let order = epoch_order(&files, plan.seed, epoch, plan.sorted);
        if plan.hint {
            write_hint(&plan.dir, &order).map_err(|e| ReadError::Hint(plan.dir.clone(), e))?;
        }
        let r = read_epoch(&order, plan.procs.max(1), plan.buffer.max(1), epoch)?;
        report(&r);
        reports.push(r);
    }
    Ok(reports)
}

/// Totals a worker sends back.
#[derive(Default)]
struct Totals {
    files: u64,
    bytes: u64,
    errors: u64,
}

fn read_share(order: &[PathBuf], worker: usize, procs: usize, buffer: usize) -> Totals {
    let mut buf = vec![0u8; buffer];
    let mut t = Totals::default();
    for path in order.iter().skip(worker).step_by(procs) {
        match std::fs::File::open(path) {
            Ok(mut f) => loop {
                match f.read(&mut buf) {
                    Ok(0) => {
                        t.files += 1;
                        break;
                    }
                    Ok(n) => t.bytes += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        t.errors += 1;
                        break;
                    }
                }
            },
            Err(_) => t.errors += 1,
        }
    }
    t
}

fn read_epoch(
    order: &[PathBuf],
    procs: usize,
    buffer: usize,
    epoch: usize,
) -> Result<EpochReport, ReadError> {
    let start = Instant::now();
    let mut pipes = Vec::new();
    for worker in 0..procs {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(ReadError::Worker(io::Error::last_os_error()));
        }
        // SAFETY: pipe2 succeeded; the descriptors are ours alone.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: this command runs no other threads, so the child may run Rust code.
        match unsafe { libc::fork() } {
            -1 => return Err(ReadError::Worker(io::Error::last_os_error())),
            0 => {
                drop(rd);
                let t = read_share(order, worker, procs, buffer);
                let mut out = std::fs::File::from(wr);
                let _ = writeln!(out, "{} {} {}", t.files, t.bytes, t.errors);
                drop(out);
                // SAFETY: ends the forked child without running the parent's exit handlers.
                unsafe { libc::_exit(0) };
            }
            pid => {
                drop(wr);
                pipes.push((pid, rd));
            }
        }
    }
    let mut total = Totals::default();
    for (pid, rd) in pipes {
        let mut text = String::new();
        let _ = std::fs::File::from(rd).read_to_string(&mut text);
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let nums: Vec<u64> = text
            .split_whitespace()
            .filter_map(|s| s.parse().ok())
            .collect();
        if let [files, bytes, errors] = nums[..] {
            total.files += files;
            total.bytes += bytes;
            total.errors += errors;
        } else {
            // A worker that died reported nothing: count its share as failed.
            total.errors += order.len().div_ceil(procs) as u64;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(EpochReport {
        epoch,
        files: total.files,
        bytes: total.bytes,
        errors: total.errors,
        seconds,
        files_per_sec: total.files as f64 / seconds,
        mib_per_sec: total.bytes as f64 / seconds / (1 << 20) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_permutations_fixed_by_the_seed() {
        let files: Vec<PathBuf> = (0..100)
            .map(|i| PathBuf::from(format!("f{i:03}")))
            .collect();
        let a = epoch_order(&files, 7, 1, false);
        let b = epoch_order(&files, 7, 1, false);
        let c = epoch_order(&files, 7, 2, false);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, files);
        assert_eq!(epoch_order(&files, 7, 1, true), files);
    }

    #[test]
    fn reads_every_byte_once_per_epoch() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut want = 0;
        for i in 0..20u64 {
            let sub = if i % 2 == 0 { "" } else { "sub" };
            let data = vec![i as u8; (i * 1000) as usize];
            want += data.len() as u64;
            std::fs::write(dir.path().join(sub).join(format!("f{i}")), data).unwrap();
        }
        let plan = ReadPlan {
            dir: dir.path().to_path_buf(),
            procs: 3,
            epochs: 2,
            seed: 1,
            sorted: false,
            buffer: 4096,
            hint: false,
        };
        let reports = run(&plan, |_| {}).unwrap();
        assert_eq!(reports.len(), 2);
        for r in reports {
            assert_eq!((r.files, r.bytes, r.errors), (20, want, 0));
        }
    }
}
