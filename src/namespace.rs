//! The node table: FUSE node ids for the entries of the source tree.
//!
//! The dataset is immutable while a job trains on it, so a node, once created, lives as long
//! as the mount: the table only grows (FORGET is ignored) and a node id is a dense index into
//! a `Vec`. That keeps `getattr` and `open` to one read-locked index, and gives every regular
//! file a dense [`FileId`] for the per-epoch bitmaps and the prefetcher.
//!
//! Memory is the point of the layout: a dataset of 1.28 M tiny files must not cost more in
//! metadata than in data. A node is one packed 96-byte record (times as nanoseconds, the
//! device as an index into the few devices seen, ids as `u32`); its name lives in one arena
//! of bytes; children are found through a hash table of bare `u32` node ids keyed by the
//! hash of `(parent, name)`, with names compared in the arena on a hit (hashbrown's
//! `HashTable`, about 5 bytes an entry). With the list of files (4 bytes each) and the
//! listings the scan keeps (4 bytes a child, see [`Namespace::keep_listing`]), a node costs
//! about 110 bytes plus its name: 130 bytes for an ImageNet name of 20, where the previous
//! table of structs, `Arc<OsStr>` names and a `HashMap` took about 300. [`Namespace::memory`]
//! reports what it holds.
//!
//! Nothing here does I/O. Callers stat the source first and then insert, so no lock is ever
//! held across a system call.

use std::collections::HashMap;
// foldhash (hashbrown's default), not SipHash: every lookup hashes (parent, name), and a successor
// daemon hashes every node again as it replays the journal.
use hashbrown::DefaultHashBuilder as RandomState;
use std::ffi::OsStr;
use std::ffi::OsString;
use std::hash::BuildHasher;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use hashbrown::HashTable;
use parking_lot::RwLock;

/// A FUSE node id. 1 is the root (the kernel's `FUSE_ROOT_ID`).
pub type NodeId = u64;
/// The node id of the mount's root.
pub const ROOT: NodeId = 1;

/// A directory's entries: each name, and its kind where known.
pub type DirNames = Vec<(OsString, Option<Kind>)>;

/// A dense index over the regular files of the dataset, in the order they were first seen.
pub type FileId = u32;

/// The kind of a source entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl Kind {
    /// The kind of a file mode's type bits.
    pub fn from_mode(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDevice,
            libc::S_IFBLK => Kind::BlockDevice,
            _ => Kind::File,
        }
    }
}

/// Everything the kernel is told about an entry, copied from the source's `lstat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// The node id (reported as `st_ino`).
    pub ino: NodeId,
    /// Bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: Kind,
    /// Permission bits (`st_mode & 07777`).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    /// Preferred I/O size in bytes.
    pub blksize: u32,
}

/// The identity of one version of a source file. Cache keys carry it, so a source file whose
/// size, mtime or ctime changed is a different key: a miss, never stale bytes. The ctime
/// catches what the others miss: a file rewritten in place at the same size with its mtime
/// set back (`touch -r`), since no user can set a ctime. It also changes with `chmod`,
/// `chown`, links and attributes, which then cost a refetch: correctness first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileVersion {
    pub dev: u64,
    pub ino: u64,
    /// Bytes.
    pub size: u64,
    /// Modification time in nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Status-change time in nanoseconds since the epoch.
    pub ctime_ns: i64,
}

#[cfg(test)]
impl FileVersion {
    /// A version for tests: file `ino` of `size` bytes, on device 1, never modified.
    pub fn of_test(ino: u64, size: u64) -> Self {
        FileVersion {
            dev: 1,
            ino,
            size,
            mtime_ns: 0,
            ctime_ns: 0,
        }
    }
}

/// What the source's `lstat` says of an entry: its attributes (with `ino` still unset) and
/// its version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceMeta {
    pub attr: Attr,
    pub version: FileVersion,
}

/// One entry, packed: about 96 bytes, with its name in the table's name arena. Times are
/// nanoseconds since the epoch; the device is an index into the table's few devices.
#[derive(Debug)]
struct Node {
    name_at: u64,
    size: u64,
    blocks: u64,
    ino: u64,
    atime_ns: i64,
    mtime_ns: i64,
    ctime_ns: i64,
    parent: u32,
    /// [`NO_FILE`] unless the node is (or was) a regular file.
    file_id: u32,
    /// Type and permission bits, as `st_mode`.
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    rdev: u32,
    blksize: u32,
    name_len: u16,
    dev: u16,
}

const NO_FILE: u32 = u32::MAX;

