//! The data path's one error: why a block could not be had, with its cause kept, and the one
//! map from it to the errno a reader sees ([`DataError::errno`]).
//!
//! Every tier and the fetch fail with a [`DataError`]: the source's I/O error or an object
//! store's refusal (its answer, HTTP status and all, [`crate::source::Refusal`]), a short
//! read of a file that changed, no memory for a block, the disk tier's I/O error, a peer's
//! fault (which member, and what went wrong: an HTTP status, a transport error, a wrong
//! checksum). The in-flight fetch hands one result to every waiter, so the error is cheap to
//! clone: the causes that are not `Clone` are behind an `Arc`. Its `Display` is the whole
//! chain on one line (no `source()` to print it twice).
//!
//! A read that fails reaches the FUSE adapter as a [`ReadFailed`] (the file, the block, the
//! error), which replies with its errno. A tier in front of the source that fails is logged
//! where the chain passes over it ([`super::look_up`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::source::Refusal;

/// See the module documentation.
#[derive(Clone, Debug, thiserror::Error)]
pub enum DataError {
    /// The source's read failed (a local file's I/O error).
    #[error("source: {0}")]
    Source(Arc<io::Error>),
    /// The source refused the read: an object store's answer, in its words.
    #[error("source: {0}")]
    Refused(Arc<Refusal>),
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
    OpenFile(Arc<io::Error>),
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

/// The errno of an I/O error: its own, or its refusal's, else EIO.
fn errno_of(e: &io::Error) -> i32 {
    Refusal::errno_of(e).unwrap_or(libc::EIO)
}

impl DataError {
    /// The errno a reader gets for this error: the one map.
    pub fn errno(&self) -> i32 {
        match self {
            DataError::Source(e) | DataError::OpenFile(e) => errno_of(e),
            DataError::Refused(r) => r.errno,
            DataError::Disk { error, .. } => errno_of(error),
            DataError::Short { .. } | DataError::Changed => libc::ESTALE,
            DataError::NoMemory { .. } => libc::ENOMEM,
            DataError::NoRuns(_) => libc::EOPNOTSUPP,
            DataError::Peer { .. } | DataError::Missing(_) | DataError::Panicked => libc::EIO,
        }
    }

    /// The error of a source's failed read: its refusal, if it carries one, else the I/O
    /// error itself.
    pub fn of_source(e: io::Error) -> Self {
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<Refusal>())
        {
            Some(r) => DataError::Refused(Arc::new(Refusal {
                errno: r.errno,
                why: r.why.clone(),
            })),
            None => DataError::Source(Arc::new(e)),
        }
    }

    /// No memory for a block of `len` bytes.
    pub fn no_memory(len: usize, error: io::Error) -> Self {
        DataError::NoMemory {
            len,
            error: Arc::new(error),
        }
    }
}

/// A read of block `block` of the file at `rel` that failed with `error`.
#[derive(Clone, Debug, thiserror::Error)]
#[error("reading {} block {block}: {error}", rel.display())]
pub struct ReadFailed {
    pub rel: Arc<Path>,
    pub block: u64,
    pub error: DataError,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(errno: i32) -> Arc<io::Error> {
        Arc::new(io::Error::from_raw_os_error(errno))
    }

    #[test]
    fn each_error_has_the_errno_the_reader_got_before_it_had_a_cause() {
        let peer = |fault| DataError::Peer {
            peer: "10.0.0.2:7000".into(),
            fault,
            backoff: Duration::from_secs(1),
        };
        let refused = |errno| {
            DataError::of_source(Refusal::error(
                errno,
                "GET: Client error with status 403 Forbidden".into(),
            ))
        };
        let table = [
            (DataError::Source(io(libc::EIO)), libc::EIO),
            (DataError::Source(io(libc::ENOENT)), libc::ENOENT),
            (
                DataError::Source(Arc::new(io::Error::other("x"))),
                libc::EIO,
            ),
            (
                DataError::of_source(io::Error::from_raw_os_error(libc::ESTALE)),
                libc::ESTALE,
            ),
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
            (DataError::OpenFile(io(libc::EBADF)), libc::EBADF),
            (DataError::Changed, libc::ESTALE),
            (DataError::NoRuns("disk"), libc::EOPNOTSUPP),
            (DataError::Missing("source"), libc::EIO),
            (DataError::Panicked, libc::EIO),
        ];
        for (e, errno) in table {
            assert_eq!(e.errno(), errno, "{e}");
        }
        assert!(matches!(refused(libc::EACCES), DataError::Refused(_)));
    }

    #[test]
    fn a_failed_read_names_the_file_the_block_and_the_cause() {
        let failed = |error| ReadFailed {
            rel: Arc::from(Path::new("dir/a.bin")),
            block: 3,
            error,
        };
        let line = |e| failed(e).to_string();
        let store = Refusal::error(libc::EACCES, "GET: Client error with status 403".into());
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
}
