//! A dataset in an object store: `coorfs mount s3://BUCKET/PREFIX` (or `gs://`, `az://`,
//! `https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX`) `MOUNTPOINT`. One source for
//! the three clouds: they differ only in their client's configuration ([`store`]).
//!
//! The namespace is listed lazily ([`tree`]): the mount lists the prefix's first level (one
//! delimiter listing) and returns; each directory is listed when first looked up, and the
//! background scan (`crate::fs::scan`, [`DatasetSource::scan_threads`] at once) lists the
//! rest. A directory asked for by two callers is listed once. `--manifest` gives the whole
//! tree instead, with no listing ([`manifest`]). Keys become paths, `/` separating
//! directories; a key that is no safe path fails its directory's listing with a message that
//! names it ([`errors`]); a name that is an object and a prefix is the directory, unless the
//! prefix holds only its folder marker, and a lone folder marker is an empty directory.
//! Objects are files of mode 0444, directories 0555, owned by root.
//!
//! An object's version is its ETag, size and time: the ETag's hash stands in for the inode
//! number, so the cache, the disk tier and the cluster tell two versions apart. The listing
//! is trusted for `--metadata-ttl`; after that an open asks the store again (HEAD). Every
//! read is a ranged GET conditional on the version the open saw (`If-Match`), and its answer's
//! ETag is checked too (an emulator may ignore `If-Match`): a changed object fails the read
//! with ESTALE instead of mixing two versions, and nothing of a failed read is kept.
//!
//! The client is async, the callers (FUSE and fetch threads) are not: each call runs on the
//! source's runtime and its caller waits ([`ObjectSource::wait`]), so many threads keep many
//! requests in flight. Faults are retried by the client ([`store`]) and counted
//! ([`counting`]); what still fails reaches the caller as an errno with one log line. At an
//! `http://` S3 endpoint the callers read GETs' bodies from the socket themselves
//! ([`direct`]), and hand the client only what that path does not take.

mod counting;
mod direct;
mod errors;
mod listing;
pub mod manifest;
pub mod profile;
mod store;
mod tree;
mod url;

pub use counting::Counters;
pub use url::{Cloud, ObjectUrl};

use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt};
use parking_lot::{Condvar, Mutex, RwLock};

use super::{Creds, DatasetSource, FsStats, Listing, SourceError, SourceFile, SourceResult};
use crate::block::{Block, RunBlocks};
use crate::namespace::{FileVersion, Kind, SourceMeta};
use direct::{Body, Direct, Got};
use errors::{errno_of, listing_error, one_line, refusal};
use listing::warn_skipped;
use store::build_store;
use tree::{Dir, Entry, Tree, object_meta, same_etag};
use url::key_of;

/// A dataset in an object store.
#[derive(Debug)]
pub struct ObjectSource {
    /// The URL, for messages.
    name: PathBuf,
    url: ObjectUrl,
    store: Arc<dyn ObjectStore>,
    /// GETs read from the socket, where the store allows ([`direct`]).
    direct: Option<Arc<Direct>>,
    runtime: tokio::runtime::Runtime,
    tree: RwLock<Tree>,
    /// How long the listing (and a HEAD) is trusted.
    ttl: Duration,
    /// Directories being listed now, so that a second caller waits for the first's listing
    /// rather than asking the store again; `listed` wakes it.
    listing: Mutex<HashSet<PathBuf>>,
    listed: Condvar,
    /// The tree came whole from a manifest: the scan reads memory, not the store.
    from_manifest: bool,
    /// GETs sent ahead of their readers ([`DatasetSource::send_ahead`]), oldest first.
    ahead: Mutex<Vec<Ahead>>,
    counters: Arc<Counters>,
}

/// A ranged GET of an object's version ([`ObjectSource::request`]).
struct Request {
    key: object_store::path::Path,
    options: GetOptions,
    /// The ETag the answer must name.
    etag: Option<String>,
    /// The range's end (its start is the caller's).
    end: u64,
}

/// The answer to a GET, its head once it came: the ETag it names and the body to come.
type Answer = Result<
    (
        Option<String>,
        futures::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
    ),
    object_store::Error,
>;

/// A GET sent ahead of its reader: its range of an object's version, when it was sent, and
/// the task that sends it. The answer waits in the connection (the socket's buffer, then the
/// sender's window) until a read of that very range takes it.
struct Ahead {
    rel: PathBuf,
    version: FileVersion,
    range: std::ops::Range<u64>,
    sent: Instant,
    answer: Pending,
}

/// The task of a GET sent ahead: object_store's, which waits for the answer's head, or the
/// one that writes [`direct`]'s request.
enum Pending {
    Store(tokio::task::JoinHandle<Answer>),
    Direct(tokio::task::JoinHandle<io::Result<direct::Sent>>),
}

