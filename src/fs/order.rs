//! The order file: how a job tells coorfs the order it will read files in (an order hint).
//!
//! A job writes the paths of its coming epoch, relative to the mount root and one per
//! line, to `MOUNT/.coorfs-order`, and closes it; `close(2)` returns the verdict. The file
//! does not appear in listings, is write-only (mode 0222) and reads as empty.
//!
//! Why a file and not `setxattr(user.coorfs.order)`: the kernel caps an extended
//! attribute's value at 64 KiB (XATTR_SIZE_MAX), about 2,000 ImageNet paths, while an
//! epoch's order for ImageNet is some 40 MB; a file takes any size in 1 MiB writes. From
//! Python it is `open(path, "w").write("\n".join(paths))`, and a rejected hint raises
//! `OSError` with its errno at `close()`:
//! - `ENOENT`: a line names no file of the dataset (the message in the log names it);
//! - `EINVAL`: a line holds a NUL byte or a `..`, names a directory, or no line names a path;
//! - `EFBIG`: the hint is larger than any order of this dataset could be (at the `write`);
//! - `EDQUOT`: the hints this user (or all users) are writing or have given hold more memory
//!   than `--hint-memory` allows (at the `write` or the `close`);
//! - `EACCES` at `open`: under `--job-key none` (one job for everybody) only the user who
//!   mounted, or root, may hint.
//!
//! A hint names only files its writer may read: a name the writer could not open (its mode,
//! an ACL, a directory on the way it may not search) gets `ENOENT`, the answer for a name that
//! does not exist, so that hints cannot probe for files a user cannot see.
//!
//! # Memory
//! Hints are the one way a user makes the daemon hold memory of the user's choosing, so
//! they are bounded twice: one hint by the dataset's size (64 MiB plus 128 bytes a file),
//! and all hints, pending (bytes written, not yet applied) and accepted (4 bytes a file of
//! a job's order), by `--hint-memory` in total and by half of it per user
//! ([`crate::jobs::HintBudget`]).
//!
//! The close of the process that wrote applies the hint; a child's close of its inherited
//! copy (at `exec`, say) does not.
//!
//! A rejected hint changes nothing: the job keeps its previous hint (or none), and reads are
//! served as before.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::time::SystemTime;

use parking_lot::Mutex;

use super::{Caller, DatasetFs, FsError, Opened};
use crate::jobs::ledger::Ledger;
use crate::jobs::{HintBudget, HintCharge, HintLimits};
use crate::namespace::{Attr, FileId, Kind, NodeId, ROOT};

/// The name of the order file in the mount root.
pub const ORDER_FILE: &str = ".coorfs-order";
/// Its node id: far above any dense node id of the namespace.
pub const ORDER_INO: NodeId = 1 << 62;

/// A hint may be this many bytes plus [`MAX_BYTES_PER_FILE`] per dataset file: every path
/// of a deep tree, with room to repeat some, and a firm bound on the daemon's memory.
const MAX_ORDER_BASE: u64 = 64 << 20;
const MAX_BYTES_PER_FILE: u64 = 128;

/// An open order file: what has been written so far.
#[derive(Debug)]
struct OrderWriter {
    buf: Vec<u8>,
    /// The hint memory `buf` holds.
    charge: HintCharge,
    caller: Caller,
    /// Written to since the last flush: a close with nothing new applies nothing.
    dirty: bool,
    /// Who wrote last: the kernel's lock owner, one per process (its descriptor table),
    /// sent with every direct-I/O write and every flush.
    writer: Option<u64>,
    /// The hint grew past a limit: every later write and the close fail with this errno
    /// (EFBIG or EDQUOT; the kernel may split one write(2) into several requests).
    refused: Option<i32>,
}

impl OrderWriter {
    /// Refuses the hint: nothing of it is applied, what came so far is forgotten (and its
    /// memory given back), and every later write and the close fail with `errno`.
    fn refuse(&mut self, errno: i32) {
        self.buf = Vec::new();
        self.charge.resize(0);
        self.refused = Some(errno);
    }
}

/// The open order files of a mount, and the memory hints may hold.
#[derive(Debug)]
pub(super) struct OrderFiles {
    writers: Mutex<HashMap<u64, OrderWriter>>,
    hints: HintBudget,
    /// Under `--job-key none` (one job for everybody) a hint would steer everyone's prefetch:
    /// only `owner`, the uid that mounted, and root may hint.
    one_job: bool,
    owner: u32,
}

impl OrderFiles {
    /// No order file open yet; hints bounded by `limits`.
    pub fn new(limits: HintLimits, one_job: bool, owner: u32) -> Self {
        OrderFiles {
            writers: Mutex::default(),
            hints: HintBudget::new(limits),
            one_job,
            owner,
        }
    }

