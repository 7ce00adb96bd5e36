//! The order file: how a job tells coorfs the order it will read files in (an order hint).
//!
//! A job opens `MOUNT/.coorfs-order` read-only, hands over the paths of its coming epoch,
//! relative to the mount root and one per line, in chunks of [`CHUNK_BYTES`] with the
//! [`HINT_CHUNK`] ioctl, and ends the hint with [`HINT_COMMIT`], whose result is the verdict.
//! The file does not appear in listings and reads as empty. `coorfs hint MOUNT < order.txt`
//! does this from a shell; the Python package's `coorfs.write_order` from a job.
//!
//! Why an ioctl and not `write(2)`: the mount is read-only down to its superblock. On a
//! writable FUSE superblock the kernel forgets a file's access time after every read, so the
//! next `stat` of the file (Python's `open()` makes two) costs a GETATTR round trip: measured,
//! 8,000 files of ~110 KiB read whole by Python, each a cache miss, took 2.8-3.2 s an epoch
//! on a writable superblock and 2.4-2.7 s on a read-only one. A read-only superblock refuses
//! every write (`EROFS`) before it reaches the daemon; an ioctl on a file opened for reading
//! still does. Why not `setxattr(user.coorfs.order)`: refused the same way, and capped at
//! 64 KiB (XATTR_SIZE_MAX), about 2,000 ImageNet paths, while an epoch's order for ImageNet is
//! some 40 MB.
//!
//! A chunk is a buffer of exactly [`CHUNK_BYTES`]: a little-endian `u32` count of the bytes
//! that follow it, then those bytes (the kernel copies the size its command number names, so
//! the size is fixed). Chunks append; a rejected hint fails the chunk or the commit with:
//! - `ENOENT`: a line names no file of the dataset (the message in the log names it);
//! - `EINVAL`: a line holds a NUL byte or a `..`, names a directory, or no line names a path
//!   (at the commit); a chunk whose count exceeds its buffer (at the chunk);
//! - `EFBIG`: the hint is larger than any order of this dataset could be (at a chunk);
//! - `EDQUOT`: the hints this user (or all users) are writing or have given hold more memory
//!   than `--hint-memory` allows (at a chunk or the commit);
//! - `EACCES` at `open`: under `--job-key none` (one job for everybody) only the user who
//!   mounted, or root, may hint;
//!
//! After a rejection the descriptor refuses every chunk until the next commit, which reports
//! the rejection again and starts afresh; after an accepted commit the next chunk starts the
//! next hint. Any other ioctl gets `ENOTTY`, as on every file of the mount.
//!
//! A hint names only files its writer may read: a name the writer could not open (its mode,
//! an ACL, a directory on the way it may not search) gets `ENOENT`, the answer for a name that
//! does not exist, so that hints cannot probe for files a user cannot see.
//!
//! # Memory
//! Hints are the one way a user makes the daemon hold memory of the user's choosing, so
//! they are bounded twice: one hint by the dataset's size (64 MiB plus 128 bytes a file),
//! and all hints, pending (chunks handed over, not yet committed) and accepted (4 bytes a file
//! of a job's order), by `--hint-memory` in total and by half of it per user
//! ([`crate::jobs::HintBudget`]).
//!
//! The hint belongs to the job of the process that opened the order file. Where the kernel
//! opens files itself (`told/`), no OPEN reaches the daemon and every descriptor's ioctls
//! come with handle 0: a hint is then the writing process's, from its first chunk to its
//! commit. The control socket (`control.rs`) takes hints without any file.
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

/// The size of a chunk's buffer: the largest multiple of 4 that an ioctl command number can
/// name (14 bits), so that a 40 MB order takes some 2,500 round trips.
pub const CHUNK_BYTES: usize = 16380;
/// The bytes a chunk carries at most: its buffer less the count in front.
pub const CHUNK_PAYLOAD: usize = CHUNK_BYTES - 4;
/// `_IOW('C', 1, [u8; CHUNK_BYTES])`: append a chunk to the hint of this descriptor.
pub const HINT_CHUNK: u32 = ioc(1, 1, CHUNK_BYTES as u32);
/// `_IO('C', 2)`: apply the hint of this descriptor; the ioctl's result is the verdict.
pub const HINT_COMMIT: u32 = ioc(0, 2, 0);

/// An ioctl command number of type `'C'` (Linux's `_IOC`): direction (1: the caller writes),
/// number, size.
const fn ioc(dir: u32, nr: u32, size: u32) -> u32 {
    (dir << 30) | (size << 16) | ((b'C' as u32) << 8) | nr
}

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
    /// The hint grew past a limit: every later chunk and the commit fail with this.
    refused: Option<HintError>,
}

