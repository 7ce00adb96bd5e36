//! The read path: serve from the tiers on the FUSE thread, fetch the rest off it.
//!
//! Each block of a read is looked up along the chain ([`crate::tier`]): the cache, the
//! blocks the open file holds, the staging area, the recent blocks (for a re-read); a miss
//! of all of them is one fetch ([`crate::tier::fetch`]), merged with any fetch of the block
//! already in flight. A read inside one block (every read of a small file, and aligned reads
//! of large ones) is answered with a slice of the block found, or of the fetched one when the
//! fetch ends. A read across blocks is assembled from its parts.
//!
//! # A file that changes while it is open
//! Every read first asks the open source file (`fstat` of the descriptor the open made, as
//! the caller) whether it is still the version the open saw. If it is not (truncated,
//! rewritten in place):
//! - an open of a file the cache held whole reads on the version it opened, from the cache,
//!   whole: close-to-open, as passthrough reads it from the cache's own file of it
//!   (`passthrough.rs`), so that `--no-passthrough` behaves the same;
//! - any other open (the cache holds none or part of the version opened, or lost a block of
//!   it since) is served from that descriptor directly, up to the file's current end, as a
//!   local file read through an open descriptor would behave; the kernel is told to forget
//!   its pages and attributes, after the reply: the reply's short read is what tells the
//!   kernel where the file ends now. Told before, the kernel's page-cache read ignores the
//!   short read's end (the attributes changed since it asked) and pads the pages it asked
//!   for with zeros up to the old size, which the reader then read as the file's bytes.
//!
//! If the path now names another file (renamed over, removed) while the open file is
//! unchanged, a fetch by path fails its version check and the block is read from the open
//! descriptor instead: the reader keeps reading what it opened. The kernel's GETATTR of an
//! open file whose path is gone is answered from the open file (`attrs.rs`), so that the
//! read at its end ends it (0 bytes) instead of failing with the path's ENOENT.
//!
//! Wholly cached files are opened with `keep_cache`, and the kernel serves their reads from
//! its page cache without asking: bytes it already holds can still be read through a
//! descriptor opened before the change (close-to-open consistency, as NFS has); every read
//! that reaches the daemon, and every later open, sees the change. The same holds for big
//! files read through the page cache as they stream (`plan.rs`, `STREAMED_MISS_MIN`): what
//! the kernel read ahead before the change (up to `--readahead`) is still the version opened,
//! and the read ends at the first READ that finds the change.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};

use super::plan::LARGE_FIRST_READ;
use super::{Access, Caller, DatasetFs, FileHandle, FsError, ReadDone, order};
use crate::block::Block;
use crate::cache::CachedBytes;
use crate::namespace::NodeId;
use crate::tier::error::ReadFailed;
use crate::tier::fetch::{FetchResult, Origin, Report};
use crate::tier::{DataError, Found, Tier, look_up};

/// Parts read ahead of a reader streaming through an object, beyond the one it reads: about
/// one stream's speed each (an S3 GET gives about 100 MiB/s), so a reader of a shard has
/// three GETs in flight, as many as a shard of 24 MiB has parts.
const READ_AHEAD_PARTS: u64 = 2;

/// Bytes of a block at hand: cached, or fetched earlier through the same handle.
enum Local<'a> {
    Cached(CachedBytes<'a>),
    Fetched(Arc<Block>),
}

impl std::ops::Deref for Local<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Local::Cached(b) => b,
            Local::Fetched(b) => b,
        }
    }
}

/// A read across several blocks, filled in as they arrive.
struct Assembly {
    buf: Vec<u8>,
    /// Blocks still to arrive, plus one while the read is still being set up.
    pending: usize,
    /// The first block that failed, and why.
    error: Option<(u64, DataError)>,
    rel: Arc<std::path::Path>,
    done: Option<ReadDone>,
}

