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

mod counting;
mod errors;
mod listing;
pub mod profile;
mod store;
mod tree;
mod url;

pub use counting::Counters;
pub use url::{Cloud, ObjectUrl};

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt};
use parking_lot::RwLock;

use super::{Creds, DatasetSource, FsStats, Listing, Refusal, SourceFile};
use crate::block::{Block, RunBlocks};
use crate::namespace::{FileVersion, Kind, SourceMeta};
use errors::{errno_of, one_line};
use listing::{list_all, warn_skipped};
use store::build_store;
use tree::{Dir, Tree, drop_markers, object_meta};
use url::key_of;

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
        let name = url.name();
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