    /// The order file's attributes, with the times of a root modified at `time`.
    pub fn attr(time: SystemTime) -> Attr {
        Attr {
            ino: ORDER_INO,
            size: 0,
            blocks: 0,
            atime: time,
            mtime: time,
            ctime: time,
            kind: Kind::File,
            perm: 0o222,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 1 << 20,
        }
    }

    /// Opens the order file as `fh` for `caller`; only for writing.
    pub fn open(&self, fh: u64, flags: i32, caller: Caller) -> Result<Opened, FsError> {
        if flags & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(FsError::Access);
        }
        if self.one_job && caller.uid != 0 && caller.uid != self.owner {
            return Err(FsError::Access);
        }
        self.writers.lock().insert(
            fh,
            OrderWriter {
                buf: Vec::new(),
                charge: self.hints.charge(caller.uid),
                caller,
                dirty: false,
                writer: None,
                refused: None,
            },
        );
        Ok(Opened {
            fh,
            keep_cache: false,
            // Direct I/O: nothing to cache, and the kernel sends the writer's lock owner
            // with each write only in this mode (see `flush`).
            direct_io: true,
            changed: false,
            flush: true,
        })
    }

    /// Writes `data` at `offset` of open order file `fh`, for the writing process `owner`
    /// (its lock owner, if the kernel sent one). A hint past `limit` bytes or past its
    /// writer's share of the hint memory is refused, and counted in `ledger`.
    pub fn write(
        &self,
        fh: u64,
        offset: u64,
        data: &[u8],
        owner: Option<u64>,
        limit: u64,
        ledger: &Ledger,
    ) -> Result<u32, FsError> {
        let mut writers = self.writers.lock();
        let w = writers.get_mut(&fh).ok_or(FsError::BadHandle)?;
        if let Some(errno) = w.refused {
            return Err(FsError::from_errno(errno));
        }
        let end = offset.saturating_add(data.len() as u64);
        if end > limit {
            let pid = w.caller.pid;
            w.refuse(libc::EFBIG);
            drop(writers);
            ledger.hint(false);
            tracing::warn!("order hint of pid {pid} rejected: more than {limit} bytes");
            return Err(FsError::TooLarge);
        }
        // The kernel may split one write(2) into requests that two FUSE threads serve in
        // either order, so each lands at its offset.
        let (start, end) = (offset as usize, end as usize);
        if w.buf.len() < end {
            // Charged by capacity, which doubling growth may make up to twice the length.
            let capacity = match w.buf.capacity() {
                c if c >= end => c,
                c => end.max(c * 2),
            };
            if !w.charge.resize(capacity as u64) {
                let uid = w.caller.uid;
                w.refuse(libc::EDQUOT);
                drop(writers);
                ledger.hint(false);
                tracing::warn!("order hint rejected: {}", HintError::OverBudget { uid });
                return Err(HintError::OverBudget { uid }.into());
            }
            w.buf.reserve_exact(capacity - w.buf.len());
            w.buf.resize(end, 0);
        }
        w.buf[start..end].copy_from_slice(data);
        w.dirty = true;
        w.writer = owner;
        Ok(data.len() as u32)
    }

    /// At a close of order file `fh` by process `owner`: the hint to apply, with its writer,
    /// if `owner` wrote it and wrote since the last close (see [`DatasetFs::flush`]).
    pub fn flush(&self, fh: u64, owner: u64) -> Result<Option<(Vec<u8>, Caller)>, FsError> {
        let mut writers = self.writers.lock();
        let Some(w) = writers.get_mut(&fh) else {
            return Ok(None);
        };
        if let Some(errno) = w.refused {
            return Err(FsError::from_errno(errno));
        }
        if !w.dirty || w.writer.is_some_and(|writer| writer != owner) {
            return Ok(None);
        }
        w.dirty = false;
        // The hint is applied now: its bytes are done with (the order it becomes is
        // charged on its own).
        w.charge.resize(0);
        Ok(Some((std::mem::take(&mut w.buf), w.caller)))
    }

    /// Charges an accepted order of `files` files to its writer `uid`, for as long as the job
    /// keeps it.
    pub fn charge_order(&self, uid: u32, files: usize) -> Result<HintCharge, HintError> {
        let mut charge = self.hints.charge(uid);
        let bytes = (files * std::mem::size_of::<FileId>()) as u64;
        if charge.resize(bytes) {
            Ok(charge)
        } else {
            Err(HintError::OverBudget { uid })
        }
    }

    /// Closes order file `fh`.
    pub fn release(&self, fh: u64) {
        self.writers.lock().remove(&fh);
    }
}

