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
//! - `EFBIG`: the hint is larger than any order of this dataset could be (at the `write`).
//!
//! The close of the process that wrote applies the hint; a child's close of its inherited
//! copy (at `exec`, say) does not.
//!
//! A rejected hint changes nothing: the job keeps its previous hint (or none), and reads are
//! served as before.

use std::os::unix::ffi::OsStrExt;
use std::time::SystemTime;

use super::{Caller, DatasetFs, FsError, Opened};
use crate::namespace::{Attr, FileId, Kind, NodeId, ROOT};
use crate::stats::Counters;

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
pub(super) struct OrderWriter {
    buf: Vec<u8>,
    caller: Caller,
    /// Written to since the last flush: a close with nothing new applies nothing.
    dirty: bool,
    /// Who wrote last: the kernel's lock owner, one per process (its descriptor table),
    /// sent with every direct-I/O write and every flush.
    writer: Option<u64>,
    /// The hint grew past the limit: every later write and the close fail with EFBIG (the
    /// kernel may split one write(2) into several requests).
    too_large: bool,
}

/// Why a hint was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HintError {
    #[error("line {line}: {path:?} is not a file of the dataset")]
    Unknown { line: usize, path: String },
    #[error("line {line}: {what}")]
    Invalid { line: usize, what: &'static str },
    #[error("the hint names no file")]
    Empty,
}

impl From<HintError> for FsError {
    fn from(e: HintError) -> Self {
        match e {
            HintError::Unknown { .. } => FsError::NotFound,
            HintError::Invalid { .. } | HintError::Empty => FsError::Invalid(e.to_string()),
        }
    }
}

/// A hint's paths: the line number of each and its components.
pub type OrderLines<'a> = Vec<(usize, Vec<&'a [u8]>)>;

/// Splits a hint into its paths (relative, as bytes), rejecting lines no path could be.
/// Empty lines are skipped; a leading `/` or `./` is ignored.
pub fn parse_order(buf: &[u8]) -> Result<OrderLines<'_>, HintError> {
    let mut out = Vec::new();
    for (i, line) in buf.split(|b| *b == b'\n').enumerate() {
        let line_no = i + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        if line.contains(&0) {
            return Err(HintError::Invalid {
                line: line_no,
                what: "a NUL byte",
            });
        }
        let parts: Vec<&[u8]> = line
            .split(|b| *b == b'/')
            .filter(|p| !p.is_empty() && *p != b".")
            .collect();
        if parts.iter().any(|p| *p == b"..") {
            return Err(HintError::Invalid {
                line: line_no,
                what: "a \"..\" component",
            });
        }
        if parts.is_empty() {
            return Err(HintError::Invalid {
                line: line_no,
                what: "no path",
            });
        }
        out.push((line_no, parts));
    }
    if out.is_empty() {
        return Err(HintError::Empty);
    }
    Ok(out)
}

impl DatasetFs {
    /// The order file's attributes.
    pub(super) fn control_attr(&self) -> Attr {
        let root = self.ns.info(ROOT).map(|i| i.attr);
        let time = root.map_or(SystemTime::UNIX_EPOCH, |a| a.mtime);
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

    /// Opens the order file; only for writing.
    pub(super) fn open_order(&self, flags: i32, caller: Caller) -> Result<Opened, FsError> {
        if flags & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(FsError::Access);
        }
        let fh = self
            .next_fh
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.orders.lock().insert(
            fh,
            OrderWriter {
                buf: Vec::new(),
                caller,
                dirty: false,
                writer: None,
                too_large: false,
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

    fn max_order_bytes(&self) -> u64 {
        MAX_ORDER_BASE + MAX_BYTES_PER_FILE * self.ns.file_count() as u64
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
        let mut orders = self.orders.lock();
        let w = orders.get_mut(&fh).ok_or(FsError::BadHandle)?;
        if w.too_large {
            return Err(FsError::TooLarge);
        }
        let limit = self.max_order_bytes();
        let end = offset.saturating_add(data.len() as u64);
        if end > limit {
            let pid = w.caller.pid;
            // Nothing of it is applied: forget what came so far.
            w.buf = Vec::new();
            w.too_large = true;
            drop(orders);
            Counters::add(&self.stats.counters.hints_rejected, 1);
            tracing::warn!("order hint of pid {pid} rejected: more than {limit} bytes");
            return Err(FsError::TooLarge);
        }
        // The kernel may split one write(2) into requests that two FUSE threads serve in
        // either order, so each lands at its offset.
        let (start, end) = (offset as usize, end as usize);
        if w.buf.len() < end {
            w.buf.resize(end, 0);
        }
        w.buf[start..end].copy_from_slice(data);
        w.dirty = true;
        w.writer = owner;
        Ok(data.len() as u32)
    }

    /// Truncates node `ino` (only the order file can be, to nothing).
    pub fn truncate(&self, ino: NodeId, size: u64) -> Result<Attr, FsError> {
        if ino != ORDER_INO || size != 0 {
            return Err(FsError::ReadOnly);
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
        let (buf, caller) = {
            let mut orders = self.orders.lock();
            let Some(w) = orders.get_mut(&fh) else {
                return Ok(());
            };
            if w.too_large {
                return Err(FsError::TooLarge);
            }
            if !w.dirty || w.writer.is_some_and(|writer| writer != owner) {
                return Ok(());
            }
            w.dirty = false;
            (w.buf.clone(), w.caller)
        };
        let result = self.resolve_order(&buf);
        let now = self.stats.now();
        let job = self.jobs.get(caller.pid, caller.uid, now);
        let mut j = job.lock();
        match result {
            Ok(order) => {
                tracing::info!(
                    "{}: order hint of {} files for epoch {}",
                    j.key,
                    order.len(),
                    j.epoch() + u64::from(j.log.tracker().read_in_epoch() > 0)
                );
                j.set_hint(order);
                j.last_access = now;
                drop(j);
                Counters::add(&self.stats.counters.hints_accepted, 1);
                self.wake_prefetcher();
                Ok(())
            }
            Err(e) => {
                tracing::warn!("{}: order hint rejected: {e}", j.key);
                drop(j);
                Counters::add(&self.stats.counters.hints_rejected, 1);
                Err(e.into())
            }
        }
    }

    /// Closes an open of the order file.
    pub fn release_order(&self, fh: u64) -> bool {
        self.orders.lock().remove(&fh).is_some()
    }

    /// The file ids of a hint's paths, in order.
    fn resolve_order(&self, buf: &[u8]) -> Result<Vec<FileId>, HintError> {
        let mut order = Vec::new();
        for (line, parts) in parse_order(buf)? {
            let mut at = ROOT;
            for part in &parts {
                at = match self.lookup(at, std::ffi::OsStr::from_bytes(part)) {
                    Ok(entry) => entry.attr.ino,
                    Err(_) => {
                        return Err(HintError::Unknown {
                            line,
                            path: String::from_utf8_lossy(&parts.join(&b'/')).into_owned(),
                        });
                    }
                };
            }
            match self.ns.info(at).and_then(|i| i.file_id) {
                Some(id) => order.push(id),
                None => {
                    return Err(HintError::Invalid {
                        line,
                        what: "not a regular file",
                    });
                }
            }
        }
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
