//! Opens of dataset files.
//!
//! An open reads as its steps ([`DatasetFs::open`]): refuse writes, open the source file as
//! the caller, count the access (taking the file's staged blocks), tell the prefetcher,
//! choose how the kernel reads the file (by itself from a backing file, `passthrough.rs`, or
//! through its page cache, or asking the daemon: the plan of `plan.rs`, a pure function of
//! facts this file gathers), enter the handle.
//!
//! # The kernel's page cache and ours
//! The kernel's page cache of the FUSE files is LRU: if it held files coorfs does not cache,
//! they would push out the ones it does, and MinIO would degrade to LRU. So with a cache
//! policy, an open decides (`plan.rs` decides it, and its tests show each case):
//! - every byte of the file is in coorfs's cache: `keep_cache`. The kernel may keep (and
//!   serve from) its pages of the file, a first level over the cache: when it reclaims
//!   them, the cache still holds every byte. A hot small file then costs one round trip.
//!   That level is free only if the kernel keeps the pages until the file is read again;
//!   when sentinel files show that it does not (memory too tight for a second copy), hits
//!   use `direct_io` as well ([`kernel_cache`]), except small files (up to
//!   [`BUFFERED_MISS_MAX`](super::plan::BUFFERED_MISS_MAX)): their pages are dropped at open and read again in one READ.
//! - a small file (up to [`BUFFERED_MISS_MAX`](super::plan::BUFFERED_MISS_MAX)) that the cache will keep whole once it is
//!   read (a policy that never evicts, with room for it), while the kernel keeps pages: the
//!   kernel's page cache, without `keep_cache`. The file is about to be one of the cache's,
//!   so its pages are right; the read at its end needs no round trip, and the next epoch
//!   finds its pages there.
//! - otherwise: `direct_io`. The file's bytes never enter the kernel's page cache; each read
//!   comes to the daemon, which serves cached blocks and fetches the rest.
//!
//! With `--policy none` there is no cache of ours and the kernel's page cache does what it
//! does (`keep_cache` for every unchanged file): the baseline of "FUSE plus page cache".
//!
//! Where the kernel reads files by itself (FUSE passthrough, `passthrough.rs`), that comes
//! first: a wholly cached file over 64 KiB is read from the cache's own file of it, and a file
//! the cache will not keep, that nothing below wants the daemon to read, from the source file;
//! the choices above are for the rest.
//!
//! The accounting follows: an open of a wholly cached file is a hit, and its size is counted
//! as bytes from the cache right there (training reads files whole, and the kernel may serve
//! them without asking); reads through a direct-I/O handle count exactly what they serve.
//!
//! Every open of a dataset file is an access of its job's epoch ([`crate::epoch`]). An open
//! that re-reads what the job read moments ago (a check and a decode, two workers sharing a
//! file) is the same access: its reads may take the blocks read then, which the cache did not
//! keep, from [`crate::tier::recent`] instead of the source. The job's lock is held from
//! taking the file's staged blocks to counting the access, so that of two such opens the one
//! counted first takes them.

use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::handles::{FileHandle, Held};
use super::passthrough::{Backing, BackingFiles, Granted, KernelIo};
use super::plan::{DaemonRead, KernelFile, OpenFacts, OpenPolicy, STREAMED_MISS_MIN, open_plan};
use super::{Access, Caller, DatasetFs, FsError, Opened, kernel_cache, order, source_error};
use crate::cache::BlockKey;
use crate::epoch::Step;
use crate::jobs::Job;
use crate::jobs::JobKey;
use crate::jobs::ledger::{Attribution, Opening};
use crate::namespace::{FileId, Kind, NodeId, SourceMeta};
use crate::prefetch::ReadBy;
use crate::source::{Creds, SourceFile};
use crate::tier::staging::Claimed;

/// A source file opened for a caller.
#[derive(Debug)]
pub(super) struct SourceOpen {
    rel: PathBuf,
    file: SourceFile,
    /// Its metadata, fresh from the open descriptor (an object's: from the listing, or from
    /// the store once the listing is older than --metadata-ttl).
    meta: SourceMeta,
    file_id: Option<FileId>,
    /// It changed since the kernel was last told its attributes.
    changed: bool,
}