/// Why a hint was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HintError {
    #[error("line {line}: {path:?} is not a file of the dataset (or not one the writer may read)")]
    Unknown { line: usize, path: String },
    #[error("the hints of uid {uid} would hold more than their share of --hint-memory")]
    OverBudget { uid: u32 },
    #[error("line {line}: {what}")]
    Invalid { line: usize, what: &'static str },
    #[error("the hint names no file")]
    Empty,
}

impl From<HintError> for FsError {
    fn from(e: HintError) -> Self {
        match e {
            HintError::Unknown { .. } => FsError::NotFound,
            HintError::OverBudget { .. } => FsError::from_errno(libc::EDQUOT),
            HintError::Invalid { .. } | HintError::Empty => FsError::Invalid(e.to_string()),
        }
    }
}

/// One path of a hint: its line number and its components.
pub type OrderLine<'a> = (usize, Vec<&'a [u8]>);

/// Splits a hint into its paths (relative, as bytes), one at a time, rejecting a line no
/// path could be. Empty lines are skipped; a leading `/` or `./` is ignored. Lazy, so that a
/// hint of a million lines costs no more than the order it becomes.
pub fn order_lines(buf: &[u8]) -> impl Iterator<Item = Result<OrderLine<'_>, HintError>> {
    buf.split(|b| *b == b'\n')
        .enumerate()
        .filter_map(|(i, line)| {
            let line_no = i + 1;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                return None;
            }
            let invalid = |what| {
                Some(Err(HintError::Invalid {
                    line: line_no,
                    what,
                }))
            };
            if line.contains(&0) {
                return invalid("a NUL byte");
            }
            let parts: Vec<&[u8]> = line
                .split(|b| *b == b'/')
                .filter(|p| !p.is_empty() && *p != b".")
                .collect();
            if parts.iter().any(|p| *p == b"..") {
                return invalid("a \"..\" component");
            }
            if parts.is_empty() {
                return invalid("no path");
            }
            Some(Ok((line_no, parts)))
        })
}

/// All of a hint's paths at once (for tests).
#[cfg(test)]
pub fn parse_order(buf: &[u8]) -> Result<Vec<OrderLine<'_>>, HintError> {
    let lines = order_lines(buf).collect::<Result<Vec<_>, _>>()?;
    if lines.is_empty() {
        return Err(HintError::Empty);
    }
    Ok(lines)
}

impl DatasetFs {
    /// The order file's attributes.
    pub(super) fn control_attr(&self) -> Attr {
        let root = self.ns.info(ROOT).map(|i| i.attr);
        OrderFiles::attr(root.map_or(SystemTime::UNIX_EPOCH, |a| a.mtime))
    }

    /// Opens the order file; only for writing.
    pub(super) fn open_order(&self, flags: i32, caller: Caller) -> Result<Opened, FsError> {
        self.orders.open(self.handles.next_fh(), flags, caller)
    }

    /// Writes to node `ino`: only the order file takes writes, in sequence. `owner` is the
    /// writing process's lock owner, if the kernel sent one.
    pub fn write(
        &self,
        ino: NodeId,
        fh: u64,
        offset: u64,
        data: &[u8],
        owner: Option<u64>,
    ) -> Result<u32, FsError> {
        if ino != ORDER_INO {
            return Err(FsError::ReadOnly);
        }
        if self.fast_open {
            return Err(FsError::NotSupported);
        }
        let limit = MAX_ORDER_BASE + MAX_BYTES_PER_FILE * self.ns.file_count() as u64;
        self.orders
            .write(fh, offset, data, owner, limit, &self.ledger)
    }

    /// Truncates node `ino` (only the order file can be, to nothing).
    pub fn truncate(&self, ino: NodeId, size: u64) -> Result<Attr, FsError> {
        if ino != ORDER_INO || size != 0 {
            return Err(FsError::ReadOnly);
        }
        // Without opens the kernel truncates at open(O_TRUNC): the hint fails there.
        if self.fast_open {
            return Err(FsError::NotSupported);
        }
        Ok(self.control_attr())
    }

