//! The node table: FUSE node ids for the entries of the source tree.
//!
//! The dataset is immutable while a job trains on it, so a node, once created, lives as long
//! as the mount: the table only grows (FORGET is ignored) and a node id is a dense index into
//! a `Vec`. That keeps `getattr` and `open` to one read-locked index, and gives every regular
//! file a dense [`FileId`] for the per-epoch bitmaps and the prefetcher. The cost is memory
//! proportional to the number of entries ever looked up (about 150 bytes plus the name each;
//! ImageNet's 1.28 M files need about 250 MiB), documented in the README.
//!
//! Children are found by hashing `(parent, name)` to a 64-bit key, so the name is stored once
//! (in the node) instead of twice (node and map key); the rare hash collision falls back to
//! comparing names.
//!
//! Nothing here does I/O. Callers stat the source first and then insert, so no lock is ever
//! held across a system call.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::ffi::OsStr;
use std::hash::BuildHasher;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::RwLock;

/// A FUSE node id. 1 is the root (the kernel's `FUSE_ROOT_ID`).
pub type NodeId = u64;
/// The node id of the mount's root.
pub const ROOT: NodeId = 1;

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

/// What the source's `lstat` says of an entry: its attributes (with `ino` still unset) and
/// its version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceMeta {
    pub attr: Attr,
    pub version: FileVersion,
}

#[derive(Debug)]
struct Node {
    parent: NodeId,
    name: Arc<OsStr>,
    attr: Attr,
    version: FileVersion,
    file_id: Option<FileId>,
}

/// Up to one child per key in the common case; collisions keep a short list.
#[derive(Debug)]
enum Slot {
    One(NodeId),
    Many(Vec<NodeId>),
}

#[derive(Debug, Default)]
struct Table {
    /// Indexed by node id; index 0 is a placeholder so that ids start at 1.
    nodes: Vec<Node>,
    children: HashMap<(NodeId, u64), Slot>,
    /// Indexed by file id.
    files: Vec<NodeId>,
}

/// A node's current view, as the filesystem core needs it.
#[derive(Clone, Copy, Debug)]
pub struct NodeInfo {
    pub attr: Attr,
    pub version: FileVersion,
    pub file_id: Option<FileId>,
}

/// The node table of one mount.
#[derive(Debug)]
pub struct Namespace {
    table: RwLock<Table>,
    hasher: RandomState,
}

impl Namespace {
    /// A table holding only the root, described by `root`.
    pub fn new(root: SourceMeta) -> Self {
        let placeholder = Node {
            parent: 0,
            name: Arc::from(OsStr::new("")),
            attr: root.attr,
            version: root.version,
            file_id: None,
        };
        let mut attr = root.attr;
        attr.ino = ROOT;
        let root_node = Node {
            parent: ROOT,
            name: Arc::from(OsStr::new("")),
            attr,
            version: root.version,
            file_id: None,
        };
        Namespace {
            table: RwLock::new(Table {
                nodes: vec![placeholder, root_node],
                children: HashMap::new(),
                files: Vec::new(),
            }),
            hasher: RandomState::new(),
        }
    }

    fn key(&self, parent: NodeId, name: &OsStr) -> (NodeId, u64) {
        (parent, self.hasher.hash_one(name))
    }

    /// The child `name` of `parent`, if it has been inserted.
    pub fn child(&self, parent: NodeId, name: &OsStr) -> Option<NodeId> {
        let key = self.key(parent, name);
        let table = self.table.read();
        find_child(&table, key, name)
    }

    /// Inserts the child `name` of `parent` (or refreshes it if present) and returns its id.
    pub fn insert_child(&self, parent: NodeId, name: &OsStr, meta: SourceMeta) -> NodeId {
        let key = self.key(parent, name);
        let mut table = self.table.write();
        if let Some(id) = find_child(&table, key, name) {
            refresh_node(&mut table, id, meta);
            return id;
        }
        let id = table.nodes.len() as NodeId;
        let file_id = (meta.attr.kind == Kind::File).then(|| {
            let file_id = table.files.len() as FileId;
            table.files.push(id);
            file_id
        });
        let mut attr = meta.attr;
        attr.ino = id;
        table.nodes.push(Node {
            parent,
            name: Arc::from(name),
            attr,
            version: meta.version,
            file_id,
        });
        match table.children.get_mut(&key) {
            None => {
                table.children.insert(key, Slot::One(id));
            }
            Some(Slot::One(other)) => {
                let other = *other;
                table.children.insert(key, Slot::Many(vec![other, id]));
            }
            Some(Slot::Many(list)) => list.push(id),
        }
        id
    }