impl Assembly {
    fn finish_one(mut this: MutexGuard<'_, Assembly>) {
        this.pending -= 1;
        if this.pending > 0 {
            return;
        }
        if let Some(done) = this.done.take() {
            match this.error.take() {
                Some((block, error)) => done(Err(failed(&this.rel, block, error))),
                None => done(Ok(&this.buf)),
            }
        }
    }
}

impl DatasetFs {
    /// A READ reached the daemon (stat `read_requests`).
    fn count_read_request(&self) {
        crate::stats::Counters::add(&self.reads.ledger.stats().counters.read_requests, 1);
    }

    /// A READ of node `ino`, open as `fh`: the order file reads as empty; where the kernel
    /// opens files itself (no OPEN, so no handle), through the open it told of (`told/`); a handle
    /// an earlier daemon of the mount gave out is opened again at its first read
    /// (`takeover.rs`).
    pub fn read_node(
        &self,
        ino: NodeId,
        fh: u64,
        offset: u64,
        size: u32,
        caller: Caller,
        done: ReadDone,
    ) {
        if let Some(order) = order::control(ino) {
            return done(Ok(order.read()));
        }
        // Handle 0: the kernel opened the file itself (`told/`).
        if fh == 0 {
            return self.read_told(ino, offset, size, caller, done);
        }
        self.adopt_file(fh, ino, caller);
        self.read(fh, offset, size, done);
    }

    /// A read of a file the kernel opened itself and did not tell of (see `told/`): the
    /// file is opened for this read alone, as the caller (the source still checks its
    /// permissions), and the read at offset 0 is the job's access of the file (see [`Access`]).
    pub(super) fn read_unopened(
        &self,
        ino: NodeId,
        offset: u64,
        size: u32,
        caller: Caller,
        done: ReadDone,
    ) {
        let access = if offset == 0 {
            Access::Counted
        } else {
            Access::Silent
        };
        self.read_once(ino, offset, size, caller, access, done)
    }

    /// One read of a file opened for it alone, accounted as `access` says.
    pub(super) fn read_once(
        &self,
        ino: NodeId,
        offset: u64,
        size: u32,
        caller: Caller,
        access: Access,
        done: ReadDone,
    ) {
        self.count_read_request();
        // The handle is this read's alone: it never enters the handle table, and the version
        // the open just took needs no second look.
        let h = match self.open_handle(ino, caller, access) {
            Ok((h, _)) => Arc::new(h),
            Err(e) => return done(Err(e)),
        };
        if let Some(watch) = &h.watch {
            self.opener.kernel.asked(watch);
        }
        self.read_current(&h, offset, size, done);
        if let Some(watch) = &h.watch {
            self.opener.kernel.closed(watch);
        }
    }

    /// Reads `size` bytes at `offset` of open file `fh`; `done` receives the bytes, on this
    /// thread if they are at hand, else on an I/O thread when the fetch ends.
    pub fn read(&self, fh: u64, offset: u64, size: u32, done: ReadDone) {
        self.count_read_request();
        let Some(h) = self.handles.file(fh) else {
            return done(Err(FsError::BadHandle));
        };
        if let Some(watch) = &h.watch {
            self.opener.kernel.asked(watch);
        }
        learn_read_size(&h, offset, size);
        if h.reads_reach_daemon {
            let within = h.version.size.saturating_sub(offset).min(size as u64);
            h.asked.fetch_add(within, Ordering::Relaxed);
        }
        match h.file.stat() {
            Ok(now) if now.version == h.version => self.read_current(&h, offset, size, done),
            Ok(_) => match self.opened_version(&h, offset, size) {
                Some(bytes) => done(Ok(&bytes)),
                None => self.read_changed(&h, offset, size, done),
            },
            Err(e) => done(Err(FsError::Source(e))),
        }
    }