impl OrderWriter {
    /// Refuses the hint: nothing of it is applied, what came so far is forgotten (and its
    /// memory given back), and every later chunk and the commit fail with `why`.
    fn refuse(&mut self, why: HintError) {
        self.buf = Vec::new();
        self.charge.resize(0);
        self.refused = Some(why);
    }
}

/// The writers of descriptors the kernel opened itself (handle 0) are keyed by their process:
/// this bit, and the pid.
const UNOPENED: u64 = 1 << 63;

/// The key of the writer of order file `fh` written by `caller` (see [`UNOPENED`]).
fn writer_key(fh: u64, caller: Caller) -> u64 {
    match fh {
        0 => UNOPENED | u64::from(caller.pid),
        fh => fh,
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
            perm: 0o444,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 1 << 20,
        }
    }

    /// `caller` may hint (see `--job-key none`).
    fn may_hint(&self, caller: Caller) -> Result<(), FsError> {
        match self.one_job && caller.uid != 0 && caller.uid != self.owner {
            true => Err(FsError::Access),
            false => Ok(()),
        }
    }

    fn writer(&self, caller: Caller) -> OrderWriter {
        OrderWriter {
            buf: Vec::new(),
            charge: self.hints.charge(caller.uid),
            caller,
            refused: None,
        }
    }

    /// Opens the order file as `fh` for `caller`; only for reading (it takes hints by ioctl).
    pub fn open(&self, fh: u64, flags: i32, caller: Caller) -> Result<Opened, FsError> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(FsError::ReadOnly);
        }
        self.may_hint(caller)?;
        self.writers.lock().insert(fh, self.writer(caller));
        Ok(Opened {
            fh,
            keep_cache: false,
            // Nothing to cache: it reads as empty.
            direct_io: true,
            changed: false,
            passthrough: None,
        })
    }

    /// Appends the bytes of `chunk` (a count, then the bytes: see the module header) to the
    /// hint of open order file `fh`. A hint past `limit` bytes or past its writer's share of
    /// the hint memory is refused, and counted in `ledger`.
    pub fn append(
        &self,
        fh: u64,
        caller: Caller,
        chunk: &[u8],
        limit: u64,
        ledger: &Ledger,
    ) -> Result<(), FsError> {
        let data = chunk_bytes(chunk).ok_or_else(|| {
            FsError::Invalid(format!(
                "a hint chunk is {CHUNK_BYTES} bytes, a count and bytes"
            ))
        })?;
        self.append_bytes(writer_key(fh, caller), fh == 0, caller, data, limit, ledger)
    }

    /// Appends `data` to the hint of writer `key` (made for `caller` if `new` allows and there
    /// is none), as [`OrderFiles::append`] says.
    pub fn append_bytes(
        &self,
        key: u64,
        new: bool,
        caller: Caller,
        data: &[u8],
        limit: u64,
        ledger: &Ledger,
    ) -> Result<(), FsError> {
        let mut writers = self.writers.lock();
        if new && !writers.contains_key(&key) {
            self.may_hint(caller)?;
            writers.insert(key, self.writer(caller));
        }
        let w = writers.get_mut(&key).ok_or(FsError::BadHandle)?;
        if let Some(why) = &w.refused {
            return Err(why.clone().into());
        }
        let end = w.buf.len() as u64 + data.len() as u64;
        if end > limit {
            let pid = w.caller.pid;
            w.refuse(HintError::TooLarge { limit });
            drop(writers);
            ledger.hint(false);
            tracing::warn!("order hint of pid {pid} rejected: more than {limit} bytes");
            return Err(FsError::TooLarge);
        }
        let end = end as usize;
        if w.buf.capacity() < end {
            // Charged by capacity, which doubling growth may make up to twice the length.
            let capacity = end.max(w.buf.capacity() * 2);
            if !w.charge.resize(capacity as u64) {
                let uid = w.caller.uid;
                w.refuse(HintError::OverBudget { uid });
                drop(writers);
                ledger.hint(false);
                tracing::warn!("order hint rejected: {}", HintError::OverBudget { uid });
                return Err(HintError::OverBudget { uid }.into());
            }
            w.buf.reserve_exact(capacity - w.buf.len());
        }
        w.buf.extend_from_slice(data);
        Ok(())
    }

    /// Ends the hint of open order file `fh`: the hint to apply, with the caller that opened
    /// the file, or the errno that refused it. Either way the next chunk starts a new hint.
    pub fn commit(&self, fh: u64, caller: Caller) -> Result<(Vec<u8>, Caller), FsError> {
        self.commit_key(writer_key(fh, caller), fh == 0, caller)
    }

    /// Ends the hint of writer `key`; a writer with no handle (`once`) ends with it.
    pub fn commit_key(
        &self,
        key: u64,
        once: bool,
        caller: Caller,
    ) -> Result<(Vec<u8>, Caller), FsError> {
        let mut writers = self.writers.lock();
        if once {
            // A descriptor the kernel opened itself: its hint ends with the commit.
            self.may_hint(caller)?;
            let Some(mut w) = writers.remove(&key) else {
                return Ok((Vec::new(), caller));
            };
            if let Some(why) = w.refused.take() {
                return Err(why.into());
            }
            w.charge.resize(0);
            return Ok((std::mem::take(&mut w.buf), w.caller));
        }
        let w = writers.get_mut(&key).ok_or(FsError::BadHandle)?;
        if let Some(why) = w.refused.take() {
            return Err(why.into());
        }
        // The hint is applied now: its bytes are done with (the order it becomes is
        // charged on its own).
        w.charge.resize(0);
        Ok((std::mem::take(&mut w.buf), w.caller))
    }

    /// Charges an accepted order to its writer `uid`, for as long as the job keeps it: its
    /// file ids and the set of them ([`crate::jobs::Hint::files`]).
    pub fn charge_order(&self, uid: u32, order: &[FileId]) -> Result<HintCharge, HintError> {
        let mut charge = self.hints.charge(uid);
        let ids = std::mem::size_of_val(order);
        let set = crate::jobs::order_files_bits(order).div_ceil(64) * 8;
        let bytes = (ids + set) as u64;
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
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum HintError {
    #[error("the hint is more than {limit} bytes")]
    TooLarge { limit: u64 },
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
            HintError::TooLarge { .. } => FsError::TooLarge,
            HintError::OverBudget { .. } => FsError::OverBudget(e.to_string()),
            HintError::Invalid { .. } | HintError::Empty => FsError::Invalid(e.to_string()),
        }
    }
}

