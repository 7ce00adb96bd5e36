//! The filesystem core: a read-only mirror of a dataset directory, independent of FUSE.
//!
//! `fuse.rs` turns kernel requests into calls on [`DatasetFs`] and its plain results
//! ([`Entry`], [`Attr`], [`Opened`]) back into replies; tests drive the core directly.
//!
//! Metadata comes from the source's `lstat` and is kept in the [`Namespace`]. An `open`
//! re-checks the file's version (one `lstat`), so a source file that changed since the
//! kernel cached its attributes is served with its new content, and `Opened::changed` asks
//! the adapter to invalidate what the kernel holds.
//!
//! Reads that need the source are handed to a pool of I/O threads and answered from there,
//! so that a slow source never blocks a FUSE thread serving hits.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::MountConfig;
use crate::namespace::{Attr, FileVersion, Kind, Namespace, NodeId, ROOT};
use crate::source::{DatasetSource, DirItem, FsStats};

/// The attribute of the mount root that holds the daemon's process id.
pub const PID_XATTR: &str = "user.coorfs.pid";

/// Everything that can go wrong in the core. `fuse.rs` maps each variant to an errno in one
/// exhaustive `match`.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("not a symbolic link")]
    NotSymlink,
    #[error("read-only file system")]
    ReadOnly,
    #[error("permission denied")]
    Access,
    #[error("stale file handle")]
    BadHandle,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value larger than the buffer")]
    Range,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("operation not supported")]
    NotSupported,
    #[error("source: {0}")]
    Source(#[from] io::Error),
}

/// Who asks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The answer to a lookup: the entry's attributes.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub attr: Attr,
}

/// The answer to an open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// The kernel may keep (and serve from) the pages it cached for this file.
    pub keep_cache: bool,
    /// The kernel must send every read to the daemon and cache nothing.
    pub direct_io: bool,
    /// The source file changed since the kernel was last told its attributes.
    pub changed: bool,
}

/// One directory entry, as `readdir` hands it out.
#[derive(Clone, Debug)]
pub struct DirEntryOut<'a> {
    pub ino: NodeId,
    /// The offset of the next entry.
    pub next: u64,
    pub kind: Kind,
    pub name: &'a OsStr,
    /// Present for `readdirplus`.
    pub attr: Option<Attr>,
}

/// Called with the bytes of a read (or its error), possibly on another thread.
pub type ReadDone = Box<dyn FnOnce(Result<&[u8], FsError>) + Send>;

/// An open file.
#[derive(Debug)]
struct FileHandle {
    rel: Arc<Path>,
    version: FileVersion,
}

/// An open directory: a snapshot of its listing taken at `opendir`.
#[derive(Debug)]
struct DirHandle {
    node: NodeId,
    parent: NodeId,
    items: Vec<DirItem>,
}

/// The core of one mount.
pub struct DatasetFs {
    source: Arc<dyn DatasetSource>,
    ns: Namespace,
    ttl: Duration,
    io: tokio::runtime::Runtime,
    next_fh: AtomicU64,
    files: Mutex<std::collections::HashMap<u64, Arc<FileHandle>>>,
    dirs: Mutex<std::collections::HashMap<u64, Arc<DirHandle>>>,
}

impl std::fmt::Debug for DatasetFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetFs")
            .field("source", &self.source.root())
            .finish_non_exhaustive()
    }
}

