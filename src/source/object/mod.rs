//! A dataset in an S3-compatible object store: `coorfs mount s3://BUCKET/PREFIX MOUNTPOINT`.
//!
//! The store is reached with the `object_store` crate, configured the way the AWS tools are:
//! `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/
//! `AWS_SESSION_TOKEN` (an `http://` endpoint is plain HTTP, as `AWS_ALLOW_HTTP=true` says
//! for others), instance metadata
//! when no key is given, and the profile `AWS_PROFILE` (else `default`) of
//! `~/.aws/credentials` and `~/.aws/config` for what the environment leaves out
//! ([`profile`]). Secrets are never logged: errors name the request's URL only.
//!
//! The namespace is a listing taken at mount ([`list_all`]): paginated, in parallel across
//! the prefixes found in the first levels, with progress in the log. Keys become paths under
//! the prefix, `/` separating directories. A key that is no safe path (an empty, `.` or `..`
//! component) fails the listing (`object_store` refuses the page that holds it) with a
//! message that says so: the mount is refused rather than shown without it. A key that is
//! also a directory (`a` and `a/b`) is left out, named in the log: the directory wins. A
//! "directory marker" (a key ending in `/`, as consoles make for folders) shows as an empty
//! file unless something lies beneath it: the store's client drops the trailing `/`. A marker
//! beside an object of the same name (`a.bin` and `a.bin/`, nothing else beneath) is left
//! out, named in the log, and the object is the file with its bytes ([`drop_markers`]): the
//! two list as one name, and the marker, listed second, replaced the object with its zero
//! bytes. (mountpoint-s3 shows the directory and hides the object; a dataset's file is worth
//! more than a console's folder.)
//! Objects are files of mode 0444, directories 0555, owned by root.
//!
//! An object's version is its ETag, size and last-modified time ([`object_meta`]): the
//! ETag's hash stands in for the inode number, so the cache, the disk tier (which keeps
//! blocks across restarts by version) and the cluster tell two versions apart. The listing
//! is trusted for `--metadata-ttl`; after that, an open asks the store again (HEAD), and a
//! lookup of a name the listing lacks lists its directory again. Every read is a ranged GET
//! conditional on the version the open saw (`If-Match` on its ETag): a changed object fails
//! the read (ESTALE to the caller, and the entry is refreshed for the next open) instead of
//! mixing bytes of two versions; nothing of a failed read is cached.
//!
//! Faults: throttling (503 SlowDown, 429), 5xx answers, timeouts and broken connections are
//! retried with backoff and jitter by `object_store` for up to 45 s ([`retries`]); every
//! request and every fault is counted here on the way ([`Counting`]) and shown in the stats
//! (`source_requests`, `source_retried`, `source_throttled`). What still fails reaches the
//! caller as an errno (403: EACCES, 404: ENOENT, the rest: EIO) with one log line; a failed
//! read counts in `source_errors`.
//!
//! The store's client is async; the source's callers (FUSE and fetch threads) are not. Each
//! call runs on the source's own small runtime and the caller waits for its answer
//! ([`ObjectSource::wait`]), so many fetch threads keep many requests in flight: object
//! stores are bound by latency, and the pacer (`crate::prefetch::pacer`) learns that and
//! widens the prefetch window to the fetch threads' number.

pub mod profile;

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt};
use parking_lot::RwLock;

use super::{Creds, DatasetSource, FsStats, Listing, Refusal, SourceFile};
use crate::block::{Block, RunBlocks};
use crate::namespace::{Attr, FileVersion, Kind, NodeId, SourceMeta};

/// The URL scheme of an S3 source.
pub const SCHEME: &str = "s3://";

/// Where a dataset lives in an object store: `s3://BUCKET/PREFIX`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectUrl {
    pub bucket: String,
    /// The key prefix, without a leading or trailing `/` (empty: the whole bucket).
    pub prefix: String,
}

impl ObjectUrl {
    /// True if `source` names an object store (`s3://...`) rather than a directory.
    pub fn is_url(source: &Path) -> bool {
        source
            .as_os_str()
            .as_encoded_bytes()
            .starts_with(SCHEME.as_bytes())
    }

