//! Lookups, attributes and listings.
//!
//! Metadata comes from the source's `lstat` and is kept in the node table ([`crate::namespace::Namespace`]). An `open`
//! re-checks the file's version (one `lstat`), so a source file that changed since the
//! kernel cached its attributes is served with its new content, and `Opened::changed` asks
//! the adapter to invalidate what the kernel holds.
//!
//! A listing is a snapshot taken at OPENDIR, as the caller: the scan's names while the
//! directory is unchanged since the scan and younger than `--metadata-ttl`, else the
//! source's. Where the kernel opens files itself it opens directories itself too (OPENDIR
//! is answered `ENOSYS`, as OPEN is: the permission check is the kernel's, on the modes the
//! watch keeps current): the snapshot is then taken at the listing's first READDIR, and the
//! kernel keeps the entries it was given until the directory changes, so a dataset listed
//! again (every epoch, by every worker) costs no request. Its entries carry attributes where
//! the kernel asks (READDIRPLUS): over a directory on every listing, since the adapter does not
//! let the kernel choose there (`FUSE_READDIRPLUS_AUTO`).
//!
//! Why every listing: the kernel makes a dentry of each entry it gets attributes for, and a
//! file with a dentry is opened without a LOOKUP. A training job lists the dataset once
//! (`ImageFolder`'s `os.scandir`, a glob) and then opens every file, and with opens made by
//! the kernel itself, a cold tiny file's round trips are its LOOKUP and its READ: with
//! attributes only in a listing's first request (the kernel's choice), 200,000 files of
//! 200-600 B listed and read by 2 processes took 17.5-20.6 s for epoch 1, with them in every
//! request 13.9-14.3 s (native 7.0-8.9 s). The price is paid by a listing that is never
//! followed by opens: `find -type f` over those files, 0.36-0.39 s then, 0.70-0.71 s now
//! (a kernel inode an entry; native 0.10 s).
//!
//! Not over an object store ([`DatasetFs::lists_with_attributes`]): there a read waits on the
//! network for milliseconds and a LOOKUP's round trip is nothing beside it, while a flat
//! prefix of a million objects listed with attributes would hold a million kernel inodes
//! (about a GiB) for one `ls`. The kernel asks for attributes in a listing's first request
//! there, and after lookups show they are used.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::handles::DirHandle;
use super::{Caller, DatasetFs, DirEntryOut, Entry, FsError, order, source_error};
use crate::namespace::{Attr, Kind, NodeId};
use crate::source::Creds;

/// How [`DatasetFs::listed_entry`] finds an entry of a listing.
#[derive(Clone, Copy, Debug)]
struct Listed {
    /// The node id the entry's is likely to be (the one after the previous entry's).
    guess: NodeId,
    /// The kernel wants the entry's attributes (READDIRPLUS).
    plus: bool,
    /// The listing is the scan's, still within `--metadata-ttl`: the node table's
    /// attributes serve.
    kept: bool,
}

impl DatasetFs {
    /// Finds `name` in directory `parent` for `caller`: a fresh `lstat` of the source,
    /// reached with the caller's search permission on every directory on the way; or, where
    /// the source is watched, the node table's entry.
    pub fn lookup(&self, parent: NodeId, name: &OsStr, caller: Caller) -> Result<Entry, FsError> {
        if let Some(order) = order::control_named(parent, name) {
            return Ok(Entry {
                attr: order.attr(self),
            });
        }
        let dir = self.tree.ns.info(parent).ok_or(FsError::NotFound)?;
        if dir.attr.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        // Where the kernel may open files itself the source is watched, and the node table
        // follows every change: a name it holds is answered from it, with no `lstat` (20 us a
        // file, of the reader's wait: a cold tiny file's open is mostly its LOOKUP). The
        // kernel checked the caller's search permission on every directory on the way
        // (`default_permissions`, on the modes the watch keeps current), and the ACLs it does
        // not check were looked for: in the whole source before the kernel was let open
        // files, and in each directory on the way as the scan read it (so from the first
        // seconds of a mount whose scan is still reading).
        if let Some(id) = self.tree.ns.child(parent, name)
            && (self.opener.opens.ready() || self.tree.scan.searchable.lock().contains(&parent))
            && (self.opener.opens.watch.get()).is_some_and(|w| w.follows(parent))
        {
            return self.attr(id).map(|attr| Entry { attr });
        }
        let rel = self.rel_path(parent)?.join(name);
        let (meta, look) = (self.look_at(&rel, &self.creds(caller))).map_err(source_error)?;
        let id = match self.tree.ns.child(parent, name) {
            Some(id) => {
                self.refresh(id, meta, Some(look));
                id
            }
            None => self.tree.ns.insert_child(parent, name, meta),
        };
        self.attr(id).map(|attr| Entry { attr })
    }