impl DatasetFs {
    /// A core over `source`. Fails if the source root cannot be read.
    pub fn new(source: Arc<dyn DatasetSource>, config: &MountConfig) -> io::Result<Self> {
        let root = source.metadata(Path::new(""))?;
        if root.attr.kind != Kind::Dir {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(config.io_threads.max(1))
            .thread_name("coorfs-io")
            .build()?;
        Ok(DatasetFs {
            source,
            ns: Namespace::new(root),
            ttl: config.metadata_ttl,
            io,
            next_fh: AtomicU64::new(1),
            files: Mutex::new(Default::default()),
            dirs: Mutex::new(Default::default()),
        })
    }

    /// How long the kernel may cache entries and attributes.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The node table.
    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    fn rel_path(&self, ino: NodeId) -> Result<PathBuf, FsError> {
        self.ns.path(ino).ok_or(FsError::NotFound)
    }

    /// Finds `name` in directory `parent`.
    pub fn lookup(&self, parent: NodeId, name: &OsStr) -> Result<Entry, FsError> {
        let dir = self.ns.info(parent).ok_or(FsError::NotFound)?;
        if dir.attr.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if let Some(id) = self.ns.child(parent, name) {
            return self.getattr(id).map(|attr| Entry { attr });
        }
        let rel = self.rel_path(parent)?.join(name);
        let meta = self.source.metadata(&rel).map_err(not_found_or_source)?;
        let id = self.ns.insert_child(parent, name, meta);
        self.getattr(id).map(|attr| Entry { attr })
    }

    /// The attributes of node `ino`.
    pub fn getattr(&self, ino: NodeId) -> Result<Attr, FsError> {
        self.ns.info(ino).map(|i| i.attr).ok_or(FsError::NotFound)
    }

    /// The target of symbolic link `ino`.
    pub fn readlink(&self, ino: NodeId) -> Result<PathBuf, FsError> {
        let info = self.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind != Kind::Symlink {
            return Err(FsError::NotSymlink);
        }
        Ok(self.source.read_link(&self.rel_path(ino)?)?)
    }

    /// Opens file `ino` for reading. `flags` are the `open(2)` flags.
    pub fn open(&self, ino: NodeId, flags: i32, _caller: Caller) -> Result<Opened, FsError> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY
            || flags & (libc::O_TRUNC | libc::O_APPEND) != 0
        {
            return Err(FsError::ReadOnly);
        }
        let info = self.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let rel = self.rel_path(ino)?;
        let meta = self.source.metadata(&rel).map_err(not_found_or_source)?;
        let changed = meta.version != info.version && self.ns.refresh(ino, meta);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let handle = FileHandle {
            rel: Arc::from(rel),
            version: meta.version,
        };
        self.files.lock().insert(fh, Arc::new(handle));
        Ok(Opened {
            fh,
            // The dataset is immutable while training: what the kernel cached of this
            // version stays right, unless the version just changed.
            keep_cache: !changed,
            direct_io: false,
            changed,
        })
    }

    /// Reads `size` bytes at `offset` of open file `fh`; `done` receives the bytes.
    pub fn read(&self, fh: u64, offset: u64, size: u32, done: ReadDone) {
        let Some(handle) = self.files.lock().get(&fh).cloned() else {
            return done(Err(FsError::BadHandle));
        };
        let file_size = handle.version.size;
        if offset >= file_size || size == 0 {
            return done(Ok(&[]));
        }
        let len = (size as u64).min(file_size - offset) as usize;
        let source = self.source.clone();
        self.io.spawn_blocking(move || {
            let mut buf = vec![0u8; len];
            match source.read_at(&handle.rel, offset, &mut buf) {
                Ok(n) => done(Ok(&buf[..n])),
                Err(e) => done(Err(FsError::Source(e))),
            }
        });
    }

    /// Closes open file `fh`.
    pub fn release(&self, fh: u64) {
        self.files.lock().remove(&fh);
    }

    /// Opens directory `ino` and takes a snapshot of its listing.
    pub fn opendir(&self, ino: NodeId) -> Result<u64, FsError> {
        let info = self.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let items = self.source.read_dir(&self.rel_path(ino)?)?;
        let parent = self.ns.parent(ino).ok_or(FsError::NotFound)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let handle = DirHandle {
            node: ino,
            parent,
            items,
        };
        self.dirs.lock().insert(fh, Arc::new(handle));
        Ok(fh)
    }