    /// Parses `s3://BUCKET[/PREFIX]`.
    pub fn parse(source: &Path) -> Result<Self, String> {
        let text = source
            .to_str()
            .ok_or_else(|| format!("{}: not UTF-8", source.display()))?;
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| format!("{text}: not an s3:// URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b));
        if !valid_bucket {
            return Err(format!(
                "{text}: \"{bucket}\" is not a bucket name (3 to 63 of a-z, 0-9, '-', '.')"
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
            && !prefix.is_empty()
        {
            return Err(format!(
                "{text}: the prefix has an empty, '.' or '..' component"
            ));
        }
        Ok(ObjectUrl {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The key prefix of directory `rel` (relative to the dataset's root), ending in `/`
    /// unless it is the bucket's root.
    fn dir_prefix(&self, rel: &Path) -> String {
        let mut p = self.prefix.clone();
        for c in rel.components() {
            if !p.is_empty() {
                p.push('/');
            }
            p.push_str(&c.as_os_str().to_string_lossy());
        }
        if !p.is_empty() {
            p.push('/');
        }
        p
    }

    /// The key of file `rel` (or of the prefix of directory `rel`, without its `/`).
    fn key(&self, rel: &Path) -> io::Result<Key> {
        key_of(self.dir_prefix(rel).trim_end_matches('/'))
    }

    /// The path of `key` relative to the dataset's root, if it is beneath the prefix and a
    /// safe path: no empty, `.` or `..` component, no NUL.
    fn rel_of(&self, key: &str) -> Option<PathBuf> {
        let rest = if self.prefix.is_empty() {
            key
        } else {
            key.strip_prefix(&self.prefix)?.strip_prefix('/')?
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let safe = parts
            .iter()
            .all(|c| !c.is_empty() && *c != "." && *c != ".." && !c.contains('\0'));
        safe.then(|| parts.iter().collect())
    }
}

/// The store's key `text`, as written. `Key::from` percent-encodes `?`, `#`, `%`, `\` and
/// non-ASCII characters into the key itself, and the request's URL then encodes them again: a
/// GET of `q?x.bin` asked for `q%253Fx.bin` and found nothing. The listing's keys are parsed
/// the same way (`Key::parse`), so every path of the tree is one; any other names no object.
fn key_of(text: &str) -> io::Result<Key> {
    Key::parse(text).map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))
}

/// The store's counters, shared with the HTTP layer that counts every request.
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub retried: AtomicU64,
    pub throttled: AtomicU64,
}

/// An object of the listing.
#[derive(Clone, Debug)]
struct Object {
    meta: SourceMeta,
    etag: Option<String>,
    last_modified: chrono::DateTime<chrono::Utc>,
    /// When the store last vouched for it (listing or HEAD).
    checked: Instant,
}

/// A directory of the listing: its names, and when they were last listed.
#[derive(Clone, Debug)]
struct Dir {
    meta: SourceMeta,
    children: BTreeMap<OsString, Kind>,
    /// None for a directory a relisting of its parent found: its names are not read yet.
    listed: Option<Instant>,
}

/// The namespace as listed: every object and directory by path.
#[derive(Debug, Default)]
struct Tree {
    objects: HashMap<PathBuf, Object>,
    dirs: HashMap<PathBuf, Dir>,
    /// Bytes of all objects, for `statfs`.
    bytes: u64,
    /// Bytes of memory the tree takes, about ([`object_cost`], [`dir_cost`]).
    memory: u64,
}

/// Memory an entry of the tree takes beside its path: the map's slot and the parent's child
/// entry, with their allocator headers.
const ENTRY: u64 = (std::mem::size_of::<(PathBuf, Object)>()
    + std::mem::size_of::<(OsString, Kind)>()
    + 64) as u64;

/// Memory object `rel` takes in the tree: its entry, its path (and its name in its parent),
/// its ETag.
fn object_cost(rel: &Path, etag: Option<&str>) -> u64 {
    ENTRY + 2 * rel.as_os_str().len() as u64 + etag.map_or(0, |t| t.len() as u64)
}

/// Memory directory `rel` takes in the tree, without its children.
fn dir_cost(rel: &Path) -> u64 {
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
fn object_meta(
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
fn drop_markers(objects: Vec<(PathBuf, ObjectMeta)>) -> (Vec<(PathBuf, ObjectMeta)>, Vec<PathBuf>) {
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
    fn build(objects: Vec<(PathBuf, ObjectMeta)>, now: Instant, at: SystemTime) -> (Tree, Skipped) {
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

    fn insert_object(&mut self, rel: PathBuf, o: &ObjectMeta, now: Instant) {
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
    fn remove(&mut self, rel: &Path) {
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
    fn relisted(
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

/// A dataset in an S3-compatible object store.
#[derive(Debug)]
pub struct ObjectSource {
    /// `s3://BUCKET/PREFIX`, for messages.
    name: PathBuf,
    url: ObjectUrl,
    store: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
    tree: RwLock<Tree>,
    /// How long the listing (and a HEAD) is trusted.
    ttl: Duration,
}

/// The request timeout: long enough for a block of a few megabytes over a slow link, short
/// enough that a stalled connection is retried. `COORFS_S3_TIMEOUT` sets another.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The request timeout: `COORFS_S3_TIMEOUT` (a duration: `500ms`, `10s`), else [`TIMEOUT`].
fn request_timeout() -> io::Result<Duration> {
    match std::env::var("COORFS_S3_TIMEOUT") {
        Err(_) => Ok(TIMEOUT),
        Ok(text) => match crate::units::parse_duration(&text) {
            Ok(d) if !d.is_zero() => Ok(d),
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "COORFS_S3_TIMEOUT must be more than 0",
            )),
            Err(e) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("COORFS_S3_TIMEOUT: {e}"),
            )),
        },
    }
}
/// How long a request is retried: long enough to outlast a store down for a few seconds (a
/// restart, a failover, a network blip), not so long that a store that is gone keeps the
/// reader waiting for minutes.
const RETRY_FOR: Duration = Duration::from_secs(45);

/// The retries of a request that failed with a 5xx answer, 429 or 408, a timeout or a broken
/// or refused connection: until [`RETRY_FOR`] has passed since it was first sent, with backoff
/// and jitter growing from 0.2 s to at most 8 s between tries (object_store's decorrelated
/// jitter: each wait is drawn between 0.2 s and 3 times the last). object_store's default, 10
/// tries from 0.1 s growing by 2 at most, gave up after 2-3 s: a store down for 8 s failed
/// the read with EIO. Other answers (403, 404, 412) are not retried.
fn retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(8),
            base: 3.0,
        },
        // The time is the limit, not the count (about 11 tries in 45 s).
        max_retries: 100,
        retry_timeout: RETRY_FOR,
    }
}

/// Directories listed at once at mount.
const LIST_PARALLEL: usize = 16;

impl ObjectSource {
    /// GETs `len` bytes of `rel` from `offset`, or to the end of the object, if it is still
    /// `version`, and hands the body to `sink` as it arrives, a MiB at a time: a part's GET
    /// holds no copy of the part beside the blocks it fills. Returns the bytes read.
    fn get_range(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        len: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let (etag, last_modified) = {
            let tree = self.tree.read();
            // Gone (a read found it so), or another version now.
            let o = (tree.objects.get(rel))
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
            if o.meta.version != *version {
                return Err(io::Error::from_raw_os_error(libc::ESTALE));
            }
            (o.etag.clone(), o.last_modified)
        };
        let end = (offset + len as u64).min(version.size);
        if offset >= end {
            return Ok(0);
        }
        let options = GetOptions {
            // The version the open saw, or none: never bytes of two versions in one file.
            if_unmodified_since: etag.is_none().then_some(last_modified),
            if_match: etag,
            range: Some(GetRange::Bounded(offset..end)),
            ..Default::default()
        };
        let (store, key) = (self.store.clone(), self.url.key(rel)?);
        let opened = self.wait(async move {
            let r = store.get_opts(&key, options).await?;
            Ok::<_, object_store::Error>(r.into_stream())
        })?;
        let mut stream = match opened {
            Ok(stream) => stream,
            Err(e) => return self.get_failed(rel, &e),
        };
        let want = (end - offset) as usize;
        let mut got = 0usize;
        loop {
            let (back, chunks) = self.wait(async move {
                let (mut chunks, mut n) = (Vec::new(), 0);
                while n < (1 << 20) {
                    match stream.next().await {
                        Some(Ok(bytes)) => {
                            n += bytes.len();
                            chunks.push(Ok(bytes));
                        }
                        Some(Err(e)) => {
                            chunks.push(Err(e));
                            break;
                        }
                        None => break,
                    }
                }
                (stream, chunks)
            })?;
            stream = back;
            if chunks.is_empty() {
                break;
            }
            for chunk in chunks {
                let bytes = match chunk {
                    Ok(bytes) => bytes,
                    Err(e) => return self.get_failed(rel, &e),
                };
                got += bytes.len();
                if got > want {
                    break;
                }
                sink(&bytes);
            }
            if got > want {
                break;
            }
        }
        if got != want {
            tracing::warn!(
                "{}/{}: GET of bytes {offset}..{end} answered {got} bytes",
                self.name.display(),
                rel.display(),
            );
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(got)
    }

    /// Connects to the store of `url`, lists the dataset (logging progress) and returns the
    /// source. `ttl` is how long a listing is trusted.
    pub fn open(url: ObjectUrl, ttl: Duration, counters: Arc<Counters>) -> io::Result<Self> {
        let name = PathBuf::from(format!("{SCHEME}{}/{}", url.bucket, url.prefix));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("coorfs-s3")
            .enable_all()
            .build()?;
        let store = build_store(&url, counters.clone())?;
        let listed = {
            let (store, prefix) = (store.clone(), url.prefix.clone());
            let name = name.clone();
            run_on(
                &runtime,
                async move { list_all(store, &prefix, &name).await },
            )??
        };
        let started = Instant::now();
        let mut kept = Vec::with_capacity(listed.len());
        let mut unsafe_keys = 0;
        for o in listed {
            match url.rel_of(o.location.as_ref()) {
                Some(rel) => kept.push((rel, o)),
                None => unsafe_keys += 1,
            }
        }
        let (kept, markers) = drop_markers(kept);
        let (tree, mut skipped) = Tree::build(kept, started, SystemTime::now());
        skipped.unsafe_keys = unsafe_keys;
        // A marker with something beneath it is a directory's, which took the object's name.
        skipped.markers = (markers.into_iter())
            .filter(|m| tree.objects.contains_key(m))
            .collect();
        warn_skipped(&name, &skipped);
        tracing::info!(
            "{}: {} objects, {} directories",
            name.display(),
            tree.objects.len(),
            tree.dirs.len()
        );
        Ok(ObjectSource {
            name,
            url,
            store,
            runtime,
            tree: RwLock::new(tree),
            ttl,
        })
    }

    /// Objects the listing holds.
    pub fn objects(&self) -> usize {
        self.tree.read().objects.len()
    }

    /// Runs `f` on the source's runtime and waits for it.
    fn wait<T: Send + 'static>(
        &self,
        f: impl Future<Output = T> + Send + 'static,
    ) -> io::Result<T> {
        run_on(&self.runtime, f)
    }

    /// The errno a failed store call gives the caller; logs it once and counts it.
    fn failed(&self, what: &str, rel: &Path, e: &object_store::Error) -> io::Error {
        let errno = errno_of(e);
        if errno != libc::ESTALE {
            let (name, e) = (self.name.display(), one_line(e));
            tracing::warn!("{name}/{}: {what}: {e}", rel.display());
        }
        io::Error::from_raw_os_error(errno)
    }

    /// The error of a GET of `rel` that failed with `e`: a failure carries the store's words
    /// to the caller's one log line of the read; a changed or deleted object is logged only at
    /// debug (the next open sees what is there now).
    fn get_failed(&self, rel: &Path, e: &object_store::Error) -> io::Result<usize> {
        match errno_of(e) {
            errno @ (libc::ESTALE | libc::ENOENT) => {
                let (name, why) = (self.name.display(), one_line(e));
                tracing::debug!("{name}/{}: GET: {why}", rel.display());
                self.gone_or_changed(rel, errno)
            }
            errno => Err(Refusal::error(errno, format!("GET: {}", one_line(e)))),
        }
    }

    /// The error of a GET the store refused because object `rel` changed since it was listed
    /// (`ESTALE`: some stores check If-Match first) or is gone (`ENOENT`).
    fn gone_or_changed(&self, rel: &Path, errno: i32) -> io::Result<usize> {
        match errno {
            libc::ESTALE => match self.head(rel) {
                Err(gone) if gone.raw_os_error() == Some(libc::ENOENT) => Err(gone),
                _ => Err(io::Error::from_raw_os_error(libc::ESTALE)),
            },
            _ => {
                self.tree.write().remove(rel);
                Err(io::Error::from_raw_os_error(libc::ENOENT))
            }
        }
    }

    /// Asks the store about object `rel` again (HEAD) and keeps the answer.
    fn head(&self, rel: &Path) -> io::Result<SourceMeta> {
        let (store, key) = (self.store.clone(), self.url.key(rel)?);
        let answer = self.wait(async move { store.head(&key).await })?;
        let now = Instant::now();
        match answer {
            Ok(o) => {
                let mut tree = self.tree.write();
                tree.insert_object(rel.to_path_buf(), &o, now);
                Ok(object_meta(o.size, o.last_modified, o.e_tag.as_deref()))
            }
            Err(object_store::Error::NotFound { .. }) => {
                self.tree.write().remove(rel);
                Err(io::Error::from_raw_os_error(libc::ENOENT))
            }
            Err(e) => Err(self.failed("HEAD", rel, &e)),
        }
    }

    /// Lists directory `rel` again (one level) and keeps what it finds.
    fn relist(&self, rel: &Path) -> io::Result<()> {
        let prefix = self.url.dir_prefix(rel);
        let prefix = if prefix.is_empty() {
            None
        } else {
            Some(key_of(prefix.trim_end_matches('/'))?)
        };
        let store = self.store.clone();
        let answer = self.wait(async move { store.list_with_delimiter(prefix.as_ref()).await })?;
        let listed = match answer {
            Ok(l) => l,
            Err(object_store::Error::NotFound { .. }) if !rel.as_os_str().is_empty() => {
                self.tree.write().remove(rel);
                return Err(io::Error::from_raw_os_error(libc::ENOENT));
            }
            Err(e) => return Err(self.failed("LIST", rel, &e)),
        };
        let name_of = |key: &str| {
            let r = self.url.rel_of(key)?;
            (r.parent() == Some(rel)).then(|| r.file_name().map(|n| n.to_os_string()))?
        };
        let files: Vec<(OsString, ObjectMeta)> = (listed.objects.into_iter())
            .filter_map(|o| Some((name_of(o.location.as_ref())?, o)))
            .collect();
        let mut subdirs: Vec<OsString> = (listed.common_prefixes.iter())
            .filter_map(|p| name_of(p.as_ref()))
            .collect();
        // A name that is an object and a prefix whose one key is its folder marker: the
        // object is the file, as at mount (`drop_markers`); else the directory wins.
        subdirs
            .retain(|d| !(files.iter().any(|(f, _)| f == d) && self.only_a_marker(&rel.join(d))));
        let mut tree = self.tree.write();
        if rel.as_os_str().is_empty() || tree.dirs.contains_key(rel) {
            tree.relisted(rel, files, subdirs, Instant::now(), SystemTime::now());
        }
        Ok(())
    }

    /// True if the one key beneath directory `rel` is its folder marker (`rel/`).
    fn only_a_marker(&self, rel: &Path) -> bool {
        let Ok(key) = self.url.key(rel) else {
            return false;
        };
        let store = self.store.clone();
        let marker = key.clone();
        let answer = self.wait(async move { store.list_with_delimiter(Some(&key)).await });
        matches!(answer, Ok(Ok(l)) if l.common_prefixes.is_empty()
            && l.objects.len() == 1
            && l.objects[0].location == marker)
    }

    /// True if directory `d`'s names are older than the TTL, or were never read.
    fn stale(&self, d: &Dir) -> bool {
        d.listed.is_none_or(|at| at.elapsed() >= self.ttl)
    }

    /// What the listing says of `rel` now: a directory listed within the TTL is trusted, an
    /// object checked within it too; else the store is asked again.
    fn current(&self, rel: &Path) -> io::Result<SourceMeta> {
        {
            let tree = self.tree.read();
            if let Some(d) = tree.dirs.get(rel) {
                return Ok(d.meta);
            }
            if let Some(o) = tree.objects.get(rel)
                && o.checked.elapsed() < self.ttl
            {
                return Ok(o.meta);
            }
        }
        if self.tree.read().objects.contains_key(rel) {
            return self.head(rel);
        }
        // Unknown: new since the parent was listed, if that was longer ago than the TTL.
        let parent = rel.parent().unwrap_or(Path::new(""));
        let stale = (self.tree.read().dirs.get(parent)).is_some_and(|d| self.stale(d));
        if stale {
            self.relist(parent)?;
            let tree = self.tree.read();
            if let Some(d) = tree.dirs.get(rel) {
                return Ok(d.meta);
            }
            if let Some(o) = tree.objects.get(rel) {
                return Ok(o.meta);
            }
        }
        Err(io::Error::from_raw_os_error(libc::ENOENT))
    }
}

/// The log's warnings of what a listing of `name` left out, one line for each kind, naming
/// the first key of it.
fn warn_skipped(name: &Path, skipped: &Skipped) {
    let name = name.display();
    let more = |n: usize| match n {
        0 | 1 => String::new(),
        n => format!(" (and {} more)", n - 1),
    };
    if skipped.unsafe_keys > 0 {
        tracing::warn!(
            "{name}: left out {} key(s) that are no safe path (an empty, '.' or '..' component)",
            skipped.unsafe_keys
        );
    }
    if let Some(first) = skipped.shadowed.first() {
        tracing::warn!(
            "{name}: left out the object {} whose name is also a directory's (the directory wins){}",
            first.display(),
            more(skipped.shadowed.len())
        );
    }
    if let Some(first) = skipped.markers.first() {
        tracing::warn!(
            "{name}: left out the folder marker {0}/ (an empty key ending in '/') beside the object {0}, which is the file{1}",
            first.display(),
            more(skipped.markers.len())
        );
    }
}

/// Runs `f` on `runtime` and waits for its output, from any thread (a runtime's own too).
fn run_on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    f: impl Future<Output = T> + Send + 'static,
) -> io::Result<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv()
        .map_err(|_| io::Error::other("the object store's runtime ended"))
}

/// The errno for a store error: 404 ENOENT, 412 ESTALE (the object changed), 403 and 401
/// EACCES, anything else (retries exhausted, a bad answer) EIO.
fn errno_of(e: &object_store::Error) -> i32 {
    match e {
        object_store::Error::NotFound { .. } => libc::ENOENT,
        object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
            libc::ESTALE
        }
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => libc::EACCES,
        _ => libc::EIO,
    }
}

/// The store of `url`, configured from the environment and the AWS profile files, with
/// every request counted.
fn build_store(url: &ObjectUrl, counters: Arc<Counters>) -> io::Result<Arc<dyn ObjectStore>> {
    use object_store::ClientConfigKey;
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
    // Keys from the environment are a set: none of the profile's is mixed in with them.
    let env_keys = builder
        .get_config_value(&AmazonS3ConfigKey::AccessKeyId)
        .is_some();
    for (key, value) in profile::settings(&profile::Files::from_env()) {
        let Ok(key) = key.parse::<AmazonS3ConfigKey>() else {
            continue;
        };
        let credential = matches!(
            key,
            AmazonS3ConfigKey::AccessKeyId
                | AmazonS3ConfigKey::SecretAccessKey
                | AmazonS3ConfigKey::Token
        );
        if !(credential && env_keys) && builder.get_config_value(&key).is_none() {
            builder = builder.with_config(key, value);
        }
    }
    // An endpoint written as http:// says plain HTTP, as it does to the AWS CLI.
    let allow_http = AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp);
    let plain = (builder.get_config_value(&AmazonS3ConfigKey::Endpoint))
        .is_some_and(|e| e.starts_with("http://"));
    if plain && std::env::var_os("AWS_ALLOW_HTTP").is_none() {
        builder = builder.with_config(allow_http, "true");
    }
    let timeout = format!("{}ms", request_timeout()?.as_millis());
    builder = builder.with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), timeout);
    let store = builder
        .with_retry(retries())
        .with_http_connector(CountingConnector(counters))
        .build()
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(Arc::new(store))
}

