//! The namespace as listed: objects and directories by path, their attributes and versions.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use object_store::ObjectMeta;

use crate::namespace::{Attr, FileVersion, Kind, NodeId, SourceMeta};

/// An object of the listing.
#[derive(Clone, Debug)]
pub(super) struct Object {
    pub(super) meta: SourceMeta,
    pub(super) etag: Option<String>,
    pub(super) last_modified: chrono::DateTime<chrono::Utc>,
    /// When the store last vouched for it (listing or HEAD).
    pub(super) checked: Instant,
}

/// A directory of the listing: its names, and when they were last listed.
#[derive(Clone, Debug)]
pub(super) struct Dir {
    pub(super) meta: SourceMeta,
    pub(super) children: BTreeMap<OsString, Kind>,
    /// None for a directory a relisting of its parent found: its names are not read yet.
    pub(super) listed: Option<Instant>,
}

/// The namespace as listed: every object and directory by path.
#[derive(Debug, Default)]
pub(super) struct Tree {
    pub(super) objects: HashMap<PathBuf, Object>,
    pub(super) dirs: HashMap<PathBuf, Dir>,
    /// Bytes of all objects, for `statfs`.
    pub(super) bytes: u64,
    /// Bytes of memory the tree takes, about ([`object_cost`], [`dir_cost`]).
    pub(super) memory: u64,
}

/// Memory an entry of the tree takes beside its path: the map's slot and the parent's child
/// entry, with their allocator headers.
const ENTRY: u64 = (std::mem::size_of::<(PathBuf, Object)>()
    + std::mem::size_of::<(OsString, Kind)>()
    + 64) as u64;

/// Memory object `rel` takes in the tree: its entry, its path (and its name in its parent),
/// its ETag.
pub(super) fn object_cost(rel: &Path, etag: Option<&str>) -> u64 {
    ENTRY + 2 * rel.as_os_str().len() as u64 + etag.map_or(0, |t| t.len() as u64)
}

/// Memory directory `rel` takes in the tree, without its children.
pub(super) fn dir_cost(rel: &Path) -> u64 {
    (std::mem::size_of::<(PathBuf, Dir)>() + 64) as u64 + 2 * rel.as_os_str().len() as u64
}

/// Hashes an ETag (or, without one, the last-modified time) into the version's inode field.
fn tag_hash(etag: Option<&str>, mtime_ns: i64) -> u64 {
    match etag {
        Some(t) => xxhash_rust::xxh3::xxh3_64(t.as_bytes()),
        None => mtime_ns as u64,
    }
}

/// The attributes and version of an object of `size` bytes.
pub(super) fn object_meta(
    size: u64,
    last_modified: chrono::DateTime<chrono::Utc>,
    etag: Option<&str>,
) -> SourceMeta {
    let mtime_ns = last_modified.timestamp_nanos_opt().unwrap_or(0);
    let mtime = SystemTime::UNIX_EPOCH + Duration::from_nanos(mtime_ns.max(0) as u64);
    SourceMeta {
        attr: Attr {
            ino: NodeId::default(),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            kind: Kind::File,
            perm: 0o444,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 1 << 20,
        },
        version: FileVersion {
            dev: 0,
            ino: tag_hash(etag, mtime_ns),
            size,
            mtime_ns,
            ctime_ns: mtime_ns,
        },
    }
}

/// The attributes of directory `rel`, changed at `at` (its names last changed then).
fn dir_meta(rel: &Path, at: SystemTime) -> SourceMeta {
    let ns = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as i64;
    SourceMeta {
        attr: Attr {
            ino: NodeId::default(),
            size: 4096,
            blocks: 8,
            atime: at,
            mtime: at,
            ctime: at,
            kind: Kind::Dir,
            perm: 0o555,
            nlink: 2,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        },
        version: FileVersion {
            dev: 0,
            ino: xxhash_rust::xxh3::xxh3_64(rel.as_os_str().as_encoded_bytes()),
            size: 4096,
            mtime_ns: ns,
            ctime_ns: ns,
        },
    }
}

/// What a listing left out, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Keys that are no safe path.
    pub unsafe_keys: u64,
    /// Objects whose path is also a directory's.
    pub shadowed: Vec<PathBuf>,
    /// Folder markers (`a.bin/`) left out beside the object of the same name (`a.bin`).
    pub markers: Vec<PathBuf>,
}

/// Keeps one object of each path. Keys `k` and `k/` both list as `k` (the store's client
/// drops a key's trailing `/`): one of the two is a folder marker beside an object of the
/// same name. The object is the file: of the two, the one with bytes (a marker has none, by
/// the convention of the consoles that make them), else the first listed (S3 lists `k`
/// before `k/`). Returns the objects kept and the paths whose marker was left out.
pub(super) fn drop_markers(
    objects: Vec<(PathBuf, ObjectMeta)>,
) -> (Vec<(PathBuf, ObjectMeta)>, Vec<PathBuf>) {
    let mut at: HashMap<PathBuf, usize> = HashMap::with_capacity(objects.len());
    let mut kept: Vec<(PathBuf, ObjectMeta)> = Vec::with_capacity(objects.len());
    let mut markers = Vec::new();
    for (rel, o) in objects {
        match at.get(&rel) {
            Some(&i) => {
                if kept[i].1.size == 0 && o.size > 0 {
                    kept[i].1 = o;
                }
                markers.push(rel);
            }
            None => {
                at.insert(rel.clone(), kept.len());
                kept.push((rel, o));
            }
        }
    }
    (kept, markers)
}