    /// The bytes at `offset` of the version the handle opened, if the open found it whole in
    /// the cache and the tiers on this thread still hold every block of the read: a file
    /// that changed while open is then read as it was opened (see the module header).
    fn opened_version(&self, h: &FileHandle, offset: u64, size: u32) -> Option<Vec<u8>> {
        if !h.cached_at_open {
            return None;
        }
        let file_size = h.version.size;
        if offset >= file_size || size == 0 {
            return Some(Vec::new());
        }
        let end = (offset + size as u64).min(file_size);
        let bs = self.reads.tiers.memory.blocks().get();
        let whole = file_size <= bs;
        let (block_of, block_start) = (
            |pos: u64| if whole { 0 } else { pos / bs },
            |b: u64| if whole { 0 } else { b * bs },
        );
        let mut out = Vec::with_capacity((end - offset) as usize);
        for block in block_of(offset)..=block_of(end - 1) {
            let start = block_start(block);
            let (lo, hi) = (offset.max(start), end.min(start + bs));
            let bytes = self.local_block(h, block, hi - lo)?;
            out.extend_from_slice(&bytes[(lo - start) as usize..(hi - start) as usize]);
        }
        Some(out)
    }

    /// [`DatasetFs::read`] of a handle whose file is still the version it opened.
    fn read_current(&self, h: &Arc<FileHandle>, offset: u64, size: u32, done: ReadDone) {
        let file_size = h.version.size;
        if offset >= file_size || size == 0 {
            return done(Ok(&[]));
        }
        let end = (offset + size as u64).min(file_size);
        let bs = self.reads.tiers.memory.blocks().get();
        let whole = file_size <= bs;
        let block_of = |pos: u64| if whole { 0 } else { pos / bs };
        let block_start = |b: u64| if whole { 0 } else { b * bs };
        let (first, last) = (block_of(offset), block_of(end - 1));
        let stream = self.streams(h, first, last);

        if first == last {
            let base = block_start(first);
            let (a, b) = ((offset - base) as usize, (end - base) as usize);
            if let Some(bytes) = self.local_block(h, first, (b - a) as u64) {
                done(Ok(&bytes[a..b]));
                // A part read ahead (or cached) and reached: the window moves on.
                return self.read_next_part(h, first, stream);
            }
            let rel = h.rel.clone();
            return self.fetch_for(
                h,
                (first, (b - a) as u64),
                stream,
                Box::new(move |r| match r {
                    Ok(buf) => done(Ok(&buf[a..b])),
                    Err(e) => done(Err(failed(&rel, first, e))),
                }),
            );
        }

        let assembly = Arc::new(Mutex::new(Assembly {
            buf: vec![0; (end - offset) as usize],
            pending: 1,
            error: None,
            rel: h.rel.clone(),
            done: Some(done),
        }));
        for block in first..=last {
            let start = block_start(block);
            let (lo, hi) = (offset.max(start), end.min(start + bs));
            let (a, b) = ((lo - start) as usize, (hi - start) as usize);
            let at = (lo - offset) as usize;
            if let Some(bytes) = self.local_block(h, block, (b - a) as u64) {
                assembly.lock().buf[at..at + (b - a)].copy_from_slice(&bytes[a..b]);
                self.read_next_part(h, block, stream);
                continue;
            }
            assembly.lock().pending += 1;
            let part = assembly.clone();
            self.fetch_for(
                h,
                (block, (b - a) as u64),
                stream,
                Box::new(move |r| {
                    let mut asm = part.lock();
                    match r {
                        Ok(buf) => asm.buf[at..at + (b - a)].copy_from_slice(&buf[a..b]),
                        Err(e) => {
                            asm.error.get_or_insert((block, e));
                        }
                    }
                    Assembly::finish_one(asm);
                }),
            );
        }
        Assembly::finish_one(assembly.lock());
    }