impl Pending {
    /// Drops the GET: its connection is closed, its answer unread.
    fn abort(&self) {
        match self {
            Pending::Store(task) => task.abort(),
            Pending::Direct(task) => task.abort(),
        }
    }
}

impl Ahead {
    /// True if this is the GET sent ahead from `offset` of `rel` at `version`.
    fn is_for(&self, rel: &Path, version: &FileVersion, offset: u64) -> bool {
        self.rel == rel && self.version == *version && self.range.start == offset
    }

    /// True while its read may still take it ([`AHEAD_FOR`]).
    fn young(&self) -> bool {
        self.sent.elapsed() < AHEAD_FOR
    }
}

impl std::fmt::Debug for Ahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{:?}", self.rel.display(), self.range)
    }
}

/// GETs sent ahead that wait at most (no more are sent while they do): a reader's next few
/// objects for a few jobs, each holding a connection whose window the store has filled.
pub const AHEAD_MAX: usize = 8;

/// How long a GET sent ahead is taken by its read: an older one is dropped and the read sends
/// its own (a store closes a connection left unread for long).
pub const AHEAD_FOR: Duration = Duration::from_secs(10);

/// Bytes of a GET's body its receiving task hands over at a time ([`ObjectSource::get_range`]).
const BODY_BATCH: usize = 512 << 10;

/// Directories the background scan lists at once: each listing waits on the store's
/// latency, not on a CPU.
pub const LIST_PARALLEL: usize = 16;

impl ObjectSource {
    /// GETs `len` bytes of `rel` from `offset`, or to the end of the object, if it is still
    /// `version`, into `body` as the bytes arrive: through [`direct`] where it can, else (and
    /// for whatever it left) through object_store's client. Returns the bytes read.
    fn get_range(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        len: usize,
        body: &mut dyn Body,
    ) -> SourceResult<usize> {
        let Some(request) = self.request(rel, version, offset, len)? else {
            return Ok(0);
        };
        let end = request.end;
        // At debug level, a line for each GET as it ends (inside its fetch's): the key, the
        // range, the bytes it gave, its time, whether it was sent ahead and read here.
        let span = tracing::debug_span!(
            "get",
            key = %request.key,
            range = %format_args!("{offset}..{end}"),
            bytes = tracing::field::Empty,
            ahead = tracing::field::Empty,
            direct = tracing::field::Empty,
        )
        .entered();
        let (ahead_direct, ahead_store) = match self.take_ahead(rel, version, offset..end) {
            Some(Pending::Direct(sent)) => (Some(sent), None),
            Some(Pending::Store(answer)) => (None, Some(answer)),
            None => (None, None),
        };
        if ahead_direct.is_some() || ahead_store.is_some() {
            span.record("ahead", true);
        }
        // A GET sent ahead through the direct client is read by it even if it has turned off
        // since.
        let direct = match ahead_direct {
            Some(_) => self.direct.as_ref().zip(request.etag.as_deref()),
            None => self.direct_for(request.etag.as_deref()),
        };
        let mut from = offset;
        if let Some((direct, etag)) = direct {
            match self.get_direct(direct, &request, etag, offset, ahead_direct, body) {
                Got::Read(n) => {
                    span.record("bytes", n);
                    span.record("direct", true);
                    return Ok(n);
                }
                Got::Rest(n) => from += n as u64,
                Got::Changed => return Err(self.gone_or_changed(rel)),
            }
        }
        let rest = if from == offset {
            request
        } else {
            match self.request(rel, version, from, (end - from) as usize)? {
                Some(rest) => rest,
                None => return Ok((from - offset) as usize),
            }
        };
        let got = (from - offset) as usize + self.get_store(rel, rest, from, ahead_store, body)?;
        span.record("bytes", got);
        Ok(got)
    }