impl Tree {
    /// The tree of `objects` (relative paths with their store metadata), listed at `now`.
    pub(super) fn build(
        objects: Vec<(PathBuf, ObjectMeta)>,
        now: Instant,
        at: SystemTime,
    ) -> (Tree, Skipped) {
        let mut tree = Tree::default();
        let mut skipped = Skipped::default();
        tree.add_dir(Path::new(""), now, at);
        for (rel, _) in &objects {
            let mut dir = PathBuf::new();
            for c in rel.parent().into_iter().flat_map(|p| p.components()) {
                let name = c.as_os_str();
                tree.child(&dir, name, Kind::Dir);
                dir.push(name);
                if !tree.dirs.contains_key(&dir) {
                    tree.add_dir(&dir, now, at);
                }
            }
        }
        for (rel, o) in objects {
            if tree.dirs.contains_key(&rel) {
                skipped.shadowed.push(rel);
                continue;
            }
            tree.insert_object(rel, &o, now);
        }
        (tree, skipped)
    }

    fn add_dir(&mut self, rel: &Path, now: Instant, at: SystemTime) {
        self.memory += dir_cost(rel);
        let old = self.dirs.insert(
            rel.to_path_buf(),
            Dir {
                meta: dir_meta(rel, at),
                children: BTreeMap::new(),
                listed: Some(now),
            },
        );
        if old.is_some() {
            self.memory -= dir_cost(rel);
        }
    }

    fn child(&mut self, dir: &Path, name: &OsStr, kind: Kind) {
        if let Some(d) = self.dirs.get_mut(dir) {
            d.children.insert(name.to_os_string(), kind);
        }
    }