/// Lists every object beneath `prefix`: the first levels one at a time with a delimiter
/// until there are enough prefixes to list in parallel, then each of those in full.
async fn list_all(
    store: Arc<dyn ObjectStore>,
    prefix: &str,
    name: &Path,
) -> io::Result<Vec<ObjectMeta>> {
    let fail = |e: object_store::Error| io::Error::other(listing_error(name, &e));
    let counted = Arc::new(AtomicU64::new(0));
    let progress = {
        let (counted, name) = (counted.clone(), name.to_path_buf());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(2));
            every.tick().await;
            loop {
                every.tick().await;
                let n = counted.load(Ordering::Relaxed);
                tracing::info!("{}: listed {n} objects so far", name.display());
            }
        })
    };
    let mut objects = Vec::new();
    let root = if prefix.is_empty() {
        None
    } else {
        Some(Key::parse(prefix).map_err(|e| fail(e.into()))?)
    };
    let mut frontier = vec![root];
    for _ in 0..3 {
        if frontier.len() >= LIST_PARALLEL {
            break;
        }
        let mut next = Vec::new();
        for p in &frontier {
            let l = store.list_with_delimiter(p.as_ref()).await.map_err(fail)?;
            counted.fetch_add(l.objects.len() as u64, Ordering::Relaxed);
            objects.extend(l.objects);
            next.extend(l.common_prefixes.into_iter().map(Some));
        }
        frontier = next;
        if frontier.is_empty() {
            break;
        }
    }
    let lists = futures::stream::iter(frontier.into_iter().map(|p| {
        let (store, counted) = (store.clone(), counted.clone());
        async move {
            let mut found = Vec::new();
            let mut s = store.list(p.as_ref());
            while let Some(o) = s.next().await {
                found.push(o?);
                counted.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, object_store::Error>(found)
        }
    }))
    .buffer_unordered(LIST_PARALLEL);
    futures::pin_mut!(lists);
    while let Some(found) = lists.next().await {
        objects.extend(found.map_err(fail)?);
    }
    progress.abort();
    Ok(objects)
}