    /// The direct client and the ETag of a GET of the version `etag`, if the GET may go
    /// through it: it is on, and the ETag can go in a header.
    fn direct_for<'a>(&'a self, etag: Option<&'a str>) -> Option<(&'a Arc<Direct>, &'a str)> {
        let (direct, etag) = (self.direct.as_ref()?, etag?);
        (direct.on() && direct::header_safe(etag)).then_some((direct, etag))
    }

    /// Reads `request` (from `offset`, of the version `etag`) through `direct`: its GET sent
    /// ahead, or one sent now.
    fn get_direct(
        &self,
        direct: &Direct,
        request: &Request,
        etag: &str,
        offset: u64,
        ahead: Option<tokio::task::JoinHandle<io::Result<direct::Sent>>>,
        body: &mut dyn Body,
    ) -> Got {
        let range = offset..request.end;
        // Sent ahead and failed (a connection refused meanwhile): this read sends again.
        let sent = ahead.and_then(|a| self.wait(a).ok()?.ok()?.ok());
        let sent = match sent {
            Some(sent) => sent,
            None => {
                let Some(url) = self.sign(direct, &request.key) else {
                    return Got::Rest(0);
                };
                match direct.send(url, range.clone(), etag) {
                    Ok(sent) => sent,
                    Err(_) => return direct.failed(0),
                }
            }
        };
        direct.receive(sent, range, etag, body)
    }

    /// The presigned URL of a GET of `key`; None if signing fails (and then `direct` is off).
    fn sign(&self, direct: &Direct, key: &object_store::path::Path) -> Option<::url::Url> {
        match self.wait(direct.presign(key)) {
            Ok(Ok(url)) => Some(url),
            Ok(Err(e)) => {
                direct.signing_failed(&self.name, &one_line(&e));
                None
            }
            Err(_) => None,
        }
    }

    /// Sends `request` (of bytes of `rel` from `from`) through object_store's client, or
    /// takes the GET sent ahead for it (`ahead`), and reads its body into `body`
    /// ([`BODY_BATCH`] at a time). Returns the bytes read.
    fn get_store(
        &self,
        rel: &Path,
        request: Request,
        from: u64,
        ahead: Option<tokio::task::JoinHandle<Answer>>,
        body: &mut dyn Body,
    ) -> SourceResult<usize> {
        let Request {
            key,
            options,
            etag,
            end,
        } = request;
        let store = self.store.clone();
        let opened = match ahead {
            Some(answer) => match self.wait(answer)? {
                Ok(Ok(head)) => Ok(head),
                // Sent ahead and failed (a connection the store closed meanwhile): this
                // read asks again, as it would have without it.
                _ => self.wait(Self::get(store, key, options))?,
            },
            None => self.wait(Self::get(store, key, options))?,
        };
        let mut stream = match opened {
            // A store that ignores If-Match (fake-gcs-server does) still names the version it
            // sends: another one is refused here, before a byte of it is used.
            Ok((Some(got), _)) if etag.as_deref().is_some_and(|want| !same_etag(want, &got)) => {
                return Err(self.gone_or_changed(rel));
            }
            Ok((_, stream)) => stream,
            Err(e) => return self.get_failed(rel, &e),
        };
        let want = (end - from) as usize;
        // A task of the runtime takes the body from the socket while this thread copies what
        // came before into its blocks: receiving and copying overlap, with at most a batch in
        // the channel between them. (Taking a MiB, then copying it, left the socket unread
        // while the blocks were filled and cached.) The task ends when the body does, or at
        // its next batch once this side stops listening.
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        self.runtime.spawn(async move {
            loop {
                let (mut chunks, mut n, mut over) = (Vec::new(), 0, false);
                while n < BODY_BATCH {
                    match stream.next().await {
                        Some(Ok(bytes)) => {
                            n += bytes.len();
                            chunks.push(Ok(bytes));
                        }
                        Some(Err(e)) => {
                            chunks.push(Err(e));
                            over = true;
                            break;
                        }
                        None => {
                            over = true;
                            break;
                        }
                    }
                }
                if (!chunks.is_empty() && tx.send(chunks).await.is_err()) || over {
                    return;
                }
            }
        });
        let mut got = 0usize;
        // Not the runtime's blocking receive: that one refuses a runtime's thread, and a peer's
        // request may read from the store on one.
        while let Some(chunks) = futures::executor::block_on(rx.recv()) {
            for chunk in chunks {
                let bytes = match chunk {
                    Ok(bytes) => bytes,
                    Err(e) => return self.get_failed(rel, &e),
                };
                if got + bytes.len() > want {
                    got += bytes.len();
                    break;
                }
                // The body has no room left: its caller knows why, and the rest is moot.
                if !body.put(&bytes) {
                    return Ok(got);
                }
                got += bytes.len();
            }
            if got > want {
                break;
            }
        }
        if got != want {
            tracing::warn!(
                "{}/{}: GET of bytes {from}..{end} answered {got} bytes",
                self.name.display(),
                rel.display(),
            );
            return Err(SourceError::Refused {
                errno: libc::EIO,
                why: format!("GET of bytes {from}..{end} answered {got} bytes"),
            });
        }
        Ok(got)
    }

    /// The GET of `len` bytes of `rel` from `offset` if it is still `version`; None if the
    /// range is empty.
    fn request(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        len: usize,
    ) -> SourceResult<Option<Request>> {
        let (etag, last_modified) = {
            let tree = self.tree.read();
            // Gone (a read found it so), or another version now.
            let o = (tree.object(rel)).ok_or(SourceError::NotFound)?;
            if o.meta().version != *version {
                return Err(SourceError::Changed);
            }
            (o.etag.text(), o.last_modified())
        };
        let end = (offset + len as u64).min(version.size);
        if offset >= end {
            return Ok(None);
        }
        let options = GetOptions {
            // The version the open saw, or none: never bytes of two versions in one file.
            if_unmodified_since: etag.is_none().then_some(last_modified),
            if_match: etag.clone(),
            range: Some(GetRange::Bounded(offset..end)),
            ..Default::default()
        };
        Ok(Some(Request {
            key: self.url.key(rel)?,
            options,
            etag,
            end,
        }))
    }

    /// Sends a GET and waits for its answer's head.
    async fn get(
        store: Arc<dyn ObjectStore>,
        key: object_store::path::Path,
        options: GetOptions,
    ) -> Answer {
        let r = store.get_opts(&key, options).await?;
        Ok((r.meta.e_tag.clone(), r.into_stream()))
    }

    /// The GET sent ahead for `range` of `rel` at `version`, if one was and is young enough
    /// ([`AHEAD_FOR`]). One sent for another range from the same offset is dropped: its
    /// reader reads another run, and it would only hold its connection.
    fn take_ahead(
        &self,
        rel: &Path,
        version: &FileVersion,
        range: std::ops::Range<u64>,
    ) -> Option<Pending> {
        let mut ahead = self.ahead.lock();
        let i = (ahead.iter()).position(|a| a.is_for(rel, version, range.start))?;
        let a = ahead.remove(i);
        drop(ahead);
        if a.range == range && a.young() {
            return Some(a.answer);
        }
        a.answer.abort();
        self.counters.ahead_unused.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Connects to the store of `url` and lists the prefix's first level, or reads the
    /// `manifest` instead, and returns the source: the rest is listed when looked up, or by
    /// the scan. `ttl` is how long a listing is trusted.
    pub fn open(
        url: ObjectUrl,
        ttl: Duration,
        counters: Arc<Counters>,
        manifest: Option<&Path>,
    ) -> io::Result<Self> {
        let (store, direct) = build_store(&url, counters.clone())?;
        let mut source = Self::over(url, store, ttl, manifest, counters)?;
        source.direct = direct.map(Arc::new);
        Ok(source)
    }

    /// [`ObjectSource::open`] over a client made already.
    fn over(
        url: ObjectUrl,
        store: Arc<dyn ObjectStore>,
        ttl: Duration,
        manifest: Option<&Path>,
        counters: Arc<Counters>,
    ) -> io::Result<Self> {
        let name = url.name();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("coorfs-store")
            .enable_all()
            .build()?;
        let now = Instant::now();
        let tree = match manifest {
            Some(file) => {
                let folders = manifest::read(file, &url)?;
                let (tree, skipped) = Tree::from_folders(folders, now, SystemTime::now());
                warn_skipped(&name, &skipped);
                tracing::info!(
                    "{}: {} objects from the manifest {}",
                    name.display(),
                    tree.objects,
                    file.display()
                );
                tree
            }
            None => Tree::new(SystemTime::now()),
        };
        let source = ObjectSource {
            name,
            url,
            store,
            direct: None,
            runtime,
            tree: RwLock::new(tree),
            ttl,
            listing: Mutex::new(HashSet::new()),
            listed: Condvar::new(),
            from_manifest: manifest.is_some(),
            ahead: Mutex::new(Vec::new()),
            counters,
        };
        if manifest.is_none() {
            // The first level: a store that cannot be listed refuses the mount here.
            source.list_dir(Path::new("")).map_err(|e| match e {
                ListError::Store(e) => io::Error::other(listing_error(&source.name, &e)),
                ListError::Io(e) => io::Error::other(e),
            })?;
        }
        Ok(source)
    }

    /// Entries of the dataset's root: none is most often a typo in the prefix.
    pub fn root_entries(&self) -> usize {
        let tree = self.tree.read();
        tree.dirs.get(Path::new("")).map_or(0, |d| d.entries.len())
    }

    /// Runs `f` on the source's runtime and waits for it.
    fn wait<T: Send + 'static>(
        &self,
        f: impl Future<Output = T> + Send + 'static,
    ) -> SourceResult<T> {
        run_on(&self.runtime, f)
    }

    /// The error of a GET of `rel` that failed with `e`: a failure carries the store's words
    /// to the caller's one log line of the read; a changed or deleted object is logged only at
    /// debug (the next open sees what is there now).
    fn get_failed(&self, rel: &Path, e: &object_store::Error) -> SourceResult<usize> {
        match refusal("GET", e) {
            SourceError::Changed | SourceError::NotFound => {
                let (name, why) = (self.name.display(), one_line(e));
                tracing::debug!("{name}/{}: GET: {why}", rel.display());
                Err(self.gone_or_changed(rel))
            }
            refused => Err(refused),
        }
    }

    /// The error of a GET the store refused because object `rel` changed since it was listed
    /// or is gone: the store is asked again (HEAD), and the caller gets ESTALE if the object
    /// is there in another version, ENOENT if it is gone.
    fn gone_or_changed(&self, rel: &Path) -> SourceError {
        match self.head(rel) {
            Err(SourceError::NotFound) => SourceError::NotFound,
            _ => SourceError::Changed,
        }
    }

    /// Asks the store about object `rel` again (HEAD) and keeps the answer.
    fn head(&self, rel: &Path) -> SourceResult<SourceMeta> {
        let (store, key) = (self.store.clone(), self.url.key(rel)?);
        let answer = self.wait(async move { store.head(&key).await })?;
        let now = Instant::now();
        match answer {
            Ok(o) => {
                self.tree.write().insert_object(rel, &o, now);
                Ok(object_meta(o.size, o.last_modified, o.e_tag.as_deref()))
            }
            Err(object_store::Error::NotFound { .. }) => {
                self.tree.write().remove(rel);
                Err(SourceError::NotFound)
            }
            Err(e) => Err(refusal("HEAD", &e)),
        }
    }

    /// Lists directory `rel` (one level, all its pages) and keeps what it finds, unless
    /// another caller is listing it now: then waits for that listing instead.
    fn relist(&self, rel: &Path) -> SourceResult<()> {
        {
            let mut busy = self.listing.lock();
            if busy.contains(rel) {
                while busy.contains(rel) {
                    self.listed.wait(&mut busy);
                }
                let tree = self.tree.read();
                if tree.dirs.get(rel).is_some_and(|d| !self.stale(d)) {
                    return Ok(());
                }
            }
            busy.insert(rel.to_path_buf());
        }
        let done = self.list_dir(rel);
        self.listing.lock().remove(rel);
        self.listed.notify_all();
        done.map_err(|e| match e {
            ListError::Store(object_store::Error::NotFound { .. })
                if !rel.as_os_str().is_empty() =>
            {
                self.tree.write().remove(rel);
                SourceError::NotFound
            }
            // A key no path may hold says which: the words name it. Whoever asked logs them.
            ListError::Store(e) => SourceError::Refused {
                errno: errno_of(&e),
                why: listing_error(&self.name.join(rel), &e),
            },
            ListError::Io(e) => e,
        })
    }

    /// One delimiter listing of directory `rel`, put in the tree.
    fn list_dir(&self, rel: &Path) -> Result<(), ListError> {
        let prefix = self.url.dir_prefix(rel);
        let prefix = if prefix.is_empty() {
            None
        } else {
            Some(key_of(prefix.trim_end_matches('/')).map_err(ListError::Io)?)
        };
        let store = self.store.clone();
        let listed = self
            .wait(async move { store.list_with_delimiter(prefix.as_ref()).await })
            .map_err(ListError::Io)?
            .map_err(ListError::Store)?;
        let name_of = |key: &str| -> Option<Box<str>> {
            let r = self.url.rel_of(key)?;
            (r.parent() == Some(rel)).then(|| r.file_name()?.to_str().map(Box::from))?
        };
        let files: Vec<(Box<str>, ObjectMeta)> = (listed.objects.into_iter())
            .filter_map(|o| Some((name_of(o.location.as_ref())?, o)))
            .collect();
        let mut subdirs: Vec<Box<str>> = (listed.common_prefixes.iter())
            .filter_map(|p| name_of(p.as_ref()))
            .collect();
        // A name that is an object and a prefix whose one key is its folder marker: the
        // object is the file (as [`tree::drop_markers`] keeps it); else the directory wins.
        subdirs.retain(|d| {
            let beside = files.iter().any(|(f, _)| f == d);
            let marker_only = beside && self.only_a_marker(&rel.join(&**d));
            if marker_only {
                tracing::warn!(
                    "{}: left out the folder marker {1}/ (an empty key ending in '/') beside the object {1}, which is the file",
                    self.name.display(),
                    rel.join(&**d).display()
                );
            } else if beside {
                tracing::warn!(
                    "{}: left out the object {} whose name is also a directory's (the directory wins)",
                    self.name.display(),
                    rel.join(&**d).display()
                );
            }
            !marker_only
        });
        let mut tree = self.tree.write();
        if rel.as_os_str().is_empty() || tree.dirs.contains_key(rel) {
            tree.set_listing(rel, files, subdirs, Instant::now(), SystemTime::now());
        }
        Ok(())
    }

    /// True if the only key beneath directory `rel`, if any, is its folder marker (`rel/`).
    fn only_a_marker(&self, rel: &Path) -> bool {
        let Ok(key) = self.url.key(rel) else {
            return false;
        };
        let store = self.store.clone();
        let marker = key.clone();
        let answer = self.wait(async move { store.list_with_delimiter(Some(&key)).await });
        // Azure's client leaves the marker out of the listing of its own prefix.
        matches!(answer, Ok(Ok(l)) if l.common_prefixes.is_empty()
            && l.objects.iter().all(|o| o.location == marker))
    }

    /// True if directory `d`'s names are older than the TTL, or were never read.
    fn stale(&self, d: &Dir) -> bool {
        d.listed.is_none_or(|at| at.elapsed() >= self.ttl)
    }

    /// What the listing says of `rel` now: a directory is trusted, an object checked within
    /// the TTL too; else the store is asked again. A name its directory's listing lacks is
    /// asked of the store by listing that directory if its names are older than the TTL (or
    /// not read yet: the first lookup in a directory lists it).
    fn current(&self, rel: &Path) -> SourceResult<SourceMeta> {
        let known = {
            let tree = self.tree.read();
            if let Some(d) = tree.dirs.get(rel) {
                return Ok(d.meta);
            }
            match tree.object(rel) {
                Some(o) if tree.age(o) < self.ttl => return Ok(o.meta()),
                Some(_) => true,
                None => false,
            }
        };
        if known {
            return self.head(rel);
        }
        let parent = rel.parent().unwrap_or(Path::new(""));
        // A path whose folder this daemon has not listed yet, though the kernel knows it (a
        // successor daemon's, or a folder the scan has not reached): its folder first, and so
        // up to one the tree has.
        if !self.tree.read().dirs.contains_key(parent)
            && self.current(parent)?.attr.kind != Kind::Dir
        {
            return Err(SourceError::NotFound);
        }
        let stale = (self.tree.read().dirs.get(parent)).is_some_and(|d| self.stale(d));
        if stale {
            self.relist(parent)?;
        }
        // Looked at again either way: another caller (the scan) may have listed the folder
        // since the first look.
        let tree = self.tree.read();
        if let Some(d) = tree.dirs.get(rel) {
            return Ok(d.meta);
        }
        tree.object(rel)
            .map(|o| o.meta())
            .ok_or(SourceError::NotFound)
    }
}