    /// The attributes of node `ino`, from a fresh `lstat` of the source: the kernel asks
    /// when those it cached are older than `--metadata-ttl`.
    pub fn getattr(&self, ino: NodeId) -> Result<Attr, FsError> {
        if let Some(order) = order::control(ino) {
            return Ok(order.attr(self));
        }
        let rel = self.rel_path(ino)?;
        let (meta, look) = self.look_at(&rel, &Creds::DAEMON).map_err(source_error)?;
        self.refresh(ino, meta, Some(look));
        self.attr(ino)
    }

    /// [`DatasetFs::getattr`] for the kernel's GETATTR of a file open as `fh` (it asks through
    /// the open file, at its end, whether the file grew). A path that names no file any more
    /// (removed while open) is answered from the open file, as `fstat` of a local descriptor
    /// would be: the read at its end then ends it with 0 bytes, where the path's ENOENT failed
    /// the read (`cat` of a file removed while it was read failed after its last byte).
    pub fn getattr_open(&self, ino: NodeId, fh: u64) -> Result<Attr, FsError> {
        match self.getattr(ino) {
            Err(FsError::NotFound | FsError::Stale) => {}
            other => return other,
        }
        let h = (self.handles.file(fh))
            .filter(|h| h.ino == ino)
            .ok_or(FsError::NotFound)?;
        let meta = h.file.stat().map_err(source_error)?;
        Ok(Attr { ino, ..meta.attr })
    }

    /// The attributes the node table holds for node `ino`.
    fn attr(&self, ino: NodeId) -> Result<Attr, FsError> {
        if let Some(order) = order::control(ino) {
            return Ok(order.attr(self));
        }
        self.tree
            .ns
            .info(ino)
            .map(|i| i.attr)
            .ok_or(FsError::NotFound)
    }

    /// The target of symbolic link `ino`.
    pub fn readlink(&self, ino: NodeId) -> Result<PathBuf, FsError> {
        let info = self.tree.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind != Kind::Symlink {
            return Err(FsError::NotSymlink);
        }
        self.tree
            .source
            .read_link(&self.rel_path(ino)?)
            .map_err(source_error)
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

    /// Opens directory `ino` for `caller` (who must be allowed to read it now) and takes a
    /// snapshot of its listing.
    pub fn opendir(&self, ino: NodeId, caller: Caller) -> Result<u64, FsError> {
        let handle = self.dir_handle(ino, caller)?;
        Ok(self.handles.add_dir(handle))
    }

    /// The handle of an open of directory `ino` by `caller`: a snapshot of its listing.
    pub(super) fn dir_handle(&self, ino: NodeId, caller: Caller) -> Result<DirHandle, FsError> {
        let info = self.tree.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let mut listing = self
            .tree
            .source
            .open_dir(&self.rel_path(ino)?, &self.creds(caller))
            .map_err(source_error)?;
        // The scan's listing while the directory is unchanged and younger than
        // --metadata-ttl; else the source's.
        let kept_until = match self
            .tree
            .ns
            .kept_listing(ino, &listing.meta.version, self.tree.ttl)
        {
            Some((names, at)) => {
                listing.names = names;
                Some(at + self.tree.ttl)
            }
            None => {
                listing.read_names().map_err(source_error)?;
                None
            }
        };
        let parent = self.tree.ns.parent(ino).ok_or(FsError::NotFound)?;
        Ok(DirHandle {
            node: ino,
            parent,
            listing,
            kept_until,
        })
    }

    /// Whether every listing should hand out each entry's attributes (see the module header):
    /// yes but over an object store.
    pub fn lists_with_attributes(&self) -> bool {
        !crate::source::object::ObjectUrl::is_url(self.tree.source.root())
    }

    /// Lists directory `fh` from `offset`, handing entries to `add` until it returns true
    /// (the reply is full). With `plus`, every entry carries its attributes.
    pub fn readdir(
        &self,
        (fh, ino, caller): (u64, NodeId, Caller),
        offset: u64,
        plus: bool,
        mut add: impl FnMut(DirEntryOut<'_>) -> bool,
    ) -> Result<(), FsError> {
        let dir = self.listing_for(fh, ino, caller, offset)?;
        let mut added = false;
        let mut add = |entry| {
            added = true;
            add(entry)
        };
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
                ttl: None,
            };
            if add(entry) {
                return Ok(());
            }
        }
        let start = offset.saturating_sub(2) as usize;
        // Entries of a kept listing carry the attributes the scan read, for what is left of
        // --metadata-ttl since: no lstat each.
        let kept_ttl = dir
            .kept_until
            .and_then(|until| until.checked_duration_since(Instant::now()))
            .filter(|left| !left.is_zero());
        let mut guess = 0;
        for (i, (name, listed_kind)) in dir.listing.names.iter().enumerate().skip(start) {
            let how = Listed {
                guess,
                plus,
                kept: kept_ttl.is_some(),
            };
            let Some((ino, kind, attr)) = self.listed_entry(&dir, name, *listed_kind, how)? else {
                continue;
            };
            guess = ino + 1;
            let entry = DirEntryOut {
                ino,
                next: i as u64 + 3,
                kind,
                name,
                attr,
                ttl: kept_ttl,
            };
            if add(entry) {
                return Ok(());
            }
        }
        if fh == 0 && !added {
            self.handles.end_unopened_dir(ino);
        }
        Ok(())
    }