    pub(super) fn insert_object(&mut self, rel: PathBuf, o: &ObjectMeta, now: Instant) {
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            return;
        };
        let (parent, name) = (parent.to_path_buf(), name.to_os_string());
        self.child(&parent, &name, Kind::File);
        let object = Object {
            meta: object_meta(o.size, o.last_modified, o.e_tag.as_deref()),
            etag: o.e_tag.clone(),
            last_modified: o.last_modified,
            checked: now,
        };
        self.bytes += o.size;
        self.memory += object_cost(&rel, o.e_tag.as_deref());
        if let Some(old) = self.objects.insert(rel.clone(), object) {
            self.bytes -= old.meta.attr.size;
            self.memory -= object_cost(&rel, old.etag.as_deref());
        }
    }

    /// Forgets `rel` and everything beneath it.
    pub(super) fn remove(&mut self, rel: &Path) {
        if let Some(o) = self.objects.remove(rel) {
            self.bytes -= o.meta.attr.size;
            self.memory -= object_cost(rel, o.etag.as_deref());
        }
        if self.dirs.remove(rel).is_some() {
            self.memory -= dir_cost(rel);
            let gone: Vec<PathBuf> = (self.objects.keys().chain(self.dirs.keys()))
                .filter(|p| p.starts_with(rel))
                .cloned()
                .collect();
            for p in gone {
                self.remove(&p);
            }
        }
        if let (Some(parent), Some(name)) = (rel.parent(), rel.file_name())
            && let Some(d) = self.dirs.get_mut(parent)
        {
            d.children.remove(name);
        }
    }

    /// Puts what a listing of directory `rel` found in place of what it held: `files` (by
    /// name) and subdirectory names `subdirs`. Returns whether its names changed.
    pub(super) fn relisted(
        &mut self,
        rel: &Path,
        files: Vec<(OsString, ObjectMeta)>,
        subdirs: Vec<OsString>,
        now: Instant,
        at: SystemTime,
    ) -> bool {
        let before = self
            .dirs
            .get(rel)
            .map(|d| d.children.clone())
            .unwrap_or_default();
        let mut after: BTreeMap<OsString, Kind> = BTreeMap::new();
        for name in &subdirs {
            after.insert(name.clone(), Kind::Dir);
        }
        for (name, _) in &files {
            after.entry(name.clone()).or_insert(Kind::File);
        }
        for (name, kind) in &before {
            if after.get(name) != Some(kind) {
                self.remove(&rel.join(name));
            }
        }
        if !self.dirs.contains_key(rel) {
            self.add_dir(rel, now, at);
        }
        for name in &subdirs {
            let path = rel.join(name);
            if !self.dirs.contains_key(&path) {
                // Listed when first read.
                self.add_dir(&path, now, at);
                if let Some(d) = self.dirs.get_mut(&path) {
                    d.listed = None;
                }
            }
        }
        for (name, o) in files {
            if after.get(&name) == Some(&Kind::File) {
                self.insert_object(rel.join(&name), &o, now);
            }
        }
        let changed = before != after;
        if let Some(d) = self.dirs.get_mut(rel) {
            d.children = after;
            d.listed = Some(now);
            if changed {
                d.meta = dir_meta(rel, at);
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::path::Path as Key;

    fn object(key: &str, size: u64, etag: &str) -> ObjectMeta {
        ObjectMeta {
            location: Key::from(key),
            last_modified: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            size,
            e_tag: Some(etag.into()),
            version: None,
        }
    }

    #[test]
    fn the_tree_holds_every_object_and_directory_wins_over_a_file() {
        let objects = vec![
            (PathBuf::from("a/x"), object("a/x", 3, "\"1\"")),
            (PathBuf::from("a"), object("a", 1, "\"2\"")),
            (PathBuf::from("a/b/y"), object("a/b/y", 5, "\"3\"")),
            (PathBuf::from("z"), object("z", 7, "\"4\"")),
        ];
        let (tree, skipped) = Tree::build(objects, Instant::now(), SystemTime::now());
        assert_eq!(skipped.shadowed, [PathBuf::from("a")]);
        assert_eq!(tree.objects.len(), 3);
        assert_eq!(tree.bytes, 15);
        let root: Vec<_> = tree.dirs[Path::new("")].children.iter().collect();
        assert_eq!(
            root,
            [
                (&OsString::from("a"), &Kind::Dir),
                (&OsString::from("z"), &Kind::File)
            ]
        );
        assert_eq!(tree.dirs[Path::new("a")].children.len(), 2);
        assert_eq!(tree.objects[Path::new("a/b/y")].meta.attr.perm, 0o444);
    }

    #[test]
    fn a_folder_marker_beside_an_object_leaves_the_object_the_file() {
        // `a.bin` then `a.bin/` (S3's order), the marker first, and two empty keys.
        let listed = vec![
            (PathBuf::from("a.bin"), object("a.bin", 9, "\"1\"")),
            (PathBuf::from("a.bin"), object("a.bin", 0, "\"m\"")),
            (PathBuf::from("b.bin"), object("b.bin", 0, "\"m\"")),
            (PathBuf::from("b.bin"), object("b.bin", 5, "\"2\"")),
            (PathBuf::from("e"), object("e", 0, "\"3\"")),
            (PathBuf::from("e"), object("e", 0, "\"m\"")),
            (PathBuf::from("z"), object("z", 7, "\"4\"")),
        ];
        let (kept, markers) = drop_markers(listed);
        let sizes: Vec<(PathBuf, u64)> = kept.into_iter().map(|(p, o)| (p, o.size)).collect();
        let want = [("a.bin", 9), ("b.bin", 5), ("e", 0), ("z", 7)];
        let want: Vec<(PathBuf, u64)> = want.iter().map(|(p, n)| (PathBuf::from(p), *n)).collect();
        assert_eq!(sizes, want);
        assert_eq!(markers, ["a.bin", "b.bin", "e"].map(PathBuf::from));
    }

    #[test]
    fn a_changed_etag_is_another_version_and_the_same_one_is_not() {
        let t = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let a = object_meta(10, t, Some("\"aaa\""));
        assert_eq!(a.version, object_meta(10, t, Some("\"aaa\"")).version);
        assert_ne!(a.version, object_meta(10, t, Some("\"bbb\"")).version);
        assert_eq!(a.version.mtime_ns, 1_700_000_000_000_000_000);
    }

    #[test]
    fn a_relisting_adds_new_names_and_forgets_gone_ones() {
        let objects = vec![
            (PathBuf::from("d/old"), object("d/old", 1, "\"1\"")),
            (PathBuf::from("d/sub/f"), object("d/sub/f", 2, "\"2\"")),
        ];
        let now = Instant::now();
        let (mut tree, _) = Tree::build(objects, now, SystemTime::now());
        let changed = tree.relisted(
            Path::new("d"),
            vec![(OsString::from("new"), object("d/new", 4, "\"3\""))],
            vec![OsString::from("sub2")],
            now,
            SystemTime::now(),
        );
        assert!(changed);
        assert!(!tree.objects.contains_key(Path::new("d/old")));
        assert!(!tree.objects.contains_key(Path::new("d/sub/f")));
        assert!(!tree.dirs.contains_key(Path::new("d/sub")));
        assert_eq!(tree.objects[Path::new("d/new")].meta.attr.size, 4);
        // A directory found by the relisting has its names read when it is first listed.
        assert_eq!(tree.dirs[Path::new("d/sub2")].listed, None);
        assert_eq!(tree.bytes, 4);
        // What is forgotten gives its memory back: the tree's count equals a fresh count.
        let fresh: u64 = (tree.objects.iter())
            .map(|(p, o)| object_cost(p, o.etag.as_deref()))
            .chain(tree.dirs.keys().map(|p| dir_cost(p)))
            .sum();
        assert_eq!(tree.memory, fresh);
        let same = tree.relisted(
            Path::new("d"),
            vec![(OsString::from("new"), object("d/new", 4, "\"3\""))],
            vec![OsString::from("sub2")],
            now,
            SystemTime::now(),
        );
        assert!(!same);
    }
}