    /// Called at every `close(2)` of a file, by process `owner` (its lock owner): applies
    /// what was written to the order file.
    ///
    /// Every close of a descriptor of the open file flushes, a forked child's close of its
    /// inherited copy too, and `exec` closes it in every child spawned while the hint is
    /// being written. Only the writer's own close applies the hint; another process's close
    /// would apply half a hint.
    pub fn flush(&self, ino: NodeId, fh: u64, owner: u64) -> Result<(), FsError> {
        if ino != ORDER_INO {
            return Ok(());
        }
        let Some((buf, caller)) = self.orders.flush(fh, owner)? else {
            return Ok(());
        };
        let result = self.resolve_order(&buf, caller).and_then(|order| {
            let charge = self.orders.charge_order(caller.uid, order.len())?;
            Ok((order, charge))
        });
        let now = self.ledger.now();
        let job = self.jobs.get(caller.pid, caller.uid, now);
        let mut j = job.lock();
        match result {
            Ok((order, charge)) => {
                tracing::info!(
                    "{}: order hint of {} files for epoch {}",
                    j.key,
                    order.len(),
                    j.epoch() + u64::from(j.log.tracker().files_in_epoch() > 0)
                );
                j.set_hint(order, charge);
                j.last_access = now;
                let joined = j.following().map(|d| (d, j.key));
                drop(j);
                if let Some((digest, key)) = joined {
                    self.prefetcher.joined(digest, key);
                }
                self.ledger.hint(true);
                self.prefetcher.wake();
                Ok(())
            }
            Err(e) => {
                tracing::warn!("{}: order hint rejected: {e}", j.key);
                drop(j);
                self.ledger.hint(false);
                Err(e.into())
            }
        }
    }

    /// The file ids of a hint's paths, in order, if `caller` may read every one of them.
    /// Names are found in the node table (the scan entered every file; a name it has not
    /// seen is looked up in the source); permissions are checked in the source, as the caller.
    /// Beside the order itself (4 bytes a file) this holds one line's components at a time.
    fn resolve_order(&self, buf: &[u8], caller: Caller) -> Result<Vec<FileId>, HintError> {
        let unknown = |line: usize, parts: &[&[u8]]| HintError::Unknown {
            line,
            path: String::from_utf8_lossy(&parts.join(&b'/')).into_owned(),
        };
        let mut order = Vec::new();
        for parsed in order_lines(buf) {
            let (line, parts) = parsed?;
            let mut at = ROOT;
            for part in &parts {
                let name = std::ffi::OsStr::from_bytes(part);
                at = match self.ns.child(at, name) {
                    Some(id) => id,
                    None => match self.lookup(at, name, caller) {
                        Ok(entry) => entry.attr.ino,
                        Err(_) => return Err(unknown(line, &parts)),
                    },
                };
            }
            match self.ns.info(at) {
                Some(info) if info.attr.kind == Kind::File => {
                    order.push(info.file_id.ok_or_else(|| unknown(line, &parts))?);
                }
                Some(info) if info.attr.kind == Kind::Dir => {
                    return Err(HintError::Invalid {
                        line,
                        what: "not a regular file",
                    });
                }
                // A symlink, a device: the same answer as a missing name.
                _ => return Err(unknown(line, &parts)),
            }
        }
        if order.is_empty() {
            return Err(HintError::Empty);
        }
        let creds = self.creds(caller);
        if !creds.is_daemon() {
            let mut paths = order.iter().map(|id| {
                self.ns
                    .file_node(*id)
                    .and_then(|n| self.ns.path(n))
                    .unwrap_or_default()
            });
            // A check that fails to run refuses the hint (at its first line) rather than let
            // names through unchecked.
            let refused = match self.source.first_unreadable(&mut paths, &creds) {
                Ok(first) => first,
                Err(_) => Some(0),
            };
            if let Some(i) = refused {
                // Name the line of the i-th path, as a missing name would be named.
                let (line, parts) = order_lines(buf)
                    .nth(i)
                    .and_then(Result::ok)
                    .unwrap_or((0, Vec::new()));
                return Err(unknown(line, &parts));
            }
        }
        order.shrink_to_fit();
        Ok(order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_into_components() {
        let got = parse_order(b"a/b.jpg\n\n./c/d.jpg\r\n/e\n").unwrap();
        let got: Vec<(usize, Vec<&[u8]>)> = got;
        assert_eq!(
            got,
            vec![
                (1, vec![&b"a"[..], b"b.jpg"]),
                (3, vec![&b"c"[..], b"d.jpg"]),
                (4, vec![&b"e"[..]])
            ]
        );
    }

    #[test]
    fn rejects_what_no_path_can_be() {
        let cases: &[(&[u8], HintError)] = &[
            (b"", HintError::Empty),
            (b"\n\n", HintError::Empty),
            (
                b"ok\nbad\0name\n",
                HintError::Invalid {
                    line: 2,
                    what: "a NUL byte",
                },
            ),
            (
                b"../etc/passwd",
                HintError::Invalid {
                    line: 1,
                    what: "a \"..\" component",
                },
            ),
            (
                b"a\n/\n",
                HintError::Invalid {
                    line: 2,
                    what: "no path",
                },
            ),
        ];
        for (input, want) in cases {
            assert_eq!(parse_order(input).unwrap_err(), *want, "{input:?}");
        }
    }
}
