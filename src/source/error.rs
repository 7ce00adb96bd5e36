//! The source's one error: why a directory or an object store could not do what was asked,
//! with its cause, and the errno a caller gets for it ([`SourceError::errno`], the one map).
//!
//! Every [`super::DatasetSource`] call fails with a [`SourceError`]. The data path wraps it in
//! a `DataError` (`crate::tier::error`), the core in an `FsError` (`crate::fs`), each with the
//! cause kept, so that a failed read's one log line says what the store answered. A local
//! source's system call errors come in as [`SourceError::Io`] with their errno (the two the
//! core acts on, a missing entry and a changed one, as variants of their own); an object
//! store's answers are sorted where they are read (`object/errors.rs`).

use std::io;

/// See the module documentation.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// No entry of that name, or an object gone from the store (ENOENT).
    #[error("no such file or directory")]
    NotFound,
    /// The entry is not the version that was opened or listed any more (ESTALE).
    #[error("changed since it was opened")]
    Changed,
    /// Not a directory where one was asked for (ENOTDIR).
    #[error("not a directory")]
    NotDir,
    /// A directory where a file was asked for (EISDIR).
    #[error("is a directory")]
    IsDir,
    /// Asked for what the source has not: a link of a store with no links, a name no path
    /// may hold (EINVAL).
    #[error("invalid argument")]
    Invalid,
    /// The store refused, in its words (status and message); `errno` is what the caller gets
    /// for it: 403 EACCES, retries exhausted EIO.
    #[error("{why} ({})", io::Error::from_raw_os_error(*.errno))]
    Refused { errno: i32, why: String },
    /// A system call of a local source failed, or the source's own machinery did.
    #[error("{0}")]
    Io(io::Error),
}

impl From<io::Error> for SourceError {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOENT) => SourceError::NotFound,
            Some(libc::ESTALE) => SourceError::Changed,
            _ => SourceError::Io(e),
        }
    }
}

impl From<rustix::io::Errno> for SourceError {
    fn from(e: rustix::io::Errno) -> Self {
        io::Error::from(e).into()
    }
}

impl SourceError {
    /// The errno a caller gets: the one map.
    pub fn errno(&self) -> i32 {
        match self {
            SourceError::NotFound => libc::ENOENT,
            SourceError::Changed => libc::ESTALE,
            SourceError::NotDir => libc::ENOTDIR,
            SourceError::IsDir => libc::EISDIR,
            SourceError::Invalid => libc::EINVAL,
            SourceError::Refused { errno, .. } => *errno,
            SourceError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// True if a path no longer resolves beneath the root the way the node table recorded it:
    /// a component became a symlink (`ELOOP`) or a non-directory (`ENOTDIR`), or the path
    /// would leave the root (`EXDEV`).
    pub fn is_moved(&self) -> bool {
        matches!(self.errno(), libc::ELOOP | libc::ENOTDIR | libc::EXDEV)
    }

    /// The error as an `io::Error` of its errno, for what reports it as one (a mount that
    /// fails, the allocator's failure inside a read); a refusal keeps its words.
    pub fn into_io(self) -> io::Error {
        match self {
            SourceError::Io(e) => e,
            SourceError::Refused { errno, .. } => {
                io::Error::new(io::Error::from_raw_os_error(errno).kind(), self)
            }
            other => io::Error::from_raw_os_error(other.errno()),
        }
    }
}

/// A source call's result.
pub type SourceResult<T> = Result<T, SourceError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_its_errno_and_io_errors_keep_theirs() {
        let table = [
            (
                SourceError::from(io::Error::from_raw_os_error(libc::ENOENT)),
                libc::ENOENT,
            ),
            (
                io::Error::from_raw_os_error(libc::ESTALE).into(),
                libc::ESTALE,
            ),
            (
                io::Error::from_raw_os_error(libc::ELOOP).into(),
                libc::ELOOP,
            ),
            (io::Error::other("runtime ended").into(), libc::EIO),
            (SourceError::NotDir, libc::ENOTDIR),
            (SourceError::IsDir, libc::EISDIR),
            (SourceError::Invalid, libc::EINVAL),
            (
                SourceError::Refused {
                    errno: libc::EACCES,
                    why: "GET: 403 Forbidden".into(),
                },
                libc::EACCES,
            ),
        ];
        for (e, errno) in table {
            assert_eq!(e.errno(), errno, "{e}");
            if !matches!(e, SourceError::Refused { .. }) {
                assert_eq!(e.into_io().raw_os_error().unwrap_or(libc::EIO), errno);
            }
        }
        assert!(matches!(
            SourceError::from(io::Error::from_raw_os_error(libc::ENOENT)),
            SourceError::NotFound
        ));
        let refused = SourceError::Refused {
            errno: libc::EACCES,
            why: "GET: 403 Forbidden".into(),
        };
        assert_eq!(
            refused.to_string(),
            "GET: 403 Forbidden (Permission denied (os error 13))"
        );
        assert!(SourceError::from(io::Error::from_raw_os_error(libc::EXDEV)).is_moved());
        assert!(!SourceError::NotFound.is_moved());
    }
}