/// The bytes a chunk carries: its count, then that many bytes. None for a buffer that is not
/// [`CHUNK_BYTES`] long or a count past its end.
pub fn chunk_bytes(chunk: &[u8]) -> Option<&[u8]> {
    if chunk.len() != CHUNK_BYTES {
        return None;
    }
    let (count, rest) = chunk.split_at(4);
    let count = u32::from_le_bytes(count.try_into().ok()?) as usize;
    rest.get(..count)
}

/// The chunks that carry `text`, each [`CHUNK_BYTES`] long: what a client hands over.
pub fn chunks(text: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    text.chunks(CHUNK_PAYLOAD).map(|part| {
        let mut chunk = vec![0u8; CHUNK_BYTES];
        chunk[..4].copy_from_slice(&(part.len() as u32).to_le_bytes());
        chunk[4..4 + part.len()].copy_from_slice(part);
        chunk
    })
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

/// The order file as every operation sees it: a control node of the mount, no file of the
/// dataset. [`control`] and [`control_named`] are the one check of a node id or a name against
/// it, and each operation on it is answered here: it has attributes, opens for reading, reads
/// as empty, has no extended attributes, and takes hints by ioctl.
#[derive(Clone, Copy, Debug)]
pub(super) struct OrderNode;

/// The order file, if `ino` names it.
pub(super) fn control(ino: NodeId) -> Option<OrderNode> {
    (ino == ORDER_INO).then_some(OrderNode)
}

/// The order file, if `name` in directory `parent` names it.
pub(super) fn control_named(parent: NodeId, name: &std::ffi::OsStr) -> Option<OrderNode> {
    (parent == ROOT && name == ORDER_FILE).then_some(OrderNode)
}

impl OrderNode {
    /// Its attributes: a read-only file of the mount root's time.
    pub(super) fn attr(self, fs: &DatasetFs) -> Attr {
        let root = fs.tree.ns.info(ROOT).map(|i| i.attr);
        OrderFiles::attr(root.map_or(SystemTime::UNIX_EPOCH, |a| a.mtime))
    }

    /// Opens it; only for reading.
    pub(super) fn open(
        self,
        fs: &DatasetFs,
        flags: i32,
        caller: Caller,
    ) -> Result<Opened, FsError> {
        fs.orders.open(fs.handles.next_fh(), flags, caller)
    }

    /// What a read of it gets: nothing.
    pub(super) fn read(self) -> &'static [u8] {
        &[]
    }

    /// Its extended attributes: none.
    pub(super) fn getxattr(self) -> Result<Vec<u8>, FsError> {
        Err(FsError::NoAttr)
    }

    /// The names of its extended attributes: none.
    pub(super) fn listxattr(self) -> Vec<u8> {
        Vec::new()
    }
}

