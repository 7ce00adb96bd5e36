//! The source, watched: a change made to the source directory after the mount reaches the
//! kernel at once, not when its cached attributes expire.
//!
//! Where the kernel opens files itself (`told/`), no open asks the daemon, so no open can
//! find a file changed: the kernel checks permissions against the modes it cached, and serves
//! the pages it holds. So every directory of the source is watched with inotify (the scan adds
//! each before it lists it, a directory made later is added when it appears), and each change
//! is passed on as it happens:
//! - a file or directory whose attributes or bytes change (`chmod`, `chown`, `setfacl`,
//!   `touch`, a write) is looked at again (`lstat`): the node table takes the new attributes
//!   and the kernel forgets what it cached of the node, its attributes and its pages, so the
//!   next open is checked against the new mode and reads the new bytes;
//! - a name made, removed or renamed in a directory: the kernel forgets the name (its next
//!   lookup asks the daemon) and the directory's attributes.
//!
//! The delay is the watcher thread's wake-up, well under a millisecond: a `chmod` then an
//! open in the next command finds the new mode. If the kernel's queue of events overflows
//! (`IN_Q_OVERFLOW`: a whole tree rewritten at once), changes were lost, and the kernel is told
//! to forget every node, which it then looks up again as it needs them.
//!
//! Each watch costs the kernel about 1 KiB, and a user has `fs.inotify.max_user_watches` of
//! them; a source with more directories than that cannot be watched whole, and its opens keep
//! asking the daemon ([`SourceWatch::failed`]).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use parking_lot::Mutex;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

use super::{Caller, DatasetFs};
use crate::namespace::{Kind, NodeId};
use crate::source::Creds;

/// What a directory's watch reports: changes of its entries and of itself. Symlinks are never
/// followed, so a watch is always of a directory beneath the source root.
fn watch_flags() -> WatchFlags {
    WatchFlags::ATTRIB
        | WatchFlags::MODIFY
        | WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::DONT_FOLLOW
        | WatchFlags::ONLYDIR
        | WatchFlags::EXCL_UNLINK
}

/// The watcher thread's name.
const WATCHER: &str = "coorfs-watch";

/// One change, as the watcher thread hands it to the core.
#[derive(Debug)]
pub(super) struct Change {
    /// The watched directory.
    pub dir: NodeId,
    /// The entry of it that changed; None for the directory itself.
    pub name: Option<OsString>,
    pub what: What,
}

/// What happened to the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum What {
    /// Its attributes or bytes changed.
    Changed,
    /// A name appeared (made or moved in); `dir` says whether it is a directory.
    Appeared { dir: bool },
    /// A name went (removed or moved out).
    Went,
    /// The watched directory itself is gone: its watch ended.
    Gone,
    /// Events were lost.
    Overflow,
}

/// The inotify watches of the source's directories.
#[derive(Debug)]
pub(super) struct SourceWatch {
    fd: OwnedFd,
    /// The watched directory of each watch descriptor.
    dirs: Mutex<HashMap<i32, NodeId>>,
    /// Why not every directory is watched, if one could not be.
    failed: Mutex<Option<String>>,
    /// The watched directories.
    watched: Mutex<std::collections::HashSet<NodeId>>,
    /// Changes were lost once (the queue overflowed): the node table may be behind the source
    /// for good.
    lost: std::sync::atomic::AtomicBool,
}

impl SourceWatch {
    /// A new inotify instance, with nothing watched yet.
    pub fn new() -> std::io::Result<SourceWatch> {
        let fd = inotify::init(CreateFlags::CLOEXEC)?;
        Ok(SourceWatch {
            fd,
            dirs: Mutex::default(),
            failed: Mutex::default(),
            watched: Mutex::default(),
            lost: Default::default(),
        })
    }

    /// Watches directory `node` at `path` (absolute, in the source). A failure is kept: the
    /// source is then not watched whole.
    pub fn add(&self, node: NodeId, path: &Path) {
        match inotify::add_watch(&self.fd, path, watch_flags()) {
            Ok(wd) => {
                self.dirs.lock().insert(wd, node);
                self.watched.lock().insert(node);
            }
            Err(e) => {
                let why = if e == rustix::io::Errno::NOSPC {
                    "more directories than fs.inotify.max_user_watches allows".to_string()
                } else {
                    format!("{}: {e}", path.display())
                };
                let mut failed = self.failed.lock();
                if failed.is_none() {
                    tracing::warn!("the source cannot be watched for changes: {why}");
                    *failed = Some(why);
                }
            }
        }
    }

    /// True if the node table follows every change made in directory `dir`: it is watched
    /// and no change was ever lost.
    pub fn follows(&self, dir: NodeId) -> bool {
        !self.lost.load(std::sync::atomic::Ordering::Relaxed) && self.watched.lock().contains(&dir)
    }

    /// Why some directory of the source is not watched, if one is not.
    pub fn failed(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    /// Waits for the next changes and hands each to `each`; returns on an error of the
    /// inotify descriptor (never in practice: it lives as long as the mount).
    pub fn wait(&self, buf: &mut [std::mem::MaybeUninit<u8>], mut each: impl FnMut(Change)) {
        let mut reader = inotify::Reader::new(&self.fd, buf);
        loop {
            let event = match reader.next() {
                Ok(event) => event,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    tracing::warn!("watching the source: {e}");
                    return;
                }
            };
            let flags = event.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                self.lost.store(true, std::sync::atomic::Ordering::Relaxed);
                each(Change {
                    dir: 0,
                    name: None,
                    what: What::Overflow,
                });
                continue;
            }
            let wd = event.wd();
            let dir = if flags.contains(ReadFlags::IGNORED) {
                let dir = self.dirs.lock().remove(&wd);
                if let Some(dir) = dir {
                    self.watched.lock().remove(&dir);
                }
                dir
            } else {
                self.dirs.lock().get(&wd).copied()
            };
            let Some(dir) = dir else { continue };
            let name = event
                .file_name()
                .map(|n| OsStr::from_bytes(n.to_bytes()).to_os_string())
                .filter(|n| !n.is_empty());
            let what = if flags.intersects(ReadFlags::IGNORED | ReadFlags::DELETE_SELF) {
                What::Gone
            } else if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                What::Appeared {
                    dir: flags.contains(ReadFlags::ISDIR),
                }
            } else if flags.intersects(ReadFlags::DELETE | ReadFlags::MOVED_FROM) {
                What::Went
            } else {
                What::Changed
            };
            each(Change { dir, name, what });
        }
    }
}