impl Node {
    /// A node of `parent` whose name is `name_len` bytes at `name_at` of the arena, with no
    /// attributes yet ([`Table::set`] gives them).
    fn named(parent: u32, name_at: u64, name_len: u16, file_id: u32) -> Node {
        Node {
            name_at,
            size: 0,
            blocks: 0,
            ino: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            parent,
            file_id,
            mode: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 0,
            name_len,
            dev: 0,
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    /// Indexed by node id; index 0 is a placeholder so that ids start at 1.
    nodes: Vec<Node>,
    /// Every name, back to back.
    names: Vec<u8>,
    /// The devices seen (a dataset spans one or a few): `Node::dev` indexes this.
    devs: Vec<u64>,
    /// Node ids by the hash of (parent, name).
    children: HashTable<u32>,
    /// Indexed by file id.
    files: Vec<u32>,
    /// Directories whose listing the table can serve (see [`Namespace::keep_listing`]).
    listings: HashMap<u32, KeptListing>,
    /// The children those listings hold, all told.
    kept_children: usize,
    /// The last look recorded of recent nodes ([`Look`]), by node id modulo [`LOOK_SLOTS`]:
    /// `(id, look)`, empty until one is recorded there.
    looks: Vec<(u32, u64)>,
}

/// Nodes whose last look is remembered at once ([`Table::looks`]): two looks of one node are
/// ordered by this only while both are in flight (milliseconds), so a node whose slot another
/// took since is a node not looked at for that long.
const LOOK_SLOTS: usize = 4096;

/// When a look at the source (an `lstat`, an open's `fstat`) began: a number from
/// [`Namespace::look`], taken before the system call, larger for each later look. Two looks
/// of one file that land out of order are told apart by it where the file's times cannot: a
/// file written twice within the kernel's coarse clock tick, with nobody asking its times in
/// between, keeps one ctime and mtime for both contents (the kernel's multigrain timestamps
/// stay coarse while nobody looks), so a look at the first content landing after one at the
/// second (the watch's `lstat`, late on a loaded machine) is not older by its ctime, and set
/// a file read whole at 23 bytes back to 13.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Look(u64);

/// The children of a directory as the scan read them, and the directory's version then.
#[derive(Debug)]
struct KeptListing {
    version: FileVersion,
    at: Instant,
    children: Box<[u32]>,
}

impl Table {
    fn name(&self, id: u32) -> &OsStr {
        let n = &self.nodes[id as usize];
        let at = n.name_at as usize;
        OsStr::from_bytes(&self.names[at..at + n.name_len as usize])
    }

    fn dev_index(&mut self, dev: u64) -> u16 {
        match self.devs.iter().position(|d| *d == dev) {
            Some(i) => i as u16,
            None => {
                // More than 65,535 devices under one dataset is not a dataset; the last
                // slot is shared then, which only weakens the version check of those files.
                if self.devs.len() < u16::MAX as usize {
                    self.devs.push(dev);
                }
                (self.devs.len() - 1) as u16
            }
        }
    }

    fn info(&self, id: NodeId) -> NodeInfo {
        let n = &self.nodes[id as usize];
        let dev = self.devs[n.dev as usize];
        NodeInfo {
            attr: Attr {
                ino: id,
                size: n.size,
                blocks: n.blocks,
                atime: time_of(n.atime_ns),
                mtime: time_of(n.mtime_ns),
                ctime: time_of(n.ctime_ns),
                kind: Kind::from_mode(n.mode),
                perm: (n.mode & 0o7777) as u16,
                nlink: n.nlink,
                uid: n.uid,
                gid: n.gid,
                rdev: n.rdev,
                blksize: n.blksize,
            },
            version: FileVersion {
                dev,
                ino: n.ino,
                size: n.size,
                mtime_ns: n.mtime_ns,
                ctime_ns: n.ctime_ns,
            },
            file_id: (n.file_id != NO_FILE).then_some(n.file_id),
        }
    }

    /// Writes `meta` into node `id` unless it is a look at the same file taken before the one
    /// recorded (an older ctime): stale, never recorded over a newer one. Returns true if the
    /// file's version changed. Which paths land late: the watch's `lstat`, delayed on a loaded
    /// machine, after an open's (a file that grew from 13 to 23 bytes was read whole, then
    /// listed at 13); and the scan's listing of a directory, taken as the mount begins and
    /// entered after a first read has looked again.
    ///
    /// A `look` (when it began) is also refused if a later one was recorded, whatever the
    /// times say (see [`Look`]); a listing's (None) is judged by its ctime alone.
    fn set_unless_older(&mut self, id: u32, meta: &SourceMeta, look: Option<Look>) -> bool {
        let n = &self.nodes[id as usize];
        if n.ino == meta.version.ino && meta.version.ctime_ns < n.ctime_ns {
            return false;
        }
        let Some(Look(look)) = look else {
            return self.set(id, meta);
        };
        if self.looks.is_empty() {
            self.looks = vec![(u32::MAX, 0); LOOK_SLOTS];
        }
        let slot = &mut self.looks[id as usize % LOOK_SLOTS];
        if slot.0 == id && slot.1 > look {
            return false;
        }
        *slot = (id, look);
        self.set(id, meta)
    }

    /// Writes `meta` into node `id`. Returns true if the file's version changed.
    fn set(&mut self, id: u32, meta: &SourceMeta) -> bool {
        let dev = self.dev_index(meta.version.dev);
        let a = &meta.attr;
        let n = &mut self.nodes[id as usize];
        let changed = n.ino != meta.version.ino
            || n.dev != dev
            || n.size != meta.version.size
            || n.mtime_ns != meta.version.mtime_ns
            || n.ctime_ns != meta.version.ctime_ns;
        n.size = a.size;
        n.blocks = a.blocks;
        n.ino = meta.version.ino;
        n.atime_ns = nanos_of(a.atime);
        n.mtime_ns = meta.version.mtime_ns;
        n.ctime_ns = meta.version.ctime_ns;
        n.mode = mode_of(a);
        n.nlink = a.nlink;
        n.uid = a.uid;
        n.gid = a.gid;
        n.rdev = a.rdev;
        n.blksize = a.blksize;
        n.dev = dev;
        changed
    }
}

/// The attributes of an entry of kind `kind` not read yet (see [`Namespace::replay`]).
fn unknown(kind: Kind) -> SourceMeta {
    SourceMeta {
        attr: Attr {
            ino: 0,
            size: 0,
            blocks: 0,
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            kind,
            perm: 0,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        },
        version: FileVersion {
            dev: 0,
            ino: 0,
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        },
    }
}

fn mode_of(a: &Attr) -> u32 {
    let kind = match a.kind {
        Kind::File => libc::S_IFREG,
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::Fifo => libc::S_IFIFO,
        Kind::Socket => libc::S_IFSOCK,
        Kind::CharDevice => libc::S_IFCHR,
        Kind::BlockDevice => libc::S_IFBLK,
    };
    kind | u32::from(a.perm)
}

fn nanos_of(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

fn time_of(ns: i64) -> SystemTime {
    let d = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        SystemTime::UNIX_EPOCH + d
    } else {
        SystemTime::UNIX_EPOCH - d
    }
}

/// A node's current view, as the filesystem core needs it.
#[derive(Clone, Copy, Debug)]
pub struct NodeInfo {
    pub attr: Attr,
    pub version: FileVersion,
    pub file_id: Option<FileId>,
}

/// Told of every node the table gives out, in order, under the table's lock: the journal a
/// successor daemon replays to know the node ids the kernel holds (`handover/state/`).
pub trait NodeLog: Send + Sync + std::fmt::Debug {
    fn node_added(&self, id: NodeId, parent: NodeId, kind: Kind, name: &[u8]);
}

/// The node table of one mount.
#[derive(Debug)]
pub struct Namespace {
    table: RwLock<Table>,
    hasher: RandomState,
    log: std::sync::OnceLock<std::sync::Arc<dyn NodeLog>>,
    /// The next [`Look`].
    looks: std::sync::atomic::AtomicU64,
}

impl Namespace {
    /// A table holding only the root, described by `root`.
    pub fn new(root: SourceMeta) -> Self {
        let mut table = Table::default();
        for _ in 0..=ROOT {
            table.nodes.push(Node::named(ROOT as u32, 0, 0, NO_FILE));
        }
        table.set(0, &root);
        table.set(ROOT as u32, &root);
        Namespace {
            table: RwLock::new(table),
            hasher: RandomState::default(),
            log: std::sync::OnceLock::new(),
            looks: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// A look at the source begins: take this before its system call, and hand it to
    /// [`Namespace::refresh`] with what it found.
    pub fn look(&self) -> Look {
        Look(
            self.looks
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// From now on every node given out is told to `log`.
    pub fn log_to(&self, log: std::sync::Arc<dyn NodeLog>) {
        let _ = self.log.set(log);
    }

    /// Enters the nodes a previous daemon of this mount gave out, `(id, parent, kind, name)`
    /// in the order it gave them, so that every node id the kernel holds means the same entry
    /// again. Their attributes are not known yet: each reads as empty until a lookup, getattr,
    /// open or the scan reads the source's (each of those reads it anyway). Fails, naming the
    /// first, if a node would get another id than it had (the table was not empty).
    pub fn replay(
        &self,
        nodes: impl IntoIterator<Item = (NodeId, NodeId, Kind, Vec<u8>)>,
    ) -> Result<usize, String> {
        let mut table = self.table.write();
        let mut n = 0;
        for (id, parent, kind, name) in nodes {
            let name = OsStr::from_bytes(&name);
            if parent as usize >= table.nodes.len() {
                return Err(format!("node {id}: parent {parent} not known yet"));
            }
            let got = self.insert_into(&mut table, parent, name, unknown(kind));
            if got != id {
                return Err(format!("node {id} ({}) came back as {got}", name.display()));
            }
            n += 1;
        }
        Ok(n)
    }

    fn hash(&self, parent: u32, name: &OsStr) -> u64 {
        self.hasher.hash_one((parent, name.as_bytes()))
    }

    /// The child `name` of `parent`, if it has been inserted.
    pub fn child(&self, parent: NodeId, name: &OsStr) -> Option<NodeId> {
        let parent = u32::try_from(parent).ok()?;
        let hash = self.hash(parent, name);
        let table = self.table.read();
        find_child(&table, hash, parent, name).map(NodeId::from)
    }

    /// The child `name` of `parent`, looked for at node `guess` first: a listing walks a
    /// directory in the order the scan entered it, each directory's entries one after the
    /// other, so the node after the previous entry's is most often the one, and the hash
    /// lookup (a cache miss or two in a table of a million nodes) is saved. Names are unique
    /// in a directory and nodes are never removed, so a node with this parent and name is
    /// the child.
    pub fn child_near(&self, parent: NodeId, name: &OsStr, guess: NodeId) -> Option<NodeId> {
        let parent = u32::try_from(parent).ok()?;
        let table = self.table.read();
        if guess > ROOT
            && let Some(node) = table.nodes.get(guess as usize)
            && node.parent == parent
            && table.name(guess as u32) == name
        {
            return Some(guess);
        }
        find_child(&table, self.hash(parent, name), parent, name).map(NodeId::from)
    }

    /// Inserts the child `name` of `parent` (or refreshes it if present) and returns its id.
    pub fn insert_child(&self, parent: NodeId, name: &OsStr, meta: SourceMeta) -> NodeId {
        let mut table = self.table.write();
        self.insert_into(&mut table, parent, name, meta)
    }

    /// Inserts the children of `parent` as [`Namespace::insert_child`] does, under one lock,
    /// and returns their ids in order: a directory of the scan at a time.
    pub fn insert_children<'a>(
        &self,
        parent: NodeId,
        children: impl IntoIterator<Item = (&'a OsStr, SourceMeta)>,
    ) -> Vec<NodeId> {
        let mut table = self.table.write();
        children
            .into_iter()
            .map(|(name, meta)| self.insert_into(&mut table, parent, name, meta))
            .collect()
    }

    fn insert_into(
        &self,
        table: &mut Table,
        parent: NodeId,
        name: &OsStr,
        meta: SourceMeta,
    ) -> NodeId {
        let parent = parent as u32;
        let hash = self.hash(parent, name);
        if let Some(id) = find_child(table, hash, parent, name) {
            table.set_unless_older(id, &meta, None);
            return id.into();
        }
        let id = table.nodes.len() as u32;
        let file_id = if meta.attr.kind == Kind::File {
            let file_id = table.files.len() as u32;
            table.files.push(id);
            file_id
        } else {
            NO_FILE
        };
        let name_at = table.names.len() as u64;
        table.names.extend_from_slice(name.as_bytes());
        // Linux names are at most 255 bytes (NAME_MAX).
        let node = Node::named(parent, name_at, name.len() as u16, file_id);
        table.nodes.push(node);
        table.set(id, &meta);
        let Table {
            nodes,
            names,
            children,
            ..
        } = table;
        let hasher = &self.hasher;
        children.insert_unique(hash, id, |&other| {
            let n = &nodes[other as usize];
            let at = n.name_at as usize;
            hasher.hash_one((n.parent, &names[at..at + n.name_len as usize]))
        });
        if let Some(log) = self.log.get() {
            log.node_added(id.into(), parent.into(), meta.attr.kind, name.as_bytes());
        }
        id.into()
    }

    /// Keeps `children` (in the order the source listed them) as directory `dir`'s listing,
    /// read at `at` while the source directory was `version`: an entry added, removed or
    /// renamed since changes the directory's change time, and the listing is read again.
    pub fn keep_listing(
        &self,
        dir: NodeId,
        version: FileVersion,
        at: Instant,
        children: &[NodeId],
    ) {
        let Ok(dir) = u32::try_from(dir) else {
            return;
        };
        let children = children.iter().map(|&c| c as u32).collect();
        let kept = KeptListing {
            version,
            at,
            children,
        };
        let mut table = self.table.write();
        table.kept_children += kept.children.len();
        if let Some(old) = table.listings.insert(dir, kept) {
            table.kept_children -= old.children.len();
        }
    }

    /// The names and kinds of directory `dir`'s kept listing, and when it was read, if it
    /// was kept while the source directory was `version` and is younger than `ttl`. One
    /// that is not is dropped: the caller reads the source instead.
    pub fn kept_listing(
        &self,
        dir: NodeId,
        version: &FileVersion,
        ttl: Duration,
    ) -> Option<(DirNames, Instant)> {
        let dir = u32::try_from(dir).ok()?;
        {
            let table = self.table.read();
            let kept = table.listings.get(&dir)?;
            if kept.version == *version && kept.at.elapsed() < ttl {
                let names = kept
                    .children
                    .iter()
                    .map(|&c| {
                        let kind = Kind::from_mode(table.nodes[c as usize].mode);
                        (table.name(c).to_os_string(), Some(kind))
                    })
                    .collect();
                return Some((names, kept.at));
            }
        }
        let mut table = self.table.write();
        if let Some(old) = table.listings.remove(&dir) {
            table.kept_children -= old.children.len();
        }
        None
    }

    /// The node's attributes, version and file id.
    pub fn info(&self, id: NodeId) -> Option<NodeInfo> {
        let table = self.table.read();
        (id >= ROOT && (id as usize) < table.nodes.len()).then(|| table.info(id))
    }

    /// Replaces the node's attributes with a fresh `lstat` of the source. Returns true if the
    /// file's version changed (its size, mtime, ctime or identity).
    /// `look` says when the look began ([`Namespace::look`]); None for a listing's, which
    /// only an older ctime refuses.
    pub fn refresh(&self, id: NodeId, meta: SourceMeta, look: Option<Look>) -> bool {
        let mut table = self.table.write();
        if id < ROOT || id as usize >= table.nodes.len() {
            return false;
        }
        // A file that became a directory (or the reverse) keeps its file id; the version
        // change makes its cached bytes unreachable, which is all that correctness needs.
        table.set_unless_older(id as u32, &meta, look)
    }

    /// The node's parent (the root is its own parent).
    pub fn parent(&self, id: NodeId) -> Option<NodeId> {
        let table = self.table.read();
        table
            .nodes
            .get(id as usize)
            .filter(|_| id >= ROOT)
            .map(|n| NodeId::from(n.parent))
    }

    /// The node's path relative to the source root (empty for the root).
    pub fn path(&self, id: NodeId) -> Option<PathBuf> {
        let table = self.table.read();
        if id < ROOT || id as usize >= table.nodes.len() {
            return None;
        }
        let mut parts = Vec::new();
        let mut at = id as u32;
        while at != ROOT as u32 {
            parts.push(table.name(at));
            at = table.nodes[at as usize].parent;
        }
        let mut path = PathBuf::new();
        for part in parts.iter().rev() {
            path.push(part);
        }
        Some(path)
    }

    /// The node of file `file_id`.
    pub fn file_node(&self, file_id: FileId) -> Option<NodeId> {
        self.table
            .read()
            .files
            .get(file_id as usize)
            .map(|n| NodeId::from(*n))
    }

    /// Every file id, sorted by the source's inode number: a cheap stand-in for on-disk
    /// order on filesystems that allocate inodes near their data (ext4, XFS).
    pub fn files_in_inode_order(&self) -> Vec<FileId> {
        let table = self.table.read();
        let mut files: Vec<(u64, FileId)> = table
            .files
            .iter()
            .enumerate()
            .map(|(id, node)| (table.nodes[*node as usize].ino, id as FileId))
            .collect();
        files.sort_unstable();
        files.into_iter().map(|(_, id)| id).collect()
    }

    /// Every node id.
    pub fn all_nodes(&self) -> Vec<NodeId> {
        (ROOT..self.table.read().nodes.len() as NodeId).collect()
    }

    /// Every directory's node id.
    pub fn dirs(&self) -> Vec<NodeId> {
        let table = self.table.read();
        (table.nodes.iter().enumerate().skip(ROOT as usize))
            .filter(|(_, n)| Kind::from_mode(n.mode) == Kind::Dir)
            .map(|(id, _)| id as NodeId)
            .collect()
    }

    /// How many regular files have been seen so far.
    pub fn file_count(&self) -> usize {
        self.table.read().files.len()
    }

    /// Gives back the room the table's vectors grew into: called once the scan has entered
    /// the whole dataset, after which the table grows only by what lookups find new.
    pub fn shrink(&self) {
        let mut t = self.table.write();
        t.nodes.shrink_to_fit();
        t.names.shrink_to_fit();
        t.files.shrink_to_fit();
    }

    /// Bytes the table holds (its vectors' capacities and the child index), for the memory
    /// budget.
    pub fn memory(&self) -> usize {
        let t = self.table.read();
        t.nodes.capacity() * std::mem::size_of::<Node>()
            + t.names.capacity()
            + t.files.capacity() * 4
            + t.devs.capacity() * 8
            // hashbrown: a u32 slot and a control byte per bucket.
            + t.children.capacity() * 5
            // std's HashMap: a (key, value) slot and a control byte per bucket.
            + t.listings.capacity() * (std::mem::size_of::<(u32, KeptListing)>() + 1)
            + t.kept_children * 4
            + t.looks.capacity() * std::mem::size_of::<(u32, u64)>()
    }
}

fn find_child(table: &Table, hash: u64, parent: u32, name: &OsStr) -> Option<u32> {
    table
        .children
        .find(hash, |&id| {
            table.nodes[id as usize].parent == parent && table.name(id) == name
        })
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(kind: Kind, size: u64, mtime_ns: i64) -> SourceMeta {
        let t = SystemTime::UNIX_EPOCH;
        SourceMeta {
            attr: Attr {
                ino: 0,
                size,
                blocks: 0,
                atime: t,
                mtime: t,
                ctime: t,
                kind,
                perm: 0o644,
                nlink: 1,
                uid: 0,
                gid: 0,
                rdev: 0,
                blksize: 4096,
            },
            version: FileVersion {
                dev: 1,
                ino: 7,
                size,
                mtime_ns,
                ctime_ns: 0,
            },
        }
    }

    /// A node as the log is told of it: id, parent, kind, name.
    type Logged = (NodeId, NodeId, Kind, Vec<u8>);

    #[derive(Debug, Default)]
    struct Log(parking_lot::Mutex<Vec<Logged>>);

    impl NodeLog for Log {
        fn node_added(&self, id: NodeId, parent: NodeId, kind: Kind, name: &[u8]) {
            self.0.lock().push((id, parent, kind, name.to_vec()));
        }
    }

    #[test]
    fn a_replayed_log_gives_every_node_its_id_and_file_id_again() {
        let ns = Namespace::new(meta(Kind::Dir, 0, 0));
        let log = std::sync::Arc::new(Log::default());
        ns.log_to(log.clone());
        let d = ns.insert_child(ROOT, OsStr::new("d"), meta(Kind::Dir, 0, 0));
        ns.insert_children(
            d,
            [
                (OsStr::new("x.bin"), meta(Kind::File, 5, 1)),
                (OsStr::new("y.bin"), meta(Kind::File, 6, 1)),
            ],
        );
        let z = ns.insert_child(ROOT, OsStr::new("z"), meta(Kind::File, 7, 1));
        // A refresh of a known node gives out no id.
        ns.insert_child(d, OsStr::new("x.bin"), meta(Kind::File, 9, 2));
        let entries = log.0.lock().clone();
        assert_eq!(entries.len(), 4);
        let again = Namespace::new(meta(Kind::Dir, 0, 0));
        assert_eq!(again.replay(entries.clone()), Ok(4));
        for id in 2..=z {
            assert_eq!(again.path(id), ns.path(id));
            assert_eq!(
                again.info(id).unwrap().file_id,
                ns.info(id).unwrap().file_id
            );
            assert_eq!(
                again.info(id).unwrap().attr.kind,
                ns.info(id).unwrap().attr.kind
            );
        }
        // Attributes come from the source again; until then a node reads as empty.
        assert_eq!(again.info(z).unwrap().attr.size, 0);
        assert!(again.refresh(z, meta(Kind::File, 7, 1), None));
        assert_eq!(again.info(z).unwrap().attr.size, 7);
        // Replayed into a table that gave out other ids first: refused, not renumbered.
        let other = Namespace::new(meta(Kind::Dir, 0, 0));
        other.insert_child(ROOT, OsStr::new("new"), meta(Kind::File, 1, 1));
        assert_eq!(
            other.replay(entries),
            Err("node 2 (d) came back as 3".to_string())
        );
    }

    #[test]
    fn children_are_found_by_parent_and_name() {
        let ns = Namespace::new(meta(Kind::Dir, 0, 0));
        let a = ns.insert_child(ROOT, OsStr::new("a"), meta(Kind::Dir, 0, 0));
        let b = ns.insert_child(a, OsStr::new("b.jpg"), meta(Kind::File, 10, 0));
        let c = ns.insert_child(ROOT, OsStr::new("b.jpg"), meta(Kind::File, 20, 0));
        assert_eq!((a, b, c), (2, 3, 4));
        assert_eq!(ns.child(a, OsStr::new("b.jpg")), Some(b));
        assert_eq!(ns.child(ROOT, OsStr::new("b.jpg")), Some(c));
        assert_eq!(ns.child(ROOT, OsStr::new("missing")), None);
        assert_eq!(ns.path(b).unwrap(), PathBuf::from("a/b.jpg"));
        assert_eq!(ns.path(ROOT).unwrap(), PathBuf::new());
        assert_eq!(ns.info(b).unwrap().attr.ino, b);
        assert_eq!(ns.info(b).unwrap().file_id, Some(0));
        assert_eq!(ns.info(c).unwrap().file_id, Some(1));
        assert_eq!(ns.info(a).unwrap().file_id, None);
        assert_eq!(ns.file_node(1), Some(c));
        assert_eq!(ns.file_count(), 2);
        assert!(ns.info(0).is_none());
        assert!(ns.info(99).is_none());
    }

    #[test]
    fn a_guessed_child_is_the_child_or_the_table_is_asked() {
        let ns = Namespace::new(meta(Kind::Dir, 0, 0));
        let x = ns.insert_child(ROOT, OsStr::new("x"), meta(Kind::Dir, 0, 0));
        let y = ns.insert_child(ROOT, OsStr::new("y"), meta(Kind::Dir, 0, 0));
        let ids = ns.insert_children(
            x,
            ["a", "b", "c"].map(|n| (OsStr::new(n), meta(Kind::File, 1, 0))),
        );
        let d = ns.insert_child(y, OsStr::new("b"), meta(Kind::File, 1, 0));
        let (a, b, c) = (ids[0], ids[1], ids[2]);
        assert_eq!(
            (b, c),
            (a + 1, a + 2),
            "a directory's entries are consecutive"
        );
        // The right guess, a wrong one (another directory's node, the root, past the end,
        // a sibling), and a name that is not there.
        assert_eq!(ns.child_near(x, OsStr::new("b"), a + 1), Some(b));
        assert_eq!(ns.child_near(x, OsStr::new("c"), d), Some(c));
        assert_eq!(ns.child_near(x, OsStr::new("a"), ROOT), Some(a));
        assert_eq!(ns.child_near(x, OsStr::new("a"), 1 << 40), Some(a));
        assert_eq!(ns.child_near(x, OsStr::new("a"), c), Some(a));
        assert_eq!(ns.child_near(y, OsStr::new("b"), b), Some(d));
        assert_eq!(ns.child_near(x, OsStr::new("d"), c + 1), None);
        assert_eq!(ns.child_near(y, OsStr::new("a"), a), None);
    }

    #[test]
    fn a_kept_listing_serves_while_its_directory_is_unchanged_and_young() {
        let ns = Namespace::new(meta(Kind::Dir, 0, 0));
        let x = ns.insert_child(ROOT, OsStr::new("x"), meta(Kind::Dir, 0, 5));
        let ids = ns.insert_children(
            x,
            [("b", meta(Kind::File, 1, 0)), ("a", meta(Kind::Dir, 0, 0))]
                .map(|(n, m)| (OsStr::new(n), m)),
        );
        let version = ns.info(x).unwrap().version;
        let at = Instant::now();
        ns.keep_listing(x, version, at, &ids);
        let with = ns.memory();
        let day = Duration::from_secs(86_400);
        // In the order kept, with each node's kind.
        let want = vec![
            (OsString::from("b"), Some(Kind::File)),
            (OsString::from("a"), Some(Kind::Dir)),
        ];
        assert_eq!(ns.kept_listing(x, &version, day), Some((want.clone(), at)));
        assert_eq!(ns.kept_listing(ROOT, &version, day), None, "never kept");
        // A directory whose change time moved is listed again; its listing is gone.
        let changed = FileVersion {
            ctime_ns: version.ctime_ns + 1,
            ..version
        };
        assert_eq!(ns.kept_listing(x, &changed, day), None);
        assert_eq!(ns.kept_listing(x, &version, day), None);
        assert_eq!(with - ns.memory(), 2 * 4, "4 bytes a kept child");
        // One older than the metadata TTL likewise.
        ns.keep_listing(x, version, at, &ids);
        assert_eq!(ns.kept_listing(x, &version, Duration::ZERO), None);
        assert_eq!(ns.kept_listing(x, &version, day), None);
    }

    #[test]
    fn inserting_twice_keeps_the_id_and_refreshes_the_version() {
        let ns = Namespace::new(meta(Kind::Dir, 0, 0));
        let a = ns.insert_child(ROOT, OsStr::new("a"), meta(Kind::File, 10, 1));
        let again = ns.insert_child(ROOT, OsStr::new("a"), meta(Kind::File, 11, 2));
        assert_eq!(a, again);
        assert_eq!(ns.info(a).unwrap().attr.size, 11);
        assert!(!ns.refresh(a, meta(Kind::File, 11, 2), None));
        assert!(ns.refresh(a, meta(Kind::File, 11, 3), None));
        assert_eq!(ns.file_count(), 1);
    }

    #[test]
    fn a_look_older_than_the_one_recorded_does_not_set_the_node_back() {
        let ns = Namespace::new(meta(Kind::Dir, 0, 0));
        let at = |size, ctime_ns| {
            let mut m = meta(Kind::File, size, ctime_ns);
            m.version.ctime_ns = ctime_ns;
            m
        };
        let a = ns.insert_child(ROOT, OsStr::new("a"), at(13, 10));
        assert!(ns.refresh(a, at(23, 20), Some(ns.look())));
        // The watch's look from before the write lands late: ignored.
        assert!(!ns.refresh(a, at(13, 10), Some(ns.look())));
        assert_eq!(ns.info(a).unwrap().attr.size, 23);
        // Nor does the scan's listing, taken before and entered after.
        assert_eq!(ns.insert_child(ROOT, OsStr::new("a"), at(13, 10)), a);
        assert_eq!(
            ns.insert_children(ROOT, [(OsStr::new("a"), at(13, 10))]),
            [a]
        );
        assert_eq!(ns.info(a).unwrap().attr.size, 23);
        // A newer look is taken either way.
        ns.insert_child(ROOT, OsStr::new("a"), at(31, 30));
        assert_eq!(ns.info(a).unwrap().attr.size, 31);
        // Another file under the name (another inode) is always taken.
        let mut other = at(5, 1);
        other.version.ino = 8;
        assert!(ns.refresh(a, other, None));
        assert_eq!(ns.info(a).unwrap().attr.size, 5);
    }

    #[test]
    fn of_two_looks_at_one_time_the_one_begun_later_stands_whichever_lands_last() {
        // A file written twice in one tick of the kernel's coarse clock, nobody asking its
        // times in between: both contents carry one ctime and mtime.
        let ns = Namespace::new(meta(Kind::Dir, 0, 0));
        let a = ns.insert_child(ROOT, OsStr::new("a"), meta(Kind::File, 13, 5));
        let (first, second) = (ns.look(), ns.look());
        // The look at 23 bytes lands first, the one begun before it (13 bytes) after.
        assert!(ns.refresh(a, meta(Kind::File, 23, 7), Some(second)));
        assert!(!ns.refresh(a, meta(Kind::File, 13, 7), Some(first)));
        assert_eq!(ns.info(a).unwrap().attr.size, 23);
        // In order, each is taken.
        let (third, fourth) = (ns.look(), ns.look());
        assert!(ns.refresh(a, meta(Kind::File, 30, 7), Some(third)));
        assert!(ns.refresh(a, meta(Kind::File, 31, 7), Some(fourth)));
        assert_eq!(ns.info(a).unwrap().attr.size, 31);
        // Another file under the name, looked at before the last look recorded: refused too.
        let stale = ns.look();
        let last = ns.look();
        assert!(ns.refresh(a, meta(Kind::File, 40, 7), Some(last)));
        let mut other = meta(Kind::File, 5, 1);
        other.version.ino = 8;
        assert!(!ns.refresh(a, other, Some(stale)));
        assert_eq!(ns.info(a).unwrap().attr.size, 40);
        // A listing's look (no number) is judged by its ctime alone.
        assert!(ns.refresh(a, meta(Kind::File, 41, 7), None));
        assert_eq!(ns.info(a).unwrap().attr.size, 41);
    }

    #[test]
    fn a_node_costs_at_most_150_bytes_with_its_name() {
        // ImageNet's shape: 1,000 directories of JPEGs named like n01440764_10026.JPEG.
        let ns = Namespace::new(meta(Kind::Dir, 0, 0));
        let files = 200_000;
        let dirs: Vec<NodeId> = (0..1000)
            .map(|d| ns.insert_child(ROOT, OsStr::new(&format!("n{d:08}")), meta(Kind::Dir, 0, 0)))
            .collect();
        // Entered as the scan does: a directory at a time, its listing kept.
        for (d, &dir) in dirs.iter().enumerate() {
            let names: Vec<String> = (d..files)
                .step_by(1000)
                .map(|i| format!("n{d:08}_{i:05}.JPEG"))
                .collect();
            let ids = ns.insert_children(
                dir,
                names
                    .iter()
                    .map(|n| (OsStr::new(n), meta(Kind::File, 110_000, 0))),
            );
            ns.keep_listing(dir, meta(Kind::Dir, 0, 0).version, Instant::now(), &ids);
        }
        ns.shrink();
        let per_entry = ns.memory() / (files + 1000);
        assert!(per_entry <= 150, "{per_entry} bytes an entry");
        let id = ns
            .child(dirs[7], OsStr::new("n00000007_00007.JPEG"))
            .unwrap();
        assert_eq!(
            ns.path(id).unwrap(),
            PathBuf::from("n00000007/n00000007_00007.JPEG")
        );
    }

    #[test]
    fn non_utf8_names_are_kept_byte_for_byte() {
        use std::os::unix::ffi::OsStrExt;
        let ns = Namespace::new(meta(Kind::Dir, 0, 0));
        let name = OsStr::from_bytes(b"caf\xe9\xff.bin");
        let id = ns.insert_child(ROOT, name, meta(Kind::File, 1, 0));
        assert_eq!(ns.child(ROOT, name), Some(id));
        assert_eq!(
            ns.path(id).unwrap().as_os_str().as_bytes(),
            b"caf\xe9\xff.bin"
        );
    }
}