/// Why a listing failed: the store's answer, or the source's own.
enum ListError {
    Store(object_store::Error),
    Io(SourceError),
}

/// Runs `f` on `runtime` and waits for its output, from any thread (a runtime's own too).
fn run_on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    f: impl Future<Output = T> + Send + 'static,
) -> SourceResult<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv()
        .map_err(|_| SourceError::Io(io::Error::other("the object store's runtime ended")))
}

/// A caller's buffer as a GET's [`Body`].
struct BufBody<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Body for BufBody<'_> {
    fn room(&mut self) -> Option<&mut [u8]> {
        (self.at < self.buf.len()).then(|| &mut self.buf[self.at..])
    }

    fn filled(&mut self, n: usize) {
        self.at += n;
    }
}

/// The blocks of a run as a GET's [`Body`]: each allocated when the body reaches it, handed
/// to `filled` once full; `failed` says why the next could not be had.
struct BlocksBody<'a> {
    blocks: &'a mut RunBlocks,
    current: Option<Block>,
    at: usize,
    failed: Option<io::Error>,
    filled: &'a mut dyn FnMut(Block),
}

impl Body for BlocksBody<'_> {
    fn room(&mut self) -> Option<&mut [u8]> {
        if self.current.is_none() && self.failed.is_none() {
            match self.blocks.next()? {
                Ok(block) => self.current = Some(block),
                Err(e) => self.failed = Some(e),
            }
            self.at = 0;
        }
        let block = self.current.as_mut()?;
        Some(&mut block.whole_mut()[self.at..])
    }

    fn filled(&mut self, n: usize) {
        self.at += n;
        if self.current.as_ref().is_some_and(|b| self.at == b.len()) {
            (self.filled)(self.current.take().expect("a block being filled"));
        }
    }
}

