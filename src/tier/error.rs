//! The data path's one error: why a block could not be had, with its cause kept, and the one
//! map from it to the errno a reader sees ([`DataError::errno`]).
//!
//! Every tier and the fetch fail with a [`DataError`]: the source's error (a local file's
//! I/O error, an object store's refusal in its words: [`SourceError`]), a short
//! read of a file that changed, no memory for a block, the disk tier's I/O error, a peer's
//! fault (which member, and what went wrong: an HTTP status, a transport error, a wrong
//! checksum). The in-flight fetch hands one result to every waiter, so the error is cheap to
//! clone: the causes that are not `Clone` are behind an `Arc`. Its `Display` is the whole
//! chain on one line (no `source()` to print it twice).
//!
//! A read that fails reaches the FUSE adapter as a [`ReadFailed`] (the file, the block, the
//! error), which logs it once with its cause, at most [`FAILED_READS_PER_MINUTE`] lines a
//! minute ([`LogLimit`]; the next line says how many were left out), and replies with its
//! errno. Nothing else logs the failure: a tier in front of the source that fails is logged
//! where the chain passes over it ([`super::look_up`]).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::source::SourceError;

/// See the module documentation.
#[derive(Clone, Debug, thiserror::Error)]
pub enum DataError {
    /// The source's read failed: a local file's I/O error, an object store's answer.
    #[error("source: {0}")]
    Source(Arc<SourceError>),
    /// The source read fewer bytes than the version read has: the file changed since.
    #[error("source: {got} bytes of {want}: the file changed since it was opened")]
    Short { got: usize, want: usize },
    /// No memory for the block's buffer.
    #[error("no memory for a block of {len} bytes: {error}")]
    NoMemory { len: usize, error: Arc<io::Error> },
    /// The disk tier's read of its data file failed.
    #[error("disk tier: reading {}: {error}", path.display())]
    Disk {
        path: PathBuf,
        error: Arc<io::Error>,
    },
    /// The member of the cluster that owns the file did not hand over the block.
    #[error("peer {peer}: {fault} (not asked again for {backoff:?})")]
    Peer {
        peer: String,
        fault: PeerFault,
        backoff: Duration,
    },
    /// The source file the reader holds open failed to read.
    #[error("the open file: {0}")]
    OpenFile(Arc<SourceError>),
    /// The file the reader holds open is no longer the version it opened.
    #[error("the open file changed since it was opened")]
    Changed,
    /// A tier that reads no runs of blocks was asked for one.
    #[error("{0} tier: reads no runs of blocks")]
    NoRuns(&'static str),
    /// The tier that was to read the block handed over something else (none, or not it).
    #[error("{0} tier: did not hand over the block")]
    Missing(&'static str),
    /// The fetch's read panicked (a bug).
    #[error("the fetch panicked")]
    Panicked,
}

/// What went wrong asking a peer for a block.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PeerFault {
    /// No answer: a refused or broken connection, a timeout.
    #[error("{0}")]
    Transport(Arc<ureq::Error>),
    /// An answer other than 200, and the first words of its body.
    #[error("HTTP {status}{}", if body.is_empty() { String::new() } else { format!(": {body}") })]
    Status { status: u16, body: String },
    /// An answer for another version of the file than the one asked for.
    #[error("a reply for another version ({0:?})")]
    OtherVersion(Option<String>),
    #[error("no checksum")]
    NoChecksum,
    /// The body's bytes did not match their checksum.
    #[error("a wrong checksum")]
    Checksum,
    /// A body of another length than the block's.
    #[error("{got} bytes of {len}")]
    Length { got: usize, len: usize },
    /// Reading the body failed.
    #[error("reading the body: {0}")]
    Body(Arc<io::Error>),
    #[error("no memory for the block: {0}")]
    NoMemory(Arc<io::Error>),
}

impl DataError {
    /// The errno a reader gets for this error: the one map.
    pub fn errno(&self) -> i32 {
        match self {
            DataError::Source(e) | DataError::OpenFile(e) => e.errno(),
            DataError::Disk { error, .. } => error.raw_os_error().unwrap_or(libc::EIO),
            DataError::Short { .. } | DataError::Changed => libc::ESTALE,
            DataError::NoMemory { .. } => libc::ENOMEM,
            DataError::NoRuns(_) => libc::EOPNOTSUPP,
            DataError::Peer { .. } | DataError::Missing(_) | DataError::Panicked => libc::EIO,
        }
    }

    /// The error of a source's failed read.
    pub fn of_source(e: SourceError) -> Self {
        DataError::Source(Arc::new(e))
    }

    /// No memory for a block of `len` bytes.
    pub fn no_memory(len: usize, error: io::Error) -> Self {
        DataError::NoMemory {
            len,
            error: Arc::new(error),
        }
    }
}

/// A read of block `block` of the file at `rel` that failed with `error`: what the reader's
/// one log line says ([`LogLimit`]).
#[derive(Clone, Debug, thiserror::Error)]
#[error("reading {} block {block}: {error}", rel.display())]
pub struct ReadFailed {
    pub rel: Arc<Path>,
    pub block: u64,
    pub error: DataError,
}

/// Lines a minute at most that failed reads log (a store that refuses every read fails
/// thousands a second).
pub const FAILED_READS_PER_MINUTE: u32 = 20;

/// A log that writes at most `most` lines in each `window`, and counts the lines it leaves
/// out: the first line it writes after them says how many.
#[derive(Debug)]
pub struct LogLimit {
    most: u32,
    window: Duration,
    /// The current window's start, the lines written in it, the lines left out since the
    /// last one written.
    state: parking_lot::Mutex<(Option<Instant>, u32, u64)>,
}

impl LogLimit {
    pub const fn new(most: u32, window: Duration) -> Self {
        LogLimit {
            most,
            window,
            state: parking_lot::const_mutex((None, 0, 0)),
        }
    }