/// What an access is of: the file's path, version and dense id.
#[derive(Debug)]
pub(super) struct Accessed<'a> {
    pub rel: &'a std::path::Path,
    pub version: crate::namespace::FileVersion,
    pub file_id: Option<FileId>,
}

impl SourceOpen {
    fn accessed(&self) -> Accessed<'_> {
        Accessed {
            rel: &self.rel,
            version: self.meta.version,
            file_id: self.file_id,
        }
    }
}

/// How an open was counted, for its handle and the prefetcher.
#[derive(Debug)]
pub(super) struct Counted {
    /// The dataset-wide epoch and the job's epoch the open counts in.
    epoch: u64,
    /// The job that opened the file.
    job: Arc<Mutex<Job>>,
    job_key: JobKey,
    job_epoch: u64,
    /// The digest of the order the job follows this epoch, if it gave one.
    order: Option<u64>,
    /// Files of its epoch the job has opened, this one included.
    position: u64,
    /// What the access did to the job's epoch (None: not an access of its own, or a file
    /// the scan has not seen).
    step: Option<Step>,
    /// Every block of the file was staged, and the open took them (`claimed`).
    staged: bool,
    claimed: Vec<(u64, Arc<crate::block::Block>)>,
}

impl Counted {
    /// The read this access is, as [`Prefetcher::share`] keeps its blocks.
    fn read_by(&self) -> ReadBy {
        ReadBy {
            job: self.job_key,
            round: self.job_epoch,
            order: self.order,
            position: self.position,
        }
    }
}

impl DatasetFs {
    /// Opens file `ino` (or the order file) for reading. `flags` are the
    /// `open(2)` flags.
    pub fn open(&self, ino: NodeId, flags: i32, caller: Caller) -> Result<Opened, FsError> {
        self.open_file(ino, flags, caller, Access::Counted)
    }