impl DatasetFs {
    /// An ioctl on node `ino`, open as `fh`, with `data` from the caller: the order file's
    /// [`HINT_CHUNK`] and [`HINT_COMMIT`]; `ENOTTY` for everything else (`isatty` included).
    /// Where the kernel opened the order file itself (handle 0), the hint is the writing
    /// process's.
    pub fn ioctl(
        &self,
        ino: NodeId,
        fh: u64,
        cmd: u32,
        data: &[u8],
        caller: Caller,
    ) -> Result<(), FsError> {
        if control(ino).is_none() || (cmd != HINT_CHUNK && cmd != HINT_COMMIT) {
            return Err(FsError::NotTty);
        }
        if cmd == HINT_CHUNK {
            let limit = self.hint_limit();
            return self
                .orders
                .append(fh, caller, data, limit, &self.reads.ledger);
        }
        let (buf, caller) = self.orders.commit(fh, caller)?;
        self.apply_hint(&buf, caller)
    }

    /// The most bytes one hint of this dataset may take.
    fn hint_limit(&self) -> u64 {
        MAX_ORDER_BASE + MAX_BYTES_PER_FILE * self.tree.ns.file_count() as u64
    }

    /// Takes hint `text` (paths, one a line) from `caller` (the control socket's client),
    /// bounded as the order file's hints are; the verdict as the commit's.
    pub fn hint_from(&self, caller: Caller, text: &mut dyn std::io::Read) -> Result<(), FsError> {
        // A key no order-file writer has: a fresh handle number, with the unopened bit.
        let key = UNOPENED | (self.handles.next_fh() << 32);
        let limit = self.hint_limit();
        let mut buf = vec![0u8; CHUNK_PAYLOAD];
        let appended = loop {
            let n = match text.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(e.into()),
            };
            let appended =
                (self.orders).append_bytes(key, true, caller, &buf[..n], limit, &self.reads.ledger);
            if let Err(e) = appended {
                break Err(e);
            }
        };
        let committed = self.orders.commit_key(key, true, caller);
        appended?;
        let (hint, caller) = committed?;
        self.apply_hint(&hint, caller)
    }

    /// Applies hint `buf` of `caller`: resolves its paths, charges its order, hands it to
    /// the caller's job and wakes the prefetcher; a rejected hint changes nothing.
    fn apply_hint(&self, buf: &[u8], caller: Caller) -> Result<(), FsError> {
        let result = self.resolve_order(buf, caller).and_then(|order| {
            let charge = self.orders.charge_order(caller.uid, &order)?;
            Ok((order, charge))
        });
        let now = self.reads.ledger.now();
        let job = self.reads.jobs.get(caller.pid, caller.uid, now);
        let mut j = job.lock();
        match result {
            Ok((order, charge)) => {
                let files = order.len();
                let (epoch, joined) = j.set_hint(order, charge, caller.pid);
                let with = if joined {
                    ", joining its other processes' orders"
                } else {
                    ""
                };
                tracing::info!(
                    "{}: order hint of {files} files for epoch {epoch}{with}",
                    j.key
                );
                j.last_access = now;
                let joined = j.following().map(|d| (d, j.key));
                drop(j);
                if let Some((digest, key)) = joined {
                    self.reads.prefetcher.joined(digest, key);
                }
                self.reads.ledger.hint(true);
                self.reads.prefetcher.wake();
                Ok(())
            }
            Err(e) => {
                tracing::warn!("{}: order hint rejected: {e}", j.key);
                drop(j);
                self.reads.ledger.hint(false);
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
                at = match self.tree.ns.child(at, name) {
                    Some(id) => id,
                    None => match self.lookup(at, name, caller) {
                        Ok(entry) => entry.attr.ino,
                        Err(_) => return Err(unknown(line, &parts)),
                    },
                };
            }
            match self.tree.ns.info(at) {
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
                self.tree
                    .ns
                    .file_node(*id)
                    .and_then(|n| self.tree.ns.path(n))
                    .unwrap_or_default()
            });
            // A check that fails to run refuses the hint (at its first line) rather than let
            // names through unchecked.
            let refused = match self.tree.source.first_unreadable(&mut paths, &creds) {
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