impl DatasetFs {
    /// Starts watching the source (see the module header), where the kernel may come to open
    /// files itself and the source is a local directory: before the scan, which adds each
    /// directory it reads.
    pub fn start_watching(self: &std::sync::Arc<Self>) {
        if !self.kernel_may_open()
            || crate::source::object::ObjectUrl::is_url(self.tree.source.root())
        {
            return;
        }
        let watch = match SourceWatch::new() {
            Ok(watch) => std::sync::Arc::new(watch),
            Err(e) => {
                tracing::warn!("the source cannot be watched for changes: inotify: {e}");
                return;
            }
        };
        let _ = self.opener.opens.watch.set(watch.clone());
        let fs = std::sync::Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name(WATCHER.into())
            .spawn(move || {
                let mut buf = vec![std::mem::MaybeUninit::uninit(); 64 << 10];
                watch.wait(&mut buf, |change| {
                    if let Some(fs) = fs.upgrade() {
                        fs.source_changed(change)
                    }
                });
            });
        if let Err(e) = spawned {
            tracing::warn!("no thread to watch the source: {e}");
        }
    }

    /// Watches directory `node` (`rel` in the source) for changes, if the source is watched.
    pub(super) fn watch_dir(&self, node: NodeId, rel: &Path) {
        if let Some(watch) = self.opener.opens.watch.get() {
            watch.add(node, &self.tree.source.root().join(rel));
        }
    }

    /// Passes one change of the source on to the node table and the kernel (see the module
    /// header).
    pub(super) fn source_changed(&self, change: Change) {
        let Change { dir, name, what } = change;
        match (what, name) {
            (What::Overflow, _) => {
                tracing::warn!(
                    "changes to the source came faster than they could be followed: the kernel \
                     forgets every entry and attribute it cached, and asks again"
                );
                for node in self.tree.ns.all_nodes() {
                    self.invalidate(node);
                }
            }
            (What::Gone, _) => {}
            (_, None) => self.restat(dir),
            (What::Changed, Some(name)) => {
                if let Some(child) = self.tree.ns.child(dir, &name) {
                    self.restat(child);
                }
            }
            (What::Appeared { dir: is_dir }, Some(name)) => {
                self.forget_name(dir, &name);
                if let Some(child) = self.tree.ns.child(dir, &name) {
                    self.restat(child);
                }
                if is_dir {
                    self.new_dir(dir, &name);
                }
            }
            (What::Went, Some(name)) => {
                self.forget_name(dir, &name);
                if let Some(child) = self.tree.ns.child(dir, &name) {
                    self.restat(child);
                }
            }
        }
    }

    /// Node `node` is looked at again in the source; the kernel forgets what it cached of it
    /// if it changed (or is gone).
    fn restat(&self, node: NodeId) {
        let Some(rel) = self.tree.ns.path(node) else {
            return;
        };
        match self.look_at(&rel, &Creds::DAEMON) {
            Ok((meta, look)) => {
                self.refresh(node, meta, Some(look));
            }
            Err(_) => self.invalidate(node),
        }
    }

    /// The kernel forgets name `name` in directory `dir`, and the directory's attributes.
    fn forget_name(&self, dir: NodeId, name: &OsStr) {
        self.restat(dir);
        if let Some(invalidate) = self.opener.invalidator.get() {
            invalidate(super::Invalidation::Entry(dir, name.to_os_string()), true);
        }
    }

    /// A directory appeared in `parent`: it enters the node table, is watched, and (where the
    /// kernel opens files) its opens are told.
    fn new_dir(&self, parent: NodeId, name: &OsStr) {
        let root = Caller::default();
        let Ok(entry) = self.lookup(parent, name, root) else {
            return;
        };
        if entry.attr.kind != Kind::Dir {
            return;
        }
        if let Some(rel) = self.tree.ns.path(entry.attr.ino) {
            self.watch_dir(entry.attr.ino, &rel);
            self.opener.opens.mark_later(entry.attr.ino);
        }
    }

    /// The kernel forgets what it cached of node `node`: at once on the source's watcher
    /// thread (which is why it runs), soon on a FUSE thread.
    ///
    /// From a FUSE thread the pages wait for the invalidation thread (a READ this thread is
    /// to answer may hold their locks), but the attributes go at once, before the request that
    /// found the change is answered: an open that found a file grown from 13 to 23 bytes, its
    /// reader then reading 23, left the kernel's size at 13 for the `stat` right after it, the
    /// queued invalidation not sent yet on a loaded machine.
    pub(super) fn invalidate(&self, node: NodeId) {
        let at_once = std::thread::current().name() == Some(WATCHER);
        if let Some(invalidate) = self.opener.invalidator.get() {
            if !at_once {
                invalidate(super::Invalidation::Attrs(node), true);
            }
            invalidate(super::Invalidation::Inode(node), at_once);
        }
    }
}