    /// [`DatasetFs::open`], accounted as `access` says. The steps: refuse writes, open the
    /// source file as the caller, count the access (taking the blocks the prefetcher staged),
    /// tell the prefetcher, choose how the kernel may cache the file, enter the handle.
    pub(crate) fn open_file(
        &self,
        ino: NodeId,
        flags: i32,
        caller: Caller,
        access: Access,
    ) -> Result<Opened, FsError> {
        if let Some(order) = order::control(ino) {
            return order.open(self, flags, caller);
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY
            || flags & (libc::O_TRUNC | libc::O_APPEND) != 0
        {
            return Err(FsError::ReadOnly);
        }
        let (handle, opened) = self.open_handle(ino, caller, access)?;
        if self.handles.insert_file(opened.fh, handle) {
            self.elastic.state.wake.wake();
        }
        // Last before the reply, after which the opener queues its event, if any.
        self.opener
            .opens
            .asked(ino, self.tree.ns.parent(ino), caller.pid);
        Ok(opened)
    }

    /// The steps of [`DatasetFs::open_file`] for a data file, up to entering the handle: the
    /// handle, and what the kernel is told. A read under `--fast-open` uses the handle alone.
    pub(super) fn open_handle(
        &self,
        ino: NodeId,
        caller: Caller,
        access: Access,
    ) -> Result<(FileHandle, Opened), FsError> {
        let opened = self.open_source(ino, caller)?;
        let now = self.reads.ledger.now();
        let version = &opened.meta.version;
        let in_memory = self.reads.tiers.memory.holds_file(version);
        // A file the disk tier holds whole is a hit too: no byte of it is read from below.
        let hit = in_memory
            || (self.reads.tiers.disk.as_ref()).is_some_and(|d| d.holds_file(&opened.rel, version));
        let job = self.reads.jobs.get(caller.pid, caller.uid, now);
        let (counted, reading) = match access {
            Access::Counted => {
                let counted = self.count_access(job, &opened.accessed(), hit, caller, now);
                self.tell_prefetcher(&opened.accessed(), &counted, hit);
                let reading = self.kernel_reading(ino, &opened, in_memory, hit, &counted);
                (counted, reading)
            }
            Access::Silent => (self.silent_access(job), KernelReading::UNOPENED),
        };
        let fh = self.handles.next_fh();
        log_open(&opened, fh, caller, &counted, hit);
        let passthrough = match reading.io {
            KernelIo::Passthrough(id) => Some(id),
            KernelIo::PageCache | KernelIo::Direct => None,
        };
        let opened_for_kernel = Opened {
            fh,
            keep_cache: reading.keep_cache,
            direct_io: reading.io == KernelIo::Direct,
            changed: opened.changed && access == Access::Counted,
            passthrough,
        };
        let from_source = reading
            .backing
            .is_some_and(|b| matches!(b, Backing::Source(_)));
        // A re-read within the epoch is the same access: the source's page cache serves it.
        let reread = counted.step == Some(Step::Repeat);
        let mut handle = file_handle(ino, caller, opened, counted, hit, access, reading);
        handle.cached_at_open = in_memory;
        if passthrough.is_some() {
            self.count_passthrough(&handle, from_source, reread);
        }
        if handle.direct_stream {
            let counters = &self.reads.ledger.stats().counters;
            crate::stats::Counters::add(&counters.stream_direct_opens, 1);
        }
        Ok((handle, opened_for_kernel))
    }

    /// How the kernel is to read an open of node `ino` (see `passthrough.rs` and the module
    /// header): the plan of `plan.rs`, carried out. From a backing file by itself if the plan
    /// names one and the inode's other opens allow it (or if they are passthrough opens: then
    /// it must), else through its page cache or the daemon as the plan says.
    fn kernel_reading(
        &self,
        ino: NodeId,
        opened: &SourceOpen,
        in_memory: bool,
        hit: bool,
        counted: &Counted,
    ) -> KernelReading {
        let version = opened.meta.version;
        let memory = &self.reads.tiers.memory;
        let first = BlockKey { version, block: 0 };
        let facts = OpenFacts {
            size: version.size,
            changed: opened.changed,
            local: opened.file.local().is_some(),
            known: opened.file_id.is_some(),
            in_memory,
            hit,
            kernel_file: in_memory && memory.holds_for_kernel(&version),
            // What only a miss is asked (the fetches in flight and the cache's policy are
            // behind locks): a hit, the hot path, skips it, as the plan does.
            partly_cached: !in_memory && memory.cached_bytes_of(&version) > 0,
            // Staged since the open claimed what was (the prefetch landed meanwhile): looked
            // for after the flight, which a block leaves only once staged. Read from the
            // source by the kernel, the file was read twice and the block left for nobody.
            prefetched: !in_memory
                && (!counted.claimed.is_empty()
                    || self.reads.tiers.fetcher.in_flight(&first)
                    || self.reads.tiers.staging.contains(&first)),
            would_keep: !in_memory && memory.would_keep(version.size),
            room: !in_memory && memory.has_room_for(version.size),
            source_resident: !in_memory
                && !hit
                && version.size >= STREAMED_MISS_MIN
                && (opened.file.local())
                    .is_some_and(|f| crate::source::resident_open_file(f, version.size)),
            reads_large: version.size >= STREAMED_MISS_MIN && counted.job.lock().reads_large,
        };
        // The gauge's answer for a hit on the file, and its watch if the file is a sentinel.
        let (keep_hit, watch) = match opened.file_id {
            Some(file) if in_memory && !opened.changed => self.opener.kernel.open(file),
            Some(file) => (self.opener.kernel.keeps(), self.opener.kernel.open(file).1),
            None => (false, None),
        };
        let disk_has_room = (self.reads.tiers.disk.as_ref())
            .is_some_and(|d| d.enabled() && d.used() < d.capacity());
        let policy = OpenPolicy {
            passthrough: self.opener.passthrough.on(),
            caches: memory.caches(),
            feeds_below: disk_has_room || self.membership.config.is_some(),
            kernel_keeps: self.opener.kernel.keeps(),
            keep_hit,
            reads_ahead: self.reads.tiers.fetcher.streams_a_part(),
        };
        let plan = open_plan(&facts, &policy, || {
            self.others_need(opened.file_id, counted)
        });
        let backing = plan.backing.map(|file| match file {
            KernelFile::Cached => Backing::Cached(version),
            KernelFile::Source => Backing::Source(version),
        });
        let register = |kernel: &dyn BackingFiles, backing| match backing {
            Backing::Cached(v) => {
                let fd = (memory.open_for_kernel(&v)).ok_or(ErrorKind::NotFound)??;
                kernel.register(fd.as_fd())
            }
            Backing::Source(_) => match opened.file.local() {
                Some(file) => kernel.register(file.as_fd()),
                None => Err(ErrorKind::Unsupported.into()),
            },
        };
        let (granted, refused) =
            (self.opener.passthrough).open(ino, version, backing, register, || ());
        if let Some(e) = refused {
            self.passthrough_unavailable(&format!("the kernel refused a backing file: {e}"));
        }
        match granted {
            Granted::Passthrough { id, backing } => KernelReading {
                io: KernelIo::Passthrough(id),
                keep_cache: false,
                drop_at_release: false,
                direct_stream: false,
                watch: None,
                backing: Some(backing),
            },
            Granted::Daemon(()) => {
                let (io, keep_cache, drop_at_release) = match plan.read {
                    DaemonRead::PageCache {
                        keep,
                        drop_at_release,
                    } => (KernelIo::PageCache, keep, drop_at_release),
                    DaemonRead::Direct | DaemonRead::DirectStream => {
                        (KernelIo::Direct, false, false)
                    }
                };
                KernelReading {
                    io,
                    keep_cache,
                    drop_at_release,
                    direct_stream: plan.read == DaemonRead::DirectStream,
                    watch: watch.filter(|_| plan.watch),
                    backing: None,
                }
            }
        }
    }

    /// True if another job will read the file soon (the daemon keeps what it reads of the file
    /// for them, see [`crate::prefetch::Prefetcher::share`]), or the file is one the scan has
    /// not seen.
    fn others_need(&self, file: Option<FileId>, counted: &Counted) -> bool {
        let Some(f) = file else {
            return true;
        };
        !(self.reads.prefetcher)
            .needing(f, counted.job_key, counted.job_epoch)
            .is_empty()
    }

    /// Counts an open the kernel reads by itself; one `from_source` is a miss read from the
    /// source without the daemon: its whole size is counted now, as a hit's is, unless the
    /// open `reread` what its job read moments ago in this epoch.
    fn count_passthrough(&self, handle: &FileHandle, from_source: bool, reread: bool) {
        let counters = &self.reads.ledger.stats().counters;
        crate::stats::Counters::add(&counters.passthrough_opens, 1);
        if from_source {
            crate::stats::Counters::add(&counters.passthrough_source_opens, 1);
        }
        if from_source && !reread {
            self.reads
                .ledger
                .read_directly(&handle.att, handle.version.size);
            self.reads
                .ledger
                .file_from_source(handle.file_id, handle.att.job_epoch);
        }
    }

    /// Tells the prefetcher of the access that `counted` counted. What the open took from the
    /// staging area stays there for the jobs that still need it.
    pub(super) fn tell_prefetcher(&self, accessed: &Accessed, counted: &Counted, hit: bool) {
        self.reads
            .prefetcher
            .on_open(&counted.job, counted.step, counted.staged, hit);
        if let Some(f) = accessed.file_id {
            self.reads
                .prefetcher
                .share(f, counted.read_by(), &accessed.version, &counted.claimed);
        }
    }

    /// Opens the source file of node `ino` as `caller`: the source checks modes, ACLs and
    /// every directory's search permission now, whatever the kernel's cached attributes said.
    /// If the file changed since the kernel was told, the kernel is told to forget what it
    /// cached.
    pub(super) fn open_source(&self, ino: NodeId, caller: Caller) -> Result<SourceOpen, FsError> {
        let info = self.tree.ns.info(ino).ok_or(FsError::NotFound)?;
        if info.attr.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let rel = self.rel_path(ino)?;
        let look = self.tree.ns.look();
        let (file, meta) = match self.tree.source.open_file(&rel, &self.creds(caller)) {
            Ok(opened) => opened,
            Err(e) => {
                // A refused open may be the first sign of a chmod. The node learns it (so
                // `stat` shows it once the kernel's attributes expire), but the kernel is
                // not told to forget its attributes: it would cache the refusing mode for
                // --metadata-ttl and refuse the next open itself, even after a chmod back.
                // What it cached of the file's pages is dropped at the next open that works.
                if let Ok((meta, look)) = self.look_at(&rel, &Creds::DAEMON)
                    && self.tree.ns.refresh(ino, meta, Some(look))
                {
                    self.opener.stale_in_kernel.lock().insert(ino);
                }
                return Err(source_error(e));
            }
        };
        let pending = self.opener.stale_in_kernel.lock().remove(&ino);
        let changed = (meta.version != info.version && self.tree.ns.refresh(ino, meta, Some(look)))
            || pending;
        if changed {
            self.invalidate(ino);
        }
        Ok(SourceOpen {
            rel,
            file,
            meta,
            file_id: info.file_id,
            changed,
        })
    }

    /// Counts an open of a source file as `job`'s access at `now`. The job's lock is held
    /// from taking the file's staged blocks to counting the access: of two opens of a file
    /// by one job (a check and a decode, two workers sharing it), the one its epoch counts
    /// first takes them, and the other finds them among the recent blocks.
    pub(super) fn count_access(
        &self,
        job: Arc<Mutex<Job>>,
        opened: &Accessed,
        hit: bool,
        caller: Caller,
        now: f64,
    ) -> Counted {
        let version = opened.version;
        let mut j = job.lock();
        let job_key = j.key;
        // The prefetcher's blocks of this file are now this open's.
        let claimed = if hit {
            Claimed::default()
        } else {
            self.reads.prefetcher.claim(opened.rel, &version, job_key)
        };
        let blocks = self.reads.tiers.memory.blocks().count(version.size);
        let staged = !claimed.blocks.is_empty() && claimed.blocks.len() as u64 == blocks;
        let opening = Opening {
            file: opened.file_id,
            pid: caller.pid,
            hit,
            staged,
            shared: staged && claimed.shared,
            size: version.size,
            total: self.dataset_files(),
            now,
        };
        let (job_epoch, step) = self.reads.ledger.open_in_job(&mut j, &opening);
        if step.is_some_and(Step::began_epoch) {
            j.epoch_changed();
        }
        let order = j.following();
        let position = j.log.tracker().read_in_epoch() as u64;
        drop(j);
        Counted {
            epoch: self.reads.ledger.open_in_dataset(&opening),
            job,
            job_key,
            job_epoch,
            order,
            position,
            step,
            staged: opening.staged,
            claimed: claimed.blocks,
        }
    }

    /// An open of no access of its own (see [`Access::Silent`]): its reads count in the
    /// epochs current now.
    fn silent_access(&self, job: Arc<Mutex<Job>>) -> Counted {
        let (job_key, job_epoch, order, position) = {
            let j = job.lock();
            let position = j.log.tracker().read_in_epoch() as u64;
            (j.key, j.epoch(), j.following(), position)
        };
        Counted {
            epoch: self.reads.ledger.epoch(),
            job,
            job_key,
            job_epoch,
            order,
            position,
            step: None,
            staged: false,
            claimed: Vec::new(),
        }
    }

    /// Closes open file `fh`.
    pub fn release(&self, fh: u64) {
        let Some(handle) = self.handles.remove_file(fh) else {
            if self.release_predecessors(fh) {
                return;
            }
            return self.orders.release(fh);
        };
        if let Some(watch) = &handle.watch {
            self.opener.kernel.closed(watch);
        }
        // An open counted its whole file as read; its reader may have read a part.
        if handle.reads_reach_daemon {
            let size = handle.version.size;
            let asked = handle.asked.load(Ordering::Relaxed);
            if asked > size {
                let counters = &self.reads.ledger.stats().counters;
                crate::stats::Counters::add(&counters.kernel_reasked_bytes, asked - size);
                tracing::debug!(
                    "{}: the kernel asked for {asked} bytes of {size}: it dropped pages it had \
                     read ahead before they were read",
                    handle.rel.display()
                );
            }
            let unread = size - asked.min(size);
            if unread > 0 {
                let hit = handle.counted_at_open.load(Ordering::Relaxed);
                self.reads.ledger.read_in_part(&handle.att, unread, hit);
            }
        }
        // A streamed miss's pages are the kernel's copy of bytes the cache keeps or does not
        // want: left there, they would push out what the cache serves (LRU again).
        if handle.drop_pages_at_release {
            self.invalidate(handle.ino);
        }
        // A told open never went through the passthrough table.
        if (!handle.silent || handle.adopted) && !handle.told {
            let memory = &self.reads.tiers.memory;
            (self.opener.passthrough)
                .release(handle.ino, handle.kernel_io, |v| memory.holds_for_kernel(v));
        }
    }
}

/// How the kernel reads an open file, and what for.
#[derive(Debug)]
pub(super) struct KernelReading {
    io: KernelIo,
    /// It may keep the pages it cached of the file (`KernelIo::PageCache` only).
    keep_cache: bool,
    /// Its pages are dropped when the open is released (a streamed miss).
    drop_at_release: bool,
    /// A streamed miss read with direct I/O, its job reading large (`DaemonRead::DirectStream`).
    direct_stream: bool,
    /// A sentinel's open, watched ([`kernel_cache`]).
    watch: Option<kernel_cache::Watch>,
    /// The backing file it reads from by itself.
    backing: Option<Backing>,
}

impl KernelReading {
    /// A file the kernel opened itself and told of (`told/`): through its page cache. A
    /// miss's reads all reach the daemon (the pages it had of the file went when it was
    /// last read) and count what they move; a hit's may be served from the pages.
    pub(super) fn told(hit: bool) -> KernelReading {
        KernelReading {
            io: KernelIo::PageCache,
            keep_cache: hit,
            drop_at_release: false,
            direct_stream: false,
            watch: None,
            backing: None,
        }
    }