/// A store error on one line: an S3 error document in it is cut to its code and message.
fn one_line(e: &object_store::Error) -> String {
    let text = e.to_string();
    let tag = |name: &str| {
        let (open, close) = (format!("<{name}>"), format!("</{name}>"));
        let from = text.find(&open)? + open.len();
        let to = from + text[from..].find(&close)?;
        Some(text[from..to].to_string())
    };
    let text = match (
        text.find("<?xml").or_else(|| text.find("<Error>")),
        tag("Code"),
    ) {
        (Some(at), Some(code)) => {
            let message = tag("Message")
                .map(|m| format!(" ({m})"))
                .unwrap_or_default();
            format!("{}{code}{message}", &text[..at])
        }
        _ => text.clone(),
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What a failed listing says, on one line, with what to do where the store's message does
/// not say it.
fn listing_error(name: &Path, e: &object_store::Error) -> String {
    if let object_store::Error::InvalidPath { source } = e
        && let Some(why) = unlistable_key(source)
    {
        return format!(
            "listing {}: {why}, which no path may hold: mount a prefix beside that key",
            name.display()
        );
    }
    let text = one_line(e);
    let hint = if text.contains("169.254.169.254") {
        "; no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (~/.aws/credentials)"
    } else {
        ""
    };
    format!("listing {}: {text}{hint}", name.display())
}

/// Why the store's client refused a key of a listing (`object_store` refuses the page that
/// holds it), in words: the key (escaped, so that the line stays one line) and what it holds
/// that no path may: a control character, named (a tab was blamed on an empty, `.` or `..`
/// component), an empty component, or a `.` or `..` one.
fn unlistable_key(e: &object_store::path::Error) -> Option<String> {
    use object_store::path::Error as P;
    let key = match e {
        P::EmptySegment { path } | P::BadSegment { path, .. } => path,
        _ => return None,
    };
    let why = if let Some(c) = key.chars().find(|c| c.is_control()) {
        let name = match c {
            '\t' => ", a tab",
            '\n' => ", a newline",
            '\r' => ", a carriage return",
            '\0' => ", a NUL",
            _ => "",
        };
        format!("holds a control character (U+{:04X}{name})", c as u32)
    } else if key.trim_matches('/').split('/').any(|c| c.is_empty()) {
        "has an empty component ('//')".to_string()
    } else {
        "has a '.' or '..' component".to_string()
    };
    Some(format!("the key {key:?} {why}"))
}

impl DatasetSource for ObjectSource {
    fn root(&self) -> &Path {
        &self.name
    }

    fn metadata(&self, rel: &Path, _who: &Creds) -> io::Result<SourceMeta> {
        self.current(rel)
    }

    fn open_dir(&self, rel: &Path, _who: &Creds) -> io::Result<Listing> {
        let stale = match self.tree.read().dirs.get(rel) {
            Some(d) => self.stale(d),
            None => {
                return Err(self
                    .current(rel)
                    .and(Err(io::Error::from_raw_os_error(libc::ENOTDIR)))?);
            }
        };
        if stale {
            self.relist(rel)?;
        }
        let tree = self.tree.read();
        let dir = (tree.dirs.get(rel)).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let entries = (dir.children.iter())
            .filter_map(|(name, kind)| {
                let path = rel.join(name);
                let meta = match kind {
                    Kind::Dir => tree.dirs.get(&path)?.meta,
                    _ => tree.objects.get(&path)?.meta,
                };
                Some((name.clone(), meta))
            })
            .collect();
        Ok(Listing::known(dir.meta, entries))
    }

    fn read_link(&self, _rel: &Path) -> io::Result<PathBuf> {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn open_file(&self, rel: &Path, _who: &Creds) -> io::Result<(SourceFile, SourceMeta)> {
        let meta = self.current(rel)?;
        if meta.attr.kind != Kind::File {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        Ok((SourceFile::Object(meta), meta))
    }

    fn first_unreadable(
        &self,
        _files: &mut dyn Iterator<Item = PathBuf>,
        _who: &Creds,
    ) -> io::Result<Option<usize>> {
        // Every object is readable by every user of the mount (mode 0444).
        Ok(None)
    }

    fn acl(&self, _rel: &Path, _name: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(None)
    }

    fn read_block(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let mut at = 0;
        self.get_range(rel, version, offset, buf.len(), &mut |from| {
            buf[at..at + from.len()].copy_from_slice(from);
            at += from.len();
        })
    }

    /// One ranged GET for all of `blocks`, its body copied into each in turn, each
    /// allocated when the body reaches it and handed over once full.
    fn read_blocks(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        blocks: &mut RunBlocks,
        filled: &mut dyn FnMut(Block),
    ) -> io::Result<usize> {
        let len = blocks.bytes();
        let (mut current, mut at, mut failed) = (None, 0, None);
        let got = self.get_range(rel, version, offset, len, &mut |mut from| {
            while !from.is_empty() && failed.is_none() {
                if current.is_none() {
                    match blocks.next() {
                        Some(Ok(block)) => current = Some(block),
                        Some(Err(e)) => failed = Some(e),
                        None => return,
                    }
                    at = 0;
                    continue;
                }
                let block: &mut Block = current.as_mut().expect("a block being filled");
                let n = (block.len() - at).min(from.len());
                block.whole_mut()[at..at + n].copy_from_slice(&from[..n]);
                (at, from) = (at + n, &from[n..]);
                if at == block.len() {
                    filled(current.take().expect("a block being filled"));
                }
            }
        });
        match failed {
            // The blocks were not there to read into: the GET's answer is moot.
            Some(e) => Err(e),
            None => got,
        }
    }
    fn memory(&self) -> u64 {
        self.tree.read().memory
    }

    fn statfs(&self) -> io::Result<FsStats> {
        let tree = self.tree.read();
        let blocks = tree.bytes.div_ceil(4096);
        Ok(FsStats {
            blocks,
            bfree: 0,
            bavail: 0,
            files: (tree.objects.len() + tree.dirs.len()) as u64,
            ffree: 0,
            bsize: 4096,
            namelen: 1024,
            frsize: 4096,
        })
    }
}

/// The store's HTTP client, counting every request and every answer that gets retried.
#[derive(Debug)]
struct CountingConnector(Arc<Counters>);

impl object_store::client::HttpConnector for CountingConnector {
    fn connect(
        &self,
        options: &object_store::ClientOptions,
    ) -> object_store::Result<object_store::client::HttpClient> {
        let inner = object_store::client::ReqwestConnector::default().connect(options)?;
        Ok(object_store::client::HttpClient::new(Counting {
            inner,
            counters: self.0.clone(),
        }))
    }
}

/// See [`CountingConnector`].
#[derive(Debug)]
struct Counting {
    inner: object_store::client::HttpClient,
    counters: Arc<Counters>,
}

#[async_trait::async_trait]
impl object_store::client::HttpService for Counting {
    async fn call(
        &self,
        req: object_store::client::HttpRequest,
    ) -> Result<object_store::client::HttpResponse, object_store::client::HttpError> {
        let c = &self.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        let answer = self.inner.execute(req).await;
        match &answer {
            Ok(r) => {
                let status = r.status();
                if status.as_u16() == 503 || status.as_u16() == 429 {
                    c.throttled.fetch_add(1, Ordering::Relaxed);
                }
                if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
                    c.retried.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) => {
                c.retried.fetch_add(1, Ordering::Relaxed);
            }
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Result<ObjectUrl, String> {
        ObjectUrl::parse(Path::new(s))
    }

    #[test]
    fn urls_parse_and_bad_ones_say_why() {
        assert_eq!(
            url("s3://my-bucket/train/images/").unwrap(),
            ObjectUrl {
                bucket: "my-bucket".into(),
                prefix: "train/images".into()
            }
        );
        assert_eq!(url("s3://bkt").unwrap().prefix, "");
        assert!(
            url("s3://Bad_Bucket/x")
                .unwrap_err()
                .contains("not a bucket name")
        );
        assert!(url("s3://bkt/a/../b").unwrap_err().contains("'..'"));
        assert!(url("s3://bkt/a//b").unwrap_err().contains("empty"));
        assert!(ObjectUrl::is_url(Path::new("s3://b/p")));
        assert!(!ObjectUrl::is_url(Path::new("/data")));
    }

    #[test]
    fn keys_map_to_safe_paths_beneath_the_prefix() {
        let u = url("s3://bkt/data").unwrap();
        assert_eq!(u.rel_of("data/a/b.jpg"), Some(PathBuf::from("a/b.jpg")));
        assert_eq!(u.rel_of("database/x"), None);
        assert_eq!(u.rel_of("data/a/../etc"), None);
        assert_eq!(u.rel_of("data/a//b"), None);
        assert_eq!(u.rel_of("data/dir/"), None);
        assert_eq!(
            u.key(Path::new("a/b.jpg")).unwrap().as_ref(),
            "data/a/b.jpg"
        );
        // As listed: not percent-encoded (the request's URL encodes it, once).
        let odd = "data/d?#%/\\\u{fc}ber 100%.bin";
        assert_eq!(
            u.rel_of(odd),
            Some(PathBuf::from("d?#%/\\\u{fc}ber 100%.bin"))
        );
        assert_eq!(u.key(&u.rel_of(odd).unwrap()).unwrap().as_ref(), odd);
        assert_eq!(u.dir_prefix(Path::new("a")), "data/a/");
        assert_eq!(u.dir_prefix(Path::new("")), "data/");
        let root = url("s3://bkt").unwrap();
        assert_eq!(root.dir_prefix(Path::new("")), "");
        assert_eq!(root.rel_of("x"), Some(PathBuf::from("x")));
    }

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
    fn a_listing_refused_for_a_key_says_what_the_key_holds() {
        let refused = |key: &str| {
            let e = object_store::Error::from(Key::parse(key).unwrap_err());
            listing_error(Path::new("s3://b/p"), &e)
        };
        let beside = ", which no path may hold: mount a prefix beside that key";
        assert_eq!(
            refused("p/a\tb"),
            format!(
                "listing s3://b/p: the key \"p/a\\tb\" holds a control character (U+0009, a tab){beside}"
            )
        );
        assert_eq!(
            refused("p/\u{1b}x"),
            format!(
                "listing s3://b/p: the key \"p/\\u{{1b}}x\" holds a control character (U+001B){beside}"
            )
        );
        assert_eq!(
            refused("p//x"),
            format!("listing s3://b/p: the key \"p//x\" has an empty component ('//'){beside}")
        );
        assert_eq!(
            refused("p/../x"),
            format!("listing s3://b/p: the key \"p/../x\" has a '.' or '..' component{beside}")
        );
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

    #[test]
    fn store_errors_become_the_errno_the_caller_gets() {
        let e = |f: fn(String) -> object_store::Error| errno_of(&f("k".into()));
        assert_eq!(
            e(|path| object_store::Error::NotFound {
                path,
                source: "x".into()
            }),
            libc::ENOENT
        );
        assert_eq!(
            e(|path| object_store::Error::Precondition {
                path,
                source: "x".into()
            }),
            libc::ESTALE
        );
        assert_eq!(
            e(|path| object_store::Error::PermissionDenied {
                path,
                source: "x".into()
            }),
            libc::EACCES
        );
        assert_eq!(
            errno_of(&object_store::Error::Generic {
                store: "S3",
                source: "503".into()
            }),
            libc::EIO
        );
    }
}