    /// Serves a read of a file that changed since it was opened: straight from the open
    /// descriptor, nothing cached, nothing past the current end.
    fn read_changed(&self, h: &FileHandle, offset: u64, size: u32, done: ReadDone) {
        let mut buf = vec![0; size as usize];
        match h.file.read_at(offset, &mut buf) {
            Ok(n) => {
                self.reads.ledger.read_directly(&h.att, n as u64);
                done(Ok(&buf[..n]))
            }
            Err(e) => done(Err(FsError::Source(e))),
        }
        // After the reply (see the module header): its short read ends the kernel's file.
        if !h.changed_while_open.swap(true, Ordering::Relaxed) {
            tracing::debug!("{}: changed while open", h.rel.display());
            self.invalidate(h.ino);
        }
    }

    /// Block `block` of the handle's file if a tier on this thread holds it: the cache, the
    /// handle itself, the staging area (a prefetch that was in flight when the file was
    /// opened may have landed since), or, for an open that re-reads what its job read moments
    /// ago, the recent blocks (see [`crate::tier::recent`]) unless a fetch of the block is in
    /// flight. A cache hit through a handle whose open was a miss counts `served` bytes as
    /// coming from the cache.
    fn local_block(&self, h: &FileHandle, block: u64, served: u64) -> Option<Local<'_>> {
        let want = h.want(block);
        let errors = &self.reads.ledger.stats().counters.tier_errors;
        let tiers = &self.reads.tiers;
        if let Some(Found::Lent(bytes)) = look_up([&*tiers.memory as &dyn Tier], &want, errors) {
            if !h.counted_at_open.load(Ordering::Relaxed) {
                self.reads.ledger.served_from_cache(&h.att, served);
            }
            return Some(Local::Cached(bytes));
        }
        // Held from here to the end: of two reads of one block, the second finds what the
        // first took.
        let mut held = h.held.lock();
        if let Some(data) = held.serve(block, served) {
            return Some(Local::Fetched(data));
        }
        // The rest of a part read with an earlier block (its bytes counted with that read).
        if let Some(data) = tiers.fetcher.take_ahead(&want.key) {
            held.keep_last(block, data.clone(), served);
            return Some(Local::Fetched(data));
        }
        // A fetch of the block in flight (the job's prefetch, most often) is joined, not
        // answered from the recent blocks: its bytes would land staged for a reader that had
        // them already, and count as prefetched and unused.
        let recent = (!tiers.fetcher.in_flight(&want.key)).then_some(&*tiers.recent as &dyn Tier);
        match look_up(
            std::iter::once(&*tiers.staging as &dyn Tier).chain(recent),
            &want,
            errors,
        )? {
            Found::File(claimed) => {
                tiers.took_from_staging(&want, &claimed);
                held.claimed.extend(claimed);
                held.get(block).map(Local::Fetched)
            }
            Found::Block(data) => {
                held.claimed.push((block, data.clone()));
                Some(Local::Fetched(data))
            }
            Found::Lent(bytes) => Some(Local::Cached(bytes)),
        }
    }

    /// Fetches block `block` of the handle's file for `waiter`, attributing the bytes read
    /// from the source and the time waited to the handle's epochs. If the open counted the
    /// file as a hit (it was wholly cached then, and LRU has since evicted part of it, or the
    /// disk tier dropped a corrupt block of it), and the block is read from below the disk
    /// tier, the hit becomes a miss, so that hits never include reads of the source.
    fn fetch_for(
        &self,
        h: &Arc<FileHandle>,
        (block, served): (u64, u64),
        stream: bool,
        waiter: Box<dyn FnOnce(FetchResult) + Send>,
    ) {
        // A block the disk tier holds keeps a hit a hit (it is a cached byte); any other
        // fetch turns it into a miss now, whichever fetch ends up reading it.
        let on_disk = (self.reads.tiers.disk.as_ref())
            .is_some_and(|d| d.takes_block(&h.rel, &h.want(block).key));
        if !on_disk {
            h.no_longer_a_hit(&self.reads.ledger);
        }
        let report = self.report_for(h);
        let (handle, tiers) = (h.clone(), self.reads.tiers.clone());
        let (prefetcher, ledger) = (self.reads.prefetcher.clone(), self.reads.ledger.clone());
        let started = Instant::now();
        ledger.wait_begins(h.pid);
        let blocks = tiers.memory.blocks();
        let block_len = blocks.len(h.version.size, block);
        // A prefetch of the block in flight when `local_block` looked may have staged it
        // since, and left flight: the fetcher looks once more before reading it again.
        let landed = || match self.local_block(h, block, 0)? {
            Local::Fetched(data) => Some(data),
            Local::Cached(bytes) => Block::copy_of(&bytes).ok().map(Arc::new),
        };
        self.reads.tiers.fetcher.fetch(
            h.rel.clone(),
            &crate::tier::Want {
                stream,
                ..h.want(block)
            },
            &landed,
            Box::new(move |r| {
                // The path names another file now (or none); the open one is unchanged. (An
                // object has no open file to read: its reader gets the store's answer.)
                let r = match r {
                    Err(e)
                        if matches!(e.errno(), libc::ESTALE | libc::ENOENT)
                            && handle.file.local().is_some() =>
                    {
                        read_from_open_file(&handle, blocks.offset(block), block_len as usize)
                    }
                    other => other,
                };
                let waited = started.elapsed();
                if let Ok(buf) = &r {
                    handle.held.lock().keep_last(block, buf.clone(), served);
                    // If this read joined a prefetch of the block, the bytes are read now:
                    // the staged copy would be wasted. They are kept a moment, as the
                    // fetcher keeps what a demand read fetched (a re-open finds them).
                    let want = handle.want(block);
                    if !tiers.memory.contains(&want.key) {
                        tiers.recent.admit(&want, buf);
                    }
                    tiers.staging.remove(&want);
                }
                ledger.stalled(&handle.att, handle.pid, waited);
                let read = r.as_ref().ok().cloned();
                waiter(r);
                // Kept for the other jobs that will read the file, if the cache did not keep it.
                if let (Some(data), Some(f)) = (read, handle.file_id) {
                    prefetcher.share(f, handle.read_by(), &handle.version, &[(block, data)]);
                }
                prefetcher.on_fetch_done();
            }),
            report,
        );
        self.read_next_part(h, block, stream);
    }

    /// True if a read of blocks `first..=last` of `h` streams through the object
    /// ([`super::handles::Stream`], near: a readahead window or a part). A reader that seeks (a
    /// Parquet footer, random records of an index) does not: its fetches read the blocks it
    /// asks for, not their parts (unless the cache has room to keep them), and read no parts
    /// ahead. With no cache, 200 random 4 KiB reads of a 384 MiB object read 754 MiB from the
    /// store when every read streamed. Always true for a directory source, whose reads are
    /// block by block.
    fn streams(&self, h: &FileHandle, first: u64, last: u64) -> bool {
        let part = self.reads.tiers.fetcher.part_blocks();
        if part <= 1 {
            return true;
        }
        let near = part.max(self.handles.window() / self.reads.tiers.memory.blocks().get());
        h.stream.lock().read(first, last, near)
    }

    /// Reads the next parts of an object ahead of a reader streaming through it
    /// ([`DatasetFs::streams`]; at the first block, only through the page cache: a file read
    /// by direct I/O is read whole in a READ or two, and a direct stream's first run spans
    /// the parts the readahead buffer has room for): when a read begins a part, wherever its
    /// bytes come from (the source, a part read ahead already, the cache), the fetcher starts the
    /// [`READ_AHEAD_PARTS`] parts after it that nothing holds or reads
    /// ([`crate::tier::fetch::Fetcher::read_ahead`]: while the readers' part slots and the
    /// readahead buffer have room). Their bytes count as the reader's.
    fn read_next_part(&self, h: &Arc<FileHandle>, block: u64, stream: bool) {
        let fetcher = &self.reads.tiers.fetcher;
        let part = fetcher.part_blocks();
        if part <= 1
            || !block.is_multiple_of(part)
            || !stream
            || (block == 0 && !h.drop_pages_at_release)
        {
            return;
        }
        let count = self.reads.tiers.memory.blocks().count(h.version.size);
        for ahead in 1..=READ_AHEAD_PARTS {
            let next = block + ahead * part;
            if next >= count {
                break;
            }
            fetcher.read_ahead(h.rel.clone(), &h.want(next), self.report_for(h));
        }
    }

    /// What a fetch for `h` tells when it ends: the bytes it read, counted as `h`'s (from the
    /// source, a peer or the disk tier), and the prefetcher's pacer its latency.
    fn report_for(&self, h: &Arc<FileHandle>) -> Report {
        let (prefetcher, ledger) = (self.reads.prefetcher.clone(), self.reads.ledger.clone());
        let accounted = h.clone();
        Box::new(move |fetched| {
            prefetcher.record(fetched);
            // The disk tier held it and failed it (a corrupt block): read from below after all.
            if fetched.origin != Origin::Disk {
                accounted.no_longer_a_hit(&ledger);
            }
            match fetched.bytes {
                // A block from the disk tier is a cached byte: a hit's were counted at open.
                Some(_)
                    if fetched.origin == Origin::Disk
                        && accounted.counted_at_open.load(Ordering::Relaxed) => {}
                Some(n) if fetched.origin == Origin::Disk => {
                    ledger.served_from_cache(&accounted.att, n)
                }
                Some(n) if fetched.origin == Origin::Source => {
                    ledger.fetched_for(&accounted.att, n);
                    if fetched.fallback {
                        ledger.peer_fell_back(&accounted.att);
                    }
                    if fetched.first_block {
                        ledger.file_from_source(accounted.file_id, accounted.att.job_epoch);
                    }
                }
                Some(n) => ledger.fetched_from_peer(&accounted.att, n),
                None => {}
            }
        })
    }
}