    /// A read the kernel opened for itself, not told: the kernel keeps the pages.
    const UNOPENED: KernelReading = KernelReading {
        io: KernelIo::PageCache,
        keep_cache: true,
        drop_at_release: false,
        direct_stream: false,
        watch: None,
        backing: None,
    };
}

/// The handle of the open of node `ino` by `caller`, counted as `counted` says.
pub(super) fn file_handle(
    ino: NodeId,
    caller: Caller,
    opened: SourceOpen,
    counted: Counted,
    hit: bool,
    access: Access,
    reading: KernelReading,
) -> FileHandle {
    FileHandle {
        rel: Arc::from(opened.rel),
        version: opened.meta.version,
        file: opened.file,
        counted_at_open: AtomicBool::new(hit),
        reads_reach_daemon: access == Access::Counted
            && (reading.io == KernelIo::Direct
                || (reading.io == KernelIo::PageCache && !reading.keep_cache)),
        asked: AtomicU64::new(0),
        att: Attribution {
            epoch: counted.epoch,
            job: counted.job,
            job_epoch: counted.job_epoch,
        },
        job_key: counted.job_key,
        order: counted.order,
        position: counted.position,
        // A re-read within the epoch, or a second look right after it ended; not a read
        // that may be the new epoch's first of the file.
        same_access: access == Access::Silent
            || matches!(counted.step, Some(Step::Repeat | Step::Trailing)),
        held: Mutex::new(Held {
            claimed: counted.claimed,
            last: Default::default(),
        }),
        drop_pages_at_release: reading.drop_at_release,
        direct_stream: reading.direct_stream,
        direct_reads: Default::default(),
        watch: reading.watch,
        kernel_io: reading.io,
        page_cache_stream: reading.io == KernelIo::PageCache
            || matches!(reading.backing, Some(Backing::Source(_))),
        ino,
        pid: caller.pid,
        file_id: opened.file_id,
        changed_while_open: AtomicBool::new(false),
        stream: Default::default(),
        cached_at_open: false,
        silent: access == Access::Silent,
        adopted: false,
        told: false,
    }
}

/// The debug line of an open.
fn log_open(opened: &SourceOpen, fh: u64, caller: Caller, counted: &Counted, hit: bool) {
    tracing::debug!(
        "open {} fh {fh} by {} (pid {}): {} (epoch {}, job epoch {}, {:?})",
        opened.rel.display(),
        counted.job_key,
        caller.pid,
        if hit {
            "hit"
        } else if counted.staged {
            "staged"
        } else {
            "miss"
        },
        counted.epoch,
        counted.job_epoch,
        counted.step
    );
}