impl DatasetSource for ObjectSource {
    fn root(&self) -> &Path {
        &self.name
    }

    fn metadata(&self, rel: &Path, _who: &Creds) -> SourceResult<SourceMeta> {
        self.current(rel)
    }

    fn open_dir(&self, rel: &Path, _who: &Creds) -> SourceResult<Listing> {
        let known = self.tree.read().dirs.get(rel).map(|d| self.stale(d));
        let stale = match known {
            Some(stale) => stale,
            // A folder whose parent this daemon has not listed (a successor's): found first.
            None => {
                if self.current(rel)?.attr.kind != Kind::Dir {
                    return Err(SourceError::NotDir);
                }
                (self.tree.read().dirs.get(rel)).is_none_or(|d| self.stale(d))
            }
        };
        if stale {
            self.relist(rel)?;
        }
        let tree = self.tree.read();
        let dir = (tree.dirs.get(rel)).ok_or(SourceError::NotFound)?;
        let entries = (dir.entries.iter())
            .filter_map(|(name, entry)| {
                let meta = match entry {
                    Entry::Dir => tree.dirs.get(&rel.join(&**name))?.meta,
                    Entry::File(o) => o.meta(),
                };
                Some((name.to_string().into(), meta))
            })
            .collect();
        Ok(Listing::known(dir.meta, entries))
    }