    /// The line to write at `now` for `what`, or None if it is left out.
    pub fn line(&self, now: Instant, what: impl fmt::Display) -> Option<String> {
        let mut state = self.state.lock();
        let (start, written, left_out) = &mut *state;
        if start.is_none_or(|s| now.saturating_duration_since(s) >= self.window) {
            *start = Some(now);
            *written = 0;
        }
        if *written >= self.most {
            *left_out += 1;
            return None;
        }
        *written += 1;
        Some(match std::mem::take(left_out) {
            0 => what.to_string(),
            n => format!("{what} ({n} more not logged before it)"),
        })
    }
}

/// The log of failed reads: [`FAILED_READS_PER_MINUTE`] lines a minute.
pub static FAILED_READS: LogLimit = LogLimit::new(FAILED_READS_PER_MINUTE, Duration::from_secs(60));

#[cfg(test)]
mod tests {
    use super::*;

    fn io(errno: i32) -> Arc<io::Error> {
        Arc::new(io::Error::from_raw_os_error(errno))
    }

    fn source(errno: i32) -> Arc<SourceError> {
        Arc::new(io::Error::from_raw_os_error(errno).into())
    }

    #[test]
    fn each_error_has_the_errno_the_reader_got_before_it_had_a_cause() {
        let peer = |fault| DataError::Peer {
            peer: "10.0.0.2:7000".into(),
            fault,
            backoff: Duration::from_secs(1),
        };
        let refused = |errno| {
            DataError::of_source(SourceError::Refused {
                errno,
                why: "GET: Client error with status 403 Forbidden".into(),
            })
        };
        let table = [
            (DataError::Source(source(libc::EIO)), libc::EIO),
            (DataError::Source(source(libc::ENOENT)), libc::ENOENT),
            (
                DataError::of_source(io::Error::other("x").into()),
                libc::EIO,
            ),
            (DataError::of_source(SourceError::Changed), libc::ESTALE),
            (refused(libc::EACCES), libc::EACCES),
            (refused(libc::EIO), libc::EIO),
            (DataError::Short { got: 1, want: 2 }, libc::ESTALE),
            (
                DataError::no_memory(10, io::Error::other("mmap")),
                libc::ENOMEM,
            ),
            (
                DataError::Disk {
                    path: "/var/cache/coorfs/data".into(),
                    error: io(libc::ENOSPC),
                },
                libc::ENOSPC,
            ),
            (peer(PeerFault::Checksum), libc::EIO),
            (
                peer(PeerFault::Status {
                    status: 502,
                    body: String::new(),
                }),
                libc::EIO,
            ),
            (DataError::OpenFile(source(libc::EBADF)), libc::EBADF),
            (DataError::Changed, libc::ESTALE),
            (DataError::NoRuns("disk"), libc::EOPNOTSUPP),
            (DataError::Missing("source"), libc::EIO),
            (DataError::Panicked, libc::EIO),
        ];
        for (e, errno) in table {
            assert_eq!(e.errno(), errno, "{e}");
        }
    }

    #[test]
    fn a_failed_read_names_the_file_the_block_and_the_cause() {
        let failed = |error| ReadFailed {
            rel: Arc::from(Path::new("dir/a.bin")),
            block: 3,
            error,
        };
        let limit = LogLimit::new(10, Duration::from_secs(60));
        let line = |e| limit.line(Instant::now(), failed(e)).unwrap();
        let store = SourceError::Refused {
            errno: libc::EACCES,
            why: "GET: Client error with status 403".into(),
        };
        assert_eq!(
            line(DataError::of_source(store)),
            "reading dir/a.bin block 3: source: GET: Client error with status 403 \
             (Permission denied (os error 13))"
        );
        let disk = DataError::Disk {
            path: "/var/cache/coorfs/data".into(),
            error: io(libc::EIO),
        };
        assert_eq!(
            line(disk),
            "reading dir/a.bin block 3: disk tier: reading /var/cache/coorfs/data: \
             Input/output error (os error 5)"
        );
        let peer = DataError::Peer {
            peer: "10.0.0.2:7000".into(),
            fault: PeerFault::Status {
                status: 502,
                body: "source: Input/output error (os error 5)".into(),
            },
            backoff: Duration::from_secs(2),
        };
        assert_eq!(
            line(peer),
            "reading dir/a.bin block 3: peer 10.0.0.2:7000: HTTP 502: source: Input/output error \
             (os error 5) (not asked again for 2s)"
        );
        assert_eq!(
            line(DataError::Short {
                got: 10,
                want: 4096
            }),
            "reading dir/a.bin block 3: source: 10 bytes of 4096: \
             the file changed since it was opened"
        );
    }

    #[test]
    fn a_log_limit_writes_so_many_lines_a_window_and_counts_the_rest() {
        let limit = LogLimit::new(2, Duration::from_secs(60));
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(limit.line(at(0), "a").as_deref(), Some("a"));
        assert_eq!(limit.line(at(1), "b").as_deref(), Some("b"));
        for s in 2..7 {
            assert_eq!(limit.line(at(s), "c"), None, "{s}");
        }
        // A minute after the window began: a new one, whose first line counts the others.
        assert_eq!(
            limit.line(at(60), "d").as_deref(),
            Some("d (5 more not logged before it)")
        );
        assert_eq!(limit.line(at(61), "e").as_deref(), Some("e"));
        assert_eq!(limit.line(at(62), "f"), None);
        assert_eq!(
            limit.line(at(200), "g").as_deref(),
            Some("g (1 more not logged before it)")
        );
    }
}