    /// The node's attributes, version and file id.
    pub fn info(&self, id: NodeId) -> Option<NodeInfo> {
        let table = self.table.read();
        let node = table.nodes.get(id as usize).filter(|_| id >= ROOT)?;
        Some(NodeInfo {
            attr: node.attr,
            version: node.version,
            file_id: node.file_id,
        })
    }

    /// Replaces the node's attributes with a fresh `lstat` of the source. Returns true if the
    /// file's version changed (its size, mtime or identity).
    pub fn refresh(&self, id: NodeId, meta: SourceMeta) -> bool {
        let mut table = self.table.write();
        refresh_node(&mut table, id, meta)
    }

    /// The node's parent (the root is its own parent).
    pub fn parent(&self, id: NodeId) -> Option<NodeId> {
        let table = self.table.read();
        table
            .nodes
            .get(id as usize)
            .filter(|_| id >= ROOT)
            .map(|n| n.parent)
    }

    /// The node's path relative to the source root (empty for the root).
    pub fn path(&self, id: NodeId) -> Option<PathBuf> {
        let table = self.table.read();
        if id < ROOT || id as usize >= table.nodes.len() {
            return None;
        }
        let mut parts = Vec::new();
        let mut at = id;
        while at != ROOT {
            let node = &table.nodes[at as usize];
            parts.push(node.name.clone());
            at = node.parent;
        }
        let mut path = PathBuf::new();
        for part in parts.iter().rev() {
            path.push(&**part);
        }
        Some(path)
    }

    /// The node of file `file_id`.
    pub fn file_node(&self, file_id: FileId) -> Option<NodeId> {
        self.table.read().files.get(file_id as usize).copied()
    }

    /// Every file id, sorted by the source's inode number: a cheap stand-in for on-disk
    /// order on filesystems that allocate inodes near their data (ext4, XFS).
    pub fn files_in_inode_order(&self) -> Vec<FileId> {
        let table = self.table.read();
        let mut files: Vec<(u64, FileId)> = table
            .files
            .iter()
            .enumerate()
            .map(|(id, node)| (table.nodes[*node as usize].version.ino, id as FileId))
            .collect();
        files.sort_unstable();
        files.into_iter().map(|(_, id)| id).collect()
    }

    /// How many regular files have been seen so far.
    pub fn file_count(&self) -> usize {
        self.table.read().files.len()
    }

    /// How many nodes (including the root) the table holds.
    pub fn node_count(&self) -> usize {
        self.table.read().nodes.len() - 1
    }
}

fn find_child(table: &Table, key: (NodeId, u64), name: &OsStr) -> Option<NodeId> {
    let matches = |id: &NodeId| &*table.nodes[*id as usize].name == name;
    match table.children.get(&key)? {
        Slot::One(id) => matches(id).then_some(*id),
        Slot::Many(list) => list.iter().copied().find(|id| matches(id)),
    }
}

fn refresh_node(table: &mut Table, id: NodeId, meta: SourceMeta) -> bool {
    let Some(node) = table.nodes.get_mut(id as usize) else {
        return false;
    };
    let changed = node.version != meta.version;
    let mut attr = meta.attr;
    attr.ino = id;
    node.attr = attr;
    node.version = meta.version;
    // A file that became a directory (or the reverse) keeps its file id; the version change
    // makes its cached bytes unreachable, which is all that correctness needs.
    changed
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
    fn inserting_twice_keeps_the_id_and_refreshes_the_version() {
        let ns = Namespace::new(meta(Kind::Dir, 0, 0));
        let a = ns.insert_child(ROOT, OsStr::new("a"), meta(Kind::File, 10, 1));
        let again = ns.insert_child(ROOT, OsStr::new("a"), meta(Kind::File, 11, 2));
        assert_eq!(a, again);
        assert_eq!(ns.info(a).unwrap().attr.size, 11);
        assert!(!ns.refresh(a, meta(Kind::File, 11, 2)));
        assert!(ns.refresh(a, meta(Kind::File, 11, 3)));
        assert_eq!(ns.file_count(), 1);
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
