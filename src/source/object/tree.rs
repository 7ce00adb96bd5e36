//! The namespace as listed: each directory's entries, sorted by name, with each object's
//! size, time and version (its ETag), compact: about 100 bytes an object with its name
//! ([`Tree::memory`] counts them). Directories are listed one at a time, when first looked
//! up or by the background scan ([`Tree::set_listing`]); a directory a listing of its parent
//! found but that is not listed yet has no entries and `listed: None`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use object_store::ObjectMeta;

use crate::namespace::{Attr, FileVersion, Kind, NodeId, SourceMeta};

/// An ETag as the store gave it, an MD5's quoted hex (S3's and GCS's usual) in 16 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Etag {
    None,
    /// `"` + these 16 bytes in lowercase hex + `"`.
    Md5([u8; 16]),
    Text(Box<str>),
}

impl Etag {
    pub(super) fn new(tag: Option<&str>) -> Etag {
        let Some(tag) = tag else {
            return Etag::None;
        };
        let hex = (tag.strip_prefix('"').and_then(|t| t.strip_suffix('"'))).filter(|h| {
            h.len() == 32
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        match hex {
            Some(h) => {
                let mut md5 = [0u8; 16];
                for (i, byte) in md5.iter_mut().enumerate() {
                    *byte = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap_or(0);
                }
                Etag::Md5(md5)
            }
            None => Etag::Text(tag.into()),
        }
    }

    /// The ETag as the store wrote it.
    pub(super) fn text(&self) -> Option<String> {
        match self {
            Etag::None => None,
            Etag::Md5(md5) => {
                let hex: String = md5.iter().map(|b| format!("{b:02x}")).collect();
                Some(format!("\"{hex}\""))
            }
            Etag::Text(t) => Some(t.to_string()),
        }
    }

    /// Bytes beside the entry: a text ETag's allocation.
    fn heap(&self) -> u64 {
        match self {
            Etag::Text(t) => heap(t.len()),
            _ => 0,
        }
    }
}

/// True if two ETags name one version: quotes and a weak mark (`W/`) aside, as stores write
/// the same tag quoted in one answer and bare in another (fake-gcs-server's listing).
pub(super) fn same_etag(a: &str, b: &str) -> bool {
    let bare = |t: &str| t.trim_start_matches("W/").trim_matches('"').to_string();
    bare(a) == bare(b)
}

/// An object of the listing.
#[derive(Clone, Debug)]
pub(super) struct Object {
    pub(super) size: u64,
    pub(super) mtime_ns: i64,
    pub(super) etag: Etag,
    /// When the store last vouched for it (listing or HEAD), in seconds since the tree began.
    checked: u32,
}

impl Object {
    /// An object of `size` bytes, last modified `mtime_ns` after the epoch, as a manifest
    /// gives it; the store vouched for it when the tree began.
    pub(super) fn of(size: u64, mtime_ns: i64, etag: Option<&str>) -> Object {
        Object {
            size,
            mtime_ns,
            etag: Etag::new(etag),
            checked: 0,
        }
    }

    fn new(o: &ObjectMeta, checked: u32) -> Object {
        Object {
            size: o.size,
            mtime_ns: o.last_modified.timestamp_nanos_opt().unwrap_or(0),
            etag: Etag::new(o.e_tag.as_deref()),
            checked,
        }
    }

    /// Its attributes and version.
    pub(super) fn meta(&self) -> SourceMeta {
        object_meta_ns(self.size, self.mtime_ns, self.etag.text().as_deref())
    }

    /// Its last-modified time, for a store without ETags (`If-Unmodified-Since`).
    pub(super) fn last_modified(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_nanos(self.mtime_ns)
    }
}

/// An entry of a directory.
#[derive(Clone, Debug)]
pub(super) enum Entry {
    Dir,
    File(Object),
}

/// A directory of the listing: its entries sorted by name, and when they were last listed.
#[derive(Clone, Debug)]
pub(super) struct Dir {
    pub(super) meta: SourceMeta,
    pub(super) entries: Vec<(Box<str>, Entry)>,
    /// None for a directory a listing of its parent found: its names are not read yet.
    pub(super) listed: Option<Instant>,
}

impl Dir {
    /// The entry `name`, if any.
    pub(super) fn get(&self, name: &str) -> Option<&Entry> {
        let at = self
            .entries
            .binary_search_by(|(n, _)| (**n).cmp(name))
            .ok()?;
        Some(&self.entries[at].1)
    }
}

/// The namespace as listed: every directory by path, each with its entries.
#[derive(Debug)]
pub(super) struct Tree {
    pub(super) dirs: HashMap<PathBuf, Dir>,
    /// Objects in all directories.
    pub(super) objects: u64,
    /// Bytes of all objects, for `statfs`.
    pub(super) bytes: u64,
    /// Bytes of memory the tree takes, about ([`entry_cost`], [`dir_cost`]).
    pub(super) memory: u64,
    /// When the tree began: objects' check times count from it.
    began: Instant,
}

/// Bytes an allocation of `n` bytes takes from the allocator: rounded up to 16, with its
/// 8-byte header (glibc's malloc), none for nothing.
fn heap(n: usize) -> u64 {
    if n == 0 {
        0
    } else {
        (n as u64 + 8).div_ceil(16) * 16
    }
}

/// Memory entry `name` takes in its directory: its slot in the entries, its name, its ETag.
pub(super) fn entry_cost(name: &str, entry: &Entry) -> u64 {
    let etag = match entry {
        Entry::File(o) => o.etag.heap(),
        Entry::Dir => 0,
    };
    std::mem::size_of::<(Box<str>, Entry)>() as u64 + heap(name.len()) + etag
}

/// Memory directory `rel` takes in the tree, without its entries: its map slot and path.
pub(super) fn dir_cost(rel: &Path) -> u64 {
    (std::mem::size_of::<(PathBuf, Dir)>() + 8) as u64 + heap(rel.as_os_str().len())
}

/// `rel`'s parent and name, if it has them and the name is UTF-8 (every key is).
fn split(rel: &Path) -> Option<(&Path, &str)> {
    Some((rel.parent()?, rel.file_name()?.to_str()?))
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
    object_meta_ns(size, last_modified.timestamp_nanos_opt().unwrap_or(0), etag)
}

/// [`object_meta`] of a time in nanoseconds since the epoch.
fn object_meta_ns(size: u64, mtime_ns: i64, etag: Option<&str>) -> SourceMeta {
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
    /// A tree of the root alone, not listed yet.
    pub(super) fn new(at: SystemTime) -> Tree {
        let mut tree = Tree {
            dirs: HashMap::new(),
            objects: 0,
            bytes: 0,
            memory: 0,
            began: Instant::now(),
        };
        tree.add_dir(Path::new(""), None, at);
        tree
    }

    /// Seconds from the tree's start to `now`, as objects keep their check time.
    fn secs(&self, now: Instant) -> u32 {
        now.saturating_duration_since(self.began).as_secs() as u32
    }

    /// How long ago the store last vouched for `o`.
    pub(super) fn age(&self, o: &Object) -> Duration {
        let now = self.began.elapsed().as_secs();
        Duration::from_secs(now.saturating_sub(o.checked as u64))
    }

    /// Object `rel`, if the tree has it.
    pub(super) fn object(&self, rel: &Path) -> Option<&Object> {
        let (parent, name) = split(rel)?;
        match self.dirs.get(parent)?.get(name)? {
            Entry::File(o) => Some(o),
            Entry::Dir => None,
        }
    }

    /// The tree of `objects` (relative paths with their store metadata), every directory
    /// listed at `now`. A path that is also a directory's is left out.
    #[cfg(test)]
    pub(super) fn build(
        objects: Vec<(PathBuf, ObjectMeta)>,
        now: Instant,
        at: SystemTime,
    ) -> (Tree, Skipped) {
        let mut folders: HashMap<PathBuf, Vec<(Box<str>, Object)>> = HashMap::new();
        for (rel, o) in objects {
            if let Some((parent, name)) = split(&rel) {
                let entry = (name.into(), Object::new(&o, 0));
                folders.entry(parent.to_path_buf()).or_default().push(entry);
            }
        }
        Tree::from_folders(folders, now, at)
    }

    /// The tree of `files` by folder (a manifest's), every folder listed at `now`, each
    /// ancestor of a folder a folder too. A file whose path is also a folder's is left out.
    pub(super) fn from_folders(
        mut files: HashMap<PathBuf, Vec<(Box<str>, Object)>>,
        now: Instant,
        at: SystemTime,
    ) -> (Tree, Skipped) {
        let mut tree = Tree::new(at);
        let mut skipped = Skipped::default();
        let mut subdirs: HashMap<PathBuf, Vec<Box<str>>> = HashMap::new();
        subdirs.insert(PathBuf::new(), Vec::new());
        // Folders named in their parent already (a child may have made a folder's entry
        // first, so the entry is no sign of it).
        let mut named: std::collections::HashSet<PathBuf> = std::collections::HashSet::new();
        let folders: Vec<PathBuf> = files.keys().cloned().collect();
        for folder in folders {
            let mut d = folder.as_path();
            while !named.contains(d) {
                let (Some(parent), Some(name)) =
                    (d.parent(), d.file_name().and_then(|n| n.to_str()))
                else {
                    break;
                };
                named.insert(d.to_path_buf());
                subdirs.entry(d.to_path_buf()).or_default();
                subdirs
                    .entry(parent.to_path_buf())
                    .or_default()
                    .push(name.into());
                d = parent;
            }
        }
        // Parents first, so that each folder is in the tree before its listing is set.
        let mut order: Vec<(PathBuf, Vec<Box<str>>)> = subdirs.into_iter().collect();
        order.sort_by_key(|(rel, _)| rel.components().count());
        for (rel, dirs) in order {
            let mut entries: Vec<(Box<str>, Entry)> = Vec::new();
            for (name, o) in files.remove(&rel).unwrap_or_default() {
                if dirs.contains(&name) {
                    skipped.shadowed.push(rel.join(&*name));
                } else {
                    entries.push((name, Entry::File(o)));
                }
            }
            entries.extend(dirs.into_iter().map(|n| (n, Entry::Dir)));
            tree.put_listing(&rel, entries, now, at);
        }
        (tree, skipped)
    }

    fn add_dir(&mut self, rel: &Path, listed: Option<Instant>, at: SystemTime) {
        let dir = Dir {
            meta: dir_meta(rel, at),
            entries: Vec::new(),
            listed,
        };
        if self.dirs.insert(rel.to_path_buf(), dir).is_none() {
            self.memory += dir_cost(rel);
        }
    }

    /// Counts `entry` in or out of the tree's totals.
    fn count(&mut self, name: &str, entry: &Entry, sign: i64) {
        let apply = |total: &mut u64, n: u64| {
            *total = if sign > 0 {
                *total + n
            } else {
                total.saturating_sub(n)
            };
        };
        apply(&mut self.memory, entry_cost(name, entry));
        if let Entry::File(o) = entry {
            apply(&mut self.objects, 1);
            apply(&mut self.bytes, o.size);
        }
    }

    /// Puts object `rel` as a HEAD found it; nothing if its directory is not in the tree.
    pub(super) fn insert_object(&mut self, rel: &Path, o: &ObjectMeta, now: Instant) {
        let Some((parent, name)) = split(rel) else {
            return;
        };
        let entry = Entry::File(Object::new(o, self.secs(now)));
        let Some(dir) = self.dirs.get_mut(parent) else {
            return;
        };
        let old = match dir.entries.binary_search_by(|(n, _)| (**n).cmp(name)) {
            Ok(at) => match &dir.entries[at].1 {
                // A directory wins over an object of its name.
                Entry::Dir => return,
                Entry::File(_) => Some(std::mem::replace(&mut dir.entries[at].1, entry.clone())),
            },
            Err(at) => {
                dir.entries.insert(at, (name.into(), entry.clone()));
                None
            }
        };
        if let Some(old) = old {
            self.count(name, &old, -1);
        }
        self.count(name, &entry, 1);
    }

    /// Forgets `rel` and everything beneath it.
    pub(super) fn remove(&mut self, rel: &Path) {
        let Some((parent, name)) = split(rel) else {
            return;
        };
        let gone = (self.dirs.get_mut(parent)).and_then(|d| {
            let at = d.entries.binary_search_by(|(n, _)| (**n).cmp(name)).ok()?;
            Some(d.entries.remove(at))
        });
        if let Some((name, entry)) = gone {
            self.count(&name, &entry, -1);
            if let Entry::Dir = entry {
                self.remove_dir(rel);
            }
        }
    }

    /// Forgets directory `rel`'s own record and those of everything beneath it.
    fn remove_dir(&mut self, rel: &Path) {
        let beneath: Vec<PathBuf> = (self.dirs.keys())
            .filter(|p| p.starts_with(rel))
            .cloned()
            .collect();
        for p in beneath {
            if let Some(d) = self.dirs.remove(&p) {
                self.memory = self.memory.saturating_sub(dir_cost(&p));
                for (name, entry) in &d.entries {
                    self.count(name, entry, -1);
                }
            }
        }
    }

    /// Puts what a listing of directory `rel` found in place of what it held: `files` (by
    /// name) and subdirectory names `subdirs`; a name that is both is the directory's. New
    /// subdirectories are listed when first read. Returns whether its names changed.
    pub(super) fn set_listing(
        &mut self,
        rel: &Path,
        files: Vec<(Box<str>, ObjectMeta)>,
        subdirs: Vec<Box<str>>,
        now: Instant,
        at: SystemTime,
    ) -> bool {
        let checked = self.secs(now);
        let mut after: Vec<(Box<str>, Entry)> = Vec::with_capacity(files.len() + subdirs.len());
        after.extend(subdirs.into_iter().map(|n| (n, Entry::Dir)));
        after.extend(
            files
                .into_iter()
                .map(|(n, o)| (n, Entry::File(Object::new(&o, checked)))),
        );
        self.put_listing(rel, after, now, at)
    }

    /// [`Tree::set_listing`] of `after`, the folder's entries in any order, its folders
    /// before its files of the same name.
    fn put_listing(
        &mut self,
        rel: &Path,
        mut after: Vec<(Box<str>, Entry)>,
        now: Instant,
        at: SystemTime,
    ) -> bool {
        // Directories first, then a stable sort: of a name listed twice the first is kept.
        after.sort_by(|a, b| a.0.cmp(&b.0));
        after.dedup_by(|later, first| later.0 == first.0);
        after.shrink_to_fit();
        if !self.dirs.contains_key(rel) {
            self.add_dir(rel, None, at);
        }
        let before = std::mem::take(&mut self.dirs.get_mut(rel).expect("added above").entries);
        let kinds = |e: &[(Box<str>, Entry)]| -> Vec<(Box<str>, bool)> {
            e.iter()
                .map(|(n, e)| (n.clone(), matches!(e, Entry::Dir)))
                .collect()
        };
        let changed = kinds(&before) != kinds(&after);
        for (name, entry) in &before {
            self.count(name, entry, -1);
            let still_dir = matches!(entry, Entry::Dir)
                && after
                    .binary_search_by(|(n, _)| n.cmp(name))
                    .is_ok_and(|i| matches!(after[i].1, Entry::Dir));
            if matches!(entry, Entry::Dir) && !still_dir {
                self.remove_dir(&rel.join(&**name));
            }
        }
        for (name, entry) in &after {
            self.count(name, entry, 1);
            if let Entry::Dir = entry {
                let path = rel.join(&**name);
                if !self.dirs.contains_key(&path) {
                    self.add_dir(&path, None, at);
                }
            }
        }
        let d = self.dirs.get_mut(rel).expect("added above");
        d.entries = after;
        d.listed = Some(now);
        if changed {
            d.meta = dir_meta(rel, at);
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

    /// The names of directory `rel`, each with true for a directory.
    fn names(tree: &Tree, rel: &str) -> Vec<(String, bool)> {
        (tree.dirs[Path::new(rel)].entries.iter())
            .map(|(n, e)| (n.to_string(), matches!(e, Entry::Dir)))
            .collect()
    }

    /// The tree's memory counted afresh.
    fn fresh_memory(tree: &Tree) -> u64 {
        (tree.dirs.iter())
            .map(|(p, d)| {
                dir_cost(p) + d.entries.iter().map(|(n, e)| entry_cost(n, e)).sum::<u64>()
            })
            .sum()
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
        assert_eq!(tree.objects, 3);
        assert_eq!(tree.bytes, 15);
        assert_eq!(names(&tree, ""), [("a".into(), true), ("z".into(), false)]);
        assert_eq!(names(&tree, "a"), [("b".into(), true), ("x".into(), false)]);
        assert_eq!(
            tree.object(Path::new("a/b/y")).unwrap().meta().attr.perm,
            0o444
        );
        assert!(tree.dirs[Path::new("a/b")].listed.is_some());
        assert_eq!(tree.memory, fresh_memory(&tree));
    }

    #[test]
    fn an_etag_of_an_md5_is_kept_in_16_bytes_and_given_back_as_written() {
        for tag in [
            "\"0123456789abcdef0123456789abcdef\"",
            "\"abc-2\"",
            "Eidv1C/Evav==",
        ] {
            let e = Etag::new(Some(tag));
            assert_eq!(e.text().as_deref(), Some(tag));
            assert_eq!(matches!(e, Etag::Md5(_)), tag.len() == 34);
        }
        assert_eq!(Etag::new(None).text(), None);
        assert!(same_etag("\"Eidv1C==\"", "Eidv1C=="));
        assert!(!same_etag("\"a\"", "\"b\""));
    }

    #[test]
    fn an_object_costs_about_100_bytes_with_its_name() {
        let o = Entry::File(Object::new(
            &object("d/n", 1, "\"0123456789abcdef0123456789abcdef\""),
            0,
        ));
        let cost = entry_cost("n01234567.JPEG", &o);
        assert!((64..=112).contains(&cost), "{cost} bytes");
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
        let listing = || {
            (
                vec![("new".into(), object("d/new", 4, "\"3\""))],
                vec!["sub2".into()],
            )
        };
        let (files, subdirs) = listing();
        assert!(tree.set_listing(Path::new("d"), files, subdirs, now, SystemTime::now()));
        assert!(tree.object(Path::new("d/old")).is_none());
        assert!(!tree.dirs.contains_key(Path::new("d/sub")));
        assert_eq!(tree.object(Path::new("d/new")).unwrap().size, 4);
        // A directory found by the relisting has its names read when it is first listed.
        assert_eq!(tree.dirs[Path::new("d/sub2")].listed, None);
        assert_eq!((tree.objects, tree.bytes), (1, 4));
        // What is forgotten gives its memory back: the tree's count equals a fresh count.
        assert_eq!(tree.memory, fresh_memory(&tree));
        let (files, subdirs) = listing();
        assert!(!tree.set_listing(Path::new("d"), files, subdirs, now, SystemTime::now()));
        // A HEAD's answer replaces the object; a removal forgets it.
        tree.insert_object(Path::new("d/new"), &object("d/new", 9, "\"4\""), now);
        assert_eq!((tree.objects, tree.bytes), (1, 9));
        tree.remove(Path::new("d"));
        assert_eq!((tree.objects, tree.bytes), (0, 0));
        assert_eq!(tree.memory, fresh_memory(&tree));
    }
}