/// Block `len` bytes at `offset` of the handle's open source file, if that file still holds
/// the version opened (else ESTALE: a read racing a change fails, the next one sees it).
fn read_from_open_file(h: &FileHandle, offset: u64, len: usize) -> FetchResult {
    match h.file.stat() {
        Ok(now) if now.version == h.version => {}
        Ok(_) => return Err(DataError::Changed),
        Err(e) => return Err(DataError::OpenFile(Arc::new(e))),
    }
    let mut block = Block::zeroed(len).map_err(|e| DataError::no_memory(len, e))?;
    match h.file.read_at(offset, &mut block.whole_mut()[..len]) {
        Ok(n) if n == len => Ok(Arc::new(block)),
        Ok(_) => Err(DataError::Changed),
        Err(e) => Err(DataError::OpenFile(Arc::new(e))),
    }
}

/// The error a reader gets for block `block` of the file at `rel`, which failed with `error`.
fn failed(rel: &Arc<std::path::Path>, block: u64, error: DataError) -> FsError {
    FsError::Read(ReadFailed {
        rel: rel.clone(),
        block,
        error,
    })
}

/// Learns from a READ of a streamed miss how its job reads (`plan.rs`: `LARGE_FIRST_READ`,
/// `SMALL_READ`): the first READ of one through the page cache is the kernel's first
/// readahead window, sized from the reader's first read; through direct I/O the READs are the
/// reader's own reads, judged by their mean (`handles.rs`, `DirectReads`). Its job's next big misses are
/// read as the last one says.
fn learn_read_size(h: &FileHandle, offset: u64, size: u32) {
    let learnt = if h.drop_pages_at_release && offset == 0 {
        Some(size >= LARGE_FIRST_READ)
    } else if h.direct_stream && h.direct_reads.small(size) {
        Some(false)
    } else {
        None
    };
    if let Some(large) = learnt {
        h.att.job.lock().reads_large = large;
    }
}