    /// Lists directory `fh` from `offset`, handing entries to `add` until it returns true
    /// (the reply is full). With `plus`, every entry carries its attributes.
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(DirEntryOut<'_>) -> bool,
    ) -> Result<(), FsError> {
        let dir = self
            .dirs
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)?;
        // Offsets 1 and 2 follow "." and ".."; entry i of the snapshot ends at offset i + 3.
        let dots: [(&OsStr, NodeId); 2] =
            [(OsStr::new("."), dir.node), (OsStr::new(".."), dir.parent)];
        for (i, (name, ino)) in dots.iter().enumerate().skip(offset as usize) {
            let attr = if plus {
                Some(self.getattr(*ino)?)
            } else {
                None
            };
            let entry = DirEntryOut {
                ino: *ino,
                next: i as u64 + 1,
                kind: Kind::Dir,
                name,
                attr,
            };
            if add(entry) {
                return Ok(());
            }
        }
        let dir_rel = self.rel_path(dir.node)?;
        let start = offset.saturating_sub(2) as usize;
        for (i, item) in dir.items.iter().enumerate().skip(start) {
            let known = self.ns.child(dir.node, &item.name);
            let (ino, attr) = match (known, plus) {
                (Some(id), false) => (id, None),
                _ => match self.source.metadata(&dir_rel.join(&item.name)) {
                    Ok(meta) => {
                        let id = self.ns.insert_child(dir.node, &item.name, meta);
                        (id, Some(self.getattr(id)?))
                    }
                    // Removed since the snapshot: leave it out, as a fresh listing would.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(FsError::Source(e)),
                },
            };
            let entry = DirEntryOut {
                ino,
                next: i as u64 + 3,
                kind: item.kind,
                name: &item.name,
                attr: if plus { attr } else { None },
            };
            if add(entry) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Closes directory `fh`.
    pub fn releasedir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }

    /// Capacity of the filesystem holding the source.
    pub fn statfs(&self) -> Result<FsStats, FsError> {
        Ok(self.source.statfs()?)
    }

    /// `access(2)`: the read-only mount refuses W_OK; the rest follows the source's modes.
    pub fn access(&self, ino: NodeId, mask: i32, caller: Caller) -> Result<(), FsError> {
        let attr = self.getattr(ino)?;
        if mask & libc::W_OK != 0 {
            return Err(FsError::ReadOnly);
        }
        let want = ((mask & (libc::R_OK | libc::X_OK)) & 0o7) as u16;
        if want == 0 {
            return Ok(());
        }
        let granted = if caller.uid == 0 {
            // root reads anything, and executes anything that anyone may execute.
            let x = if attr.perm & 0o111 != 0 || attr.kind == Kind::Dir {
                1
            } else {
                0
            };
            4 | x
        } else if caller.uid == attr.uid {
            (attr.perm >> 6) & 7
        } else if caller.gid == attr.gid {
            (attr.perm >> 3) & 7
        } else {
            attr.perm & 7
        };
        if granted & want == want {
            Ok(())
        } else {
            Err(FsError::Access)
        }
    }

    /// The value of extended attribute `name` of node `ino`.
    pub fn getxattr(&self, ino: NodeId, name: &OsStr) -> Result<Vec<u8>, FsError> {
        self.getattr(ino)?;
        if ino == ROOT && name == PID_XATTR {
            return Ok(std::process::id().to_string().into_bytes());
        }
        Err(FsError::NoAttr)
    }

    /// The names of the extended attributes of node `ino`, each followed by a NUL.
    pub fn listxattr(&self, ino: NodeId) -> Result<Vec<u8>, FsError> {
        self.getattr(ino)?;
        let mut names = Vec::new();
        if ino == ROOT {
            names.extend_from_slice(PID_XATTR.as_bytes());
            names.push(0);
        }
        Ok(names)
    }
}

/// A missing source entry is ENOENT for the caller; anything else is a source fault.
fn not_found_or_source(e: io::Error) -> FsError {
    if e.kind() == io::ErrorKind::NotFound {
        FsError::NotFound
    } else {
        FsError::Source(e)
    }
}