    fn read_link(&self, _rel: &Path) -> SourceResult<PathBuf> {
        Err(SourceError::Invalid)
    }

    fn open_file(&self, rel: &Path, _who: &Creds) -> SourceResult<(SourceFile, SourceMeta)> {
        let meta = self.current(rel)?;
        if meta.attr.kind != Kind::File {
            return Err(SourceError::IsDir);
        }
        Ok((SourceFile::Object(meta), meta))
    }

    fn first_unreadable(
        &self,
        _files: &mut dyn Iterator<Item = PathBuf>,
        _who: &Creds,
    ) -> SourceResult<Option<usize>> {
        // Every object is readable by every user of the mount (mode 0444).
        Ok(None)
    }

    fn acl(&self, _rel: &Path, _name: &str) -> SourceResult<Option<Vec<u8>>> {
        Ok(None)
    }

    fn read_block(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<usize> {
        let len = buf.len();
        self.get_range(rel, version, offset, len, &mut BufBody { buf, at: 0 })
    }

    /// One ranged GET for all of `blocks`, its body read into each in turn, each allocated
    /// when the body reaches it and handed over once full.
    fn read_blocks(
        &self,
        rel: &Path,
        version: &FileVersion,
        offset: u64,
        blocks: &mut RunBlocks,
        filled: &mut dyn FnMut(Block),
    ) -> SourceResult<usize> {
        let len = blocks.bytes();
        let mut body = BlocksBody {
            blocks,
            current: None,
            at: 0,
            failed: None,
            filled,
        };
        let got = self.get_range(rel, version, offset, len, &mut body);
        match body.failed {
            // The blocks were not there to read into: the GET's answer is moot.
            Some(e) => Err(e.into()),
            None => got,
        }
    }

    fn send_ahead(&self, rel: &Path, version: &FileVersion, offset: u64, len: usize) {
        let Ok(Some(Request {
            key,
            options,
            end,
            etag,
        })) = self.request(rel, version, offset, len)
        else {
            return;
        };
        let mut ahead = self.ahead.lock();
        if (ahead.iter()).any(|a| a.is_for(rel, version, offset)) {
            return;
        }
        // Those not taken in time go; past AHEAD_MAX waiting none is sent (pushing the oldest
        // out, jobs that want more than AHEAD_MAX between them would send and drop GETs in turn
        // without end).
        ahead.retain(|a| {
            let young = a.young();
            if !young {
                a.answer.abort();
                self.counters.ahead_unused.fetch_add(1, Ordering::Relaxed);
            }
            young
        });
        if ahead.len() >= AHEAD_MAX {
            return;
        }
        let answer = match self.direct_for(etag.as_deref()) {
            Some((direct, etag)) => {
                let (direct, etag, signed) =
                    (direct.clone(), etag.to_string(), direct.presign(&key));
                Pending::Direct(self.runtime.spawn(async move {
                    let url = signed.await.map_err(|e| io::Error::other(e.to_string()))?;
                    let send = move || direct.send(url, offset..end, &etag);
                    tokio::task::spawn_blocking(send).await?
                }))
            }
            None => Pending::Store(
                self.runtime
                    .spawn(Self::get(self.store.clone(), key, options)),
            ),
        };
        self.counters.ahead.fetch_add(1, Ordering::Relaxed);
        ahead.push(Ahead {
            rel: rel.to_path_buf(),
            version: *version,
            range: offset..end,
            sent: Instant::now(),
            answer,
        });
    }

    fn sent_ahead(&self, rel: &Path, version: &FileVersion, offset: u64) -> Option<usize> {
        let ahead = self.ahead.lock();
        (ahead.iter())
            .find(|a| a.is_for(rel, version, offset))
            .filter(|a| a.young())
            .map(|a| (a.range.end - a.range.start) as usize)
    }

    fn memory(&self) -> u64 {
        self.tree.read().memory
    }

    fn scan_threads(&self) -> Option<usize> {
        // From a manifest the scan is the CPU's work: a thread a CPU, as for a directory.
        (!self.from_manifest).then_some(LIST_PARALLEL)
    }

    fn statfs(&self) -> SourceResult<FsStats> {
        let tree = self.tree.read();
        let blocks = tree.bytes.div_ceil(4096);
        Ok(FsStats {
            blocks,
            bfree: 0,
            bavail: 0,
            files: tree.objects + tree.dirs.len() as u64,
            ffree: 0,
            bsize: 4096,
            namelen: 1024,
            frsize: 4096,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    /// A source of `s3://bucket/d` over an in-memory store holding `keys` (3 bytes each).
    fn source_of(keys: &[&str]) -> ObjectSource {
        let store = Arc::new(InMemory::new());
        for key in keys {
            let key = object_store::path::Path::from(*key);
            futures::executor::block_on(store.put(&key, PutPayload::from_static(b"abc"))).unwrap();
        }
        let url = ObjectUrl::parse(Path::new("s3://bucket/d")).unwrap();
        ObjectSource::over(
            url,
            store,
            Duration::from_secs(60),
            None,
            Default::default(),
        )
        .unwrap()
    }

    /// A path whose folders the source has not listed (a successor daemon's first open) is
    /// found while the scan lists the same folders: a folder listed by the other caller
    /// between the path's two looks at the tree is read, not taken for a name it lacks.
    #[test]
    fn a_path_looked_up_while_the_scan_lists_its_folders_is_found() {
        let path = Path::new("a/b/c/x.bin");
        for round in 0..300 {
            let source = source_of(&["d/a/b/c/x.bin", "d/a/b/c/y.bin"]);
            let start = std::sync::Barrier::new(2);
            let found = std::thread::scope(|s| {
                s.spawn(|| {
                    start.wait();
                    for dir in ["a", "a/b", "a/b/c"] {
                        source.open_dir(Path::new(dir), &Creds::DAEMON).unwrap();
                    }
                });
                start.wait();
                source.metadata(path, &Creds::DAEMON)
            });
            let size = found.map(|m| m.version.size);
            assert!(matches!(size, Ok(3)), "round {round}: {size:?}");
        }
    }

    /// A GET sent ahead is taken by a read of exactly its range, and dropped, counted unused,
    /// by a read of another range from its start; no more than AHEAD_MAX wait. Each read's
    /// bytes are the object's either way.
    #[test]
    fn a_get_sent_ahead_is_taken_by_its_own_range_only() {
        let keys: Vec<String> = (0..=AHEAD_MAX).map(|i| format!("d/f{i}")).collect();
        let source = source_of(&keys.iter().map(String::as_str).collect::<Vec<_>>());
        let meta = |i: usize| {
            let rel = PathBuf::from(format!("f{i}"));
            let version = source.metadata(&rel, &Creds::DAEMON).unwrap().version;
            (rel, version)
        };
        let read = |rel: &Path, version: &FileVersion, len: usize| {
            let mut buf = vec![0; len];
            let n = source.read_block(rel, version, 0, &mut buf).unwrap();
            buf.truncate(n);
            buf
        };
        let counts = || {
            let c = &source.counters;
            (
                c.ahead.load(Ordering::Relaxed),
                c.ahead_unused.load(Ordering::Relaxed),
            )
        };
        let (rel, version) = meta(0);
        source.send_ahead(&rel, &version, 0, 3);
        // Sent once, however often it is asked for.
        source.send_ahead(&rel, &version, 0, 3);
        assert_eq!(source.sent_ahead(&rel, &version, 0), Some(3));
        assert_eq!(source.sent_ahead(&rel, &version, 1), None);
        assert_eq!(read(&rel, &version, 3), b"abc");
        assert_eq!(counts(), (1, 0));
        assert_eq!(source.sent_ahead(&rel, &version, 0), None);
        // Another range from its start: dropped, and the read sends its own.
        source.send_ahead(&rel, &version, 0, 3);
        assert_eq!(read(&rel, &version, 2), b"ab");
        assert_eq!(counts(), (2, 1));
        // With AHEAD_MAX waiting, no more is sent until one is taken.
        for i in 0..=AHEAD_MAX {
            let (rel, version) = meta(i);
            source.send_ahead(&rel, &version, 0, 3);
        }
        assert_eq!(counts(), (2 + AHEAD_MAX as u64, 1));
        let (last, last_version) = meta(AHEAD_MAX);
        assert_eq!(source.sent_ahead(&last, &last_version, 0), None);
        assert_eq!(read(&rel, &version, 3), b"abc");
        source.send_ahead(&last, &last_version, 0, 3);
        assert_eq!(source.sent_ahead(&last, &last_version, 0), Some(3));
        assert_eq!(read(&last, &last_version, 3), b"abc");
        assert_eq!(counts(), (3 + AHEAD_MAX as u64, 1));
    }
}