    /// The listing a READDIR of directory `ino` at `offset` reads: that of its open `fh` (a
    /// predecessor's taken again), or where the kernel opened the directory itself (`fh` 0),
    /// the one taken at the listing's start (see `handles.rs`, `Unopened`).
    fn listing_for(
        &self,
        fh: u64,
        ino: NodeId,
        caller: Caller,
        offset: u64,
    ) -> Result<Arc<DirHandle>, FsError> {
        if fh != 0 {
            self.adopt_dir(fh, ino, caller);
            return self.handles.dir(fh).ok_or(FsError::BadHandle);
        }
        if offset > 0
            && let Some(listing) = self.handles.unopened_dir(ino)
        {
            return Ok(listing);
        }
        let listing = Arc::new(self.dir_handle(ino, caller)?);
        self.handles.keep_unopened_dir(ino, listing.clone());
        Ok(listing)
    }

    /// Entry `name` of the listing of `dir` (of kind `listed_kind`, where the listing says):
    /// its node, kind and (`how.plus`) attributes. An entry's `lstat` only when the kernel
    /// asks for its attributes or coorfs does not know it yet; None for one gone since the
    /// listing was read.
    fn listed_entry(
        &self,
        dir: &DirHandle,
        name: &OsStr,
        listed_kind: Option<Kind>,
        how: Listed,
    ) -> Result<Option<(NodeId, Kind, Option<Attr>)>, FsError> {
        let known = self.tree.ns.child_near(dir.node, name, how.guess);
        Ok(Some(match (known, how.plus) {
            (Some(id), true) if how.kept => {
                let attr = self.attr(id)?;
                (id, attr.kind, Some(attr))
            }
            (Some(id), false) => {
                let kind = listed_kind
                    .or_else(|| self.tree.ns.info(id).map(|i| i.attr.kind))
                    .unwrap_or(Kind::File);
                (id, kind, None)
            }
            (Some(id), true) => {
                let Ok(meta) = dir.listing.stat(name) else {
                    return Ok(None);
                };
                // A listing's look, judged by its ctime alone.
                self.refresh(id, meta, None);
                (id, meta.attr.kind, Some(self.attr(id)?))
            }
            (None, _) => {
                let Ok(meta) = dir.listing.stat(name) else {
                    return Ok(None);
                };
                let id = self.tree.ns.insert_child(dir.node, name, meta);
                let attr = how.plus.then(|| self.attr(id)).transpose()?;
                (id, meta.attr.kind, attr)
            }
        }))
    }

    /// Closes directory `fh`.
    pub fn releasedir(&self, fh: u64) {
        self.handles.remove_dir(fh);
    }
}
