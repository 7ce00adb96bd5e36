//! Statistics: the names, what they mean, the live counters, the per-epoch history, and the
//! snapshot that every view renders.
//!
//! Every stat is defined once, in [`Stat`]: its name is the key in the `user.coorfs.stats`
//! JSON document, the suffix of its own `user.coorfs.<name>` attribute, the label in
//! `coorfs stats`, and its help text goes into the man page. Nothing else spells a stat's
//! name, so the views cannot drift apart.
//!
//! Hits and misses count file accesses, decided when a file is opened: a file whose every
//! byte is cached is a hit, even though the kernel's page cache may then serve its bytes
//! without asking the daemon; its size is counted then as bytes from the cache (training
//! reads files whole). Bytes from the source are counted as they are read from it.
//!
//! The views outside the mount's root attributes live here too: `view.rs` is `coorfs stats`
//! (the JSON document read back and printed for people), `metrics.rs` the Prometheus server.
//! The mount takes the snapshot they render (`crate::fs`'s `views.rs`).

pub mod metrics;
pub mod view;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use serde::Serialize;

use crate::epoch::{Boundary, EpochTracker, Step};
use crate::namespace::FileId;

/// The POSIX ACL attributes, passed through from the source for the kernel to evaluate.
pub const ACL_XATTRS: [&str; 2] = ["system.posix_acl_access", "system.posix_acl_default"];

/// The prefix of every coorfs extended attribute.
pub const XATTR_PREFIX: &str = "user.coorfs.";
/// The attribute of the mount root that holds every stat as one JSON document.
pub const STATS_XATTR: &str = "user.coorfs.stats";
/// The per-file attribute: how many bytes of the file are cached.
pub const CACHED_XATTR: &str = "user.coorfs.cached";

/// What a stat's number measures, for display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Count,
    Bytes,
    Ratio,
    Seconds,
    /// A word, not a number (`transport`).
    Text,
}

macro_rules! stats {
    ($($variant:ident => $name:literal, $unit:ident, $help:literal;)*) => {
        /// A numeric statistic of a mount.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Stat { $($variant,)* }

        impl Stat {
            /// Every stat, in the order the views list them.
            pub const ALL: &'static [Stat] = &[$(Stat::$variant,)*];

            /// The name: the JSON key and the attribute suffix.
            pub fn name(self) -> &'static str {
                match self { $(Stat::$variant => $name,)* }
            }

            /// What it counts, for the man page.
            pub fn help(self) -> &'static str {
                match self { $(Stat::$variant => $help,)* }
            }

            /// What its number measures.
            pub fn unit(self) -> Unit {
                match self { $(Stat::$variant => Unit::$unit,)* }
            }
        }
    };
}

stats! {
    Reads => "reads", Count, "File accesses: opens of regular files for reading. reads = hits + misses.";
    Hits => "hits", Count, "Accesses of files whose every byte was cached when opened.";
    Misses => "misses", Count, "Accesses of files not (wholly) cached when opened.";
    HitRate => "hit_rate", Ratio, "hits / reads, from 0 to 1.";
    BytesRead => "bytes_read", Bytes, "Bytes of the files accessed: each access counts its file's size when opened (training reads files whole), and one whose every read reaches the daemon takes back, when closed, what its reader did not read (random access into a big file); reads the kernel serves by itself (passthrough, pages it keeps) are not seen, and such an access counts its whole file.";
    ByteHitRate => "byte_hit_rate", Ratio, "Bytes not read from the source over bytes read: 1 - bytes_from_source / bytes_read, from 0 to 1 (the cache, the disk tier and peers served the rest). The hit rate of shards and other big files, which hits and misses count as misses unless every byte was cached.";
    BytesFromCache => "bytes_from_cache", Bytes, "Bytes served from the cache (a hit's whole file size, counted when opened).";
    BytesFromSource => "bytes_from_source", Bytes, "Bytes read from the source.";
    CachedBytes => "cached_bytes", Bytes, "Bytes of file data in the cache.";
    CachedFiles => "cached_files", Count, "Files whose every byte is cached.";
    CachedBlocks => "cached_blocks", Count, "Blocks in the cache (a small file is one block).";
    CacheUsed => "cache_used", Bytes, "Bytes of the budget in use (cached bytes plus alignment).";
    CacheCapacity => "cache_capacity", Bytes, "The cache budget in bytes now: --cache-size, or the elastic budget's current size (cache_budget auto; cache_budget_why says why it is what it is).";
    CacheBudgetGrows => "cache_budget_grows", Count, "Times the elastic budget grew: the memory cgroup (or the host) had more free than the reserve kept for the job.";
    CacheBudgetHolds => "cache_budget_holds", Count, "Times it stopped at what the cache held: a little less free than the reserve, or memory pressure with two reserves free.";
    CacheBudgetShrinks => "cache_budget_shrinks", Count, "Times it shrank: well under the reserve free, or memory pressure with less than two reserves free.";
    CacheDroppedFiles => "cache_dropped_files", Count, "Files the cache dropped blocks of, newest first, because the elastic budget shrank: the newest blocks of a big file, what the shrink needs (a file a passthrough open took whole goes whole).";
    CacheFreedBytes => "cache_freed_bytes", Bytes, "Memory those drops gave back to the kernel.";
    MemoryFree => "memory_free", Bytes, "What the memory cgroup (or the host) had free at the elastic budget's last look, reclaimable page cache counted as free; 0 with a fixed budget.";
    MemoryPressureEvents => "memory_pressure_events", Count, "Memory pressure notifications from the kernel (cgroup v1 memory.pressure_level medium, v2 PSI) that the elastic budget got.";
    AdmissionsRefused => "admissions_refused", Count, "Blocks read from the source but not cached because the cache was full.";
    Evictions => "evictions", Count, "Blocks evicted to make room (LRU only; MinIO never evicts).";
    SourceErrors => "source_errors", Count, "Reads of the source that failed (the reader got the error).";
    SourceRequests => "source_requests", Count, "HTTP requests sent to an object store source (s3://): listings, HEADs and ranged GETs, retries included; 0 for a directory.";
    SourceRetried => "source_retried", Count, "Of those, requests answered with throttling, a server error or a timeout, or whose connection failed: each was retried with backoff and jitter (for up to 45 s) before the read failed.";
    SourceThrottled => "source_throttled", Count, "Of those, answers that asked to slow down (503 SlowDown, 429).";
    SourceGetsAhead => "source_gets_ahead", Count, "Of those, GETs sent before their reader asked: with an order hint, the first run of each of the next objects the hint names that are read in parts (not prefetched), so that their opens find the store's wait behind them.";
    SourceGetsAheadUnused => "source_gets_ahead_unused", Count, "Of those, GETs dropped unread: their object was read otherwise (another range, from the cache), or not within 10 s (8 wait at most; no more are sent while they do).";
    TierErrors => "tier_errors", Count, "Faults of a tier in front of the source (none can fail in memory): each read was served by the next tier; a failed write of the disk tier (a full disk) counts too, and turns it off.";
    DiskHits => "disk_hits", Count, "Blocks read from the disk tier (--cache-dir) instead of from peers or the source.";
    BytesFromDisk => "bytes_from_disk", Bytes, "Bytes of those blocks.";
    DiskCachedBytes => "disk_cached_bytes", Bytes, "Bytes of file data in the disk tier.";
    DiskCachedBlocks => "disk_cached_blocks", Count, "Blocks in the disk tier.";
    DiskIndexBytes => "disk_index_bytes", Bytes, "Bytes of memory the disk tier's index takes (83-166 per block on disk, as its hash table grows).";
    DiskUsed => "disk_used", Bytes, "Bytes of the disk tier's data file: blocks, their alignment, and dropped blocks (space is not reused).";
    DiskCapacity => "disk_capacity", Bytes, "The disk tier's budget in bytes (--disk-cache-size); 0 without --cache-dir.";
    DiskDropped => "disk_dropped", Count, "Blocks the disk tier dropped instead of serving: a wrong checksum (torn or corrupt), or their file changed in the source.";
    DiskEnabled => "disk_enabled", Count, "1 while the disk tier serves and takes blocks; 0 without --cache-dir, or after a write or read error (a full disk) turned it off.";
    PeerHits => "peer_hits", Count, "Blocks read from the member of the cluster that owns their file instead of from the source (--peers, --cluster).";
    BytesFromPeers => "bytes_from_peers", Bytes, "Bytes of those blocks.";
    PeerErrors => "peer_errors", Count, "Peer reads that failed (timeout, refusal, short body, wrong checksum): each was read from the source instead, and the peer left alone for a while.";
    PeerServed => "peer_served", Count, "Blocks this member served to the others.";
    BytesToPeers => "bytes_to_peers", Bytes, "Bytes of those blocks.";
    PeerRefused => "peer_refused", Count, "Requests to the peer server refused: not signed with the cluster's secret, malformed, for a path outside the dataset, or too long.";
    FetchStallSeconds => "fetch_stall_seconds", Seconds, "Seconds reads waited for the source, summed over concurrent reads: the fetch stall.";
    DataWaitSeconds => "data_wait_seconds", Seconds, "Seconds reader processes waited for data: for each process, the time at least one of its reads waited for a fetch, summed over processes. Per epoch, over the readers' time, it gives the verdict of coorfs stats (data-bound or compute-bound).";
    StagingHits => "staging_hits", Count, "Accesses of uncached files that the prefetcher had wholly staged before they were opened.";
    SharedHits => "shared_hits", Count, "Staging hits on blocks read for another job (kept for the jobs that had still to read the file).";
    SourceReadsPerFile => "source_reads_per_file", Ratio, "Reads of files from the source per file and round (a round: the epochs of the same number of every job): 1.0 when each file is read from the source once a round however many jobs read it; N when N jobs each read it themselves.";
    ReadaheadBytes => "readahead_bytes", Bytes, "Bytes of object-store parts read ahead of the reader inside a file (the rest of a part after the block asked for) that neither the cache kept nor a reader was waiting for.";
    ReadaheadUnusedBytes => "readahead_unused_bytes", Bytes, "Of those, bytes dropped before a reader took them (the reader seeked elsewhere or stopped): wasted readahead.";
    KernelReaskedBytes => "kernel_reasked_bytes", Bytes, "Bytes the kernel asked for again within one open (beyond the file's size, counted when the open ends): pages it had read ahead and dropped before its reader took them, for want of memory (a pod too tight for the kernel's readahead); from an object store each such byte the cache lacks is read twice.";
    SourceRequestsPerGib => "source_requests_per_gib", Count, "source_requests per GiB of bytes_from_source: 128 when a big object is read in GETs of 8 MiB parts (fewer where a GET spans several: source_stream_bdp_bytes), 1,024 in 1 MiB blocks; 0 for a directory.";
    SourceStreamBdpBytes => "source_stream_bdp_bytes", Bytes, "An object store's bandwidth-delay product for one stream, as the last GETs of parts measured it (the rate of a body after its first block, times the wait for that block): a GET spans enough parts (--part-size) for twice it, up to the readahead buffer. A cloud store's is a few MB (a GET a part); a server nearby's can pass a part. 0 for a directory, or before a part was read.";
    PrefetchedBlocks => "prefetched_blocks", Count, "Blocks the prefetcher read ahead of the readers.";
    PrefetchedUnused => "prefetched_unused", Count, "Staged blocks dropped unread: their job's epoch ended without them, or the job stopped reading (wasted prefetch).";
    StagingBytes => "staging_bytes", Bytes, "Bytes staged by the prefetcher (or reserved for its fetches in flight) now.";
    PrefetchMemory => "prefetch_memory", Bytes, "The staging budget in bytes now: --prefetch-memory (in a memory cgroup, by default a sixteenth of its limit), lowered beside an elastic cache that shrank to an eighth of its size (8 MiB at least); 0 with --no-prefetch.";
    KernelCache => "kernel_cache", Count, "1 while hits may be served from the kernel's page cache (keep_cache); 0 once sentinel files showed that the kernel does not keep their pages until they are read again (hits of files over 64 KiB then use direct I/O, where passthrough does not read them).";
    KernelRefills => "kernel_refills", Count, "Reopened sentinel files whose pages the kernel had dropped and read again.";
    Passthrough => "passthrough", Count, "1 while the kernel may read files by itself (FUSE passthrough); 0 with --no-passthrough or --opens kernel (or once --opens auto let the kernel open files), on a kernel without it, or when the kernel refused the daemon a backing file (no CAP_SYS_ADMIN).";
    PassthroughOpens => "passthrough_opens", Count, "Opens whose reads the kernel served from a backing file without the daemon: cached files over 64 KiB (from the cache's own files), and files the cache would not keep or the page cache holds whole (from the source).";
    PassthroughSourceOpens => "passthrough_source_opens", Count, "Of those, opens of files the cache would not keep, or of 4 MiB or more that the page cache holds whole, read from the source by the kernel: misses whose whole size counts in bytes_from_source at open.";
    StreamDirectOpens => "stream_direct_opens", Count, "Opens of objects of 4 MiB or more (an object store's, one of whose streams brings a part in a request's wait: source_stream_bdp_bytes at least --part-size) that the daemon served with direct I/O because their job reads large pieces (its last such file's first read passed 128 KiB): each reply goes straight into the reader's buffer, with no page of the kernel's to fill and drop. A job whose reads turn small (a mean of 128 KiB or less) goes back to the page cache at its next open.";
    ReadRequests => "read_requests", Count, "Read requests that reached the daemon (a passthrough open sends none).";
    KernelOpens => "kernel_opens", Count, "1 once the kernel opens files itself (--opens: no OPEN reaches the daemon, which is told of each open after the fact; opens in the JSON document says who opens, opens_why why the daemon does), else 0.";
    ToldOpens => "told_opens", Count, "Opens the kernel made by itself and told the daemon of (eBPF or fanotify, COORFS_TOLD_BY): each counted as an access, as an OPEN is.";
    BatchedReads => "batched_reads", Count, "Small files the prefetcher read whole from a directory source in batches: opened and read together through io_uring, a system call for each step of up to 8 files. 0 where files are read one by one (an object store, --read-delay, a filesystem that refuses O_DIRECT, a kernel without io_uring).";
    KernelStores => "kernel_stores", Count, "Files a prefetch brought whole into the cache that the daemon handed to the kernel's page cache as well, where the kernel opens files itself: their readers read them with no request.";
    HintsAccepted => "hints_accepted", Count, "Order hints accepted (commits to the .coorfs-order file).";
    HintsRejected => "hints_rejected", Count, "Order hints rejected (unknown paths, garbage, too large).";
    ActiveJobs => "active_jobs", Count, "Jobs (process groups, or the trials of a sweep script, by default) that read the mount and were not idle long enough to be forgotten.";
    DatasetFiles => "dataset_files", Count, "Regular files found in the source by the scan at mount.";
    DatasetBytes => "dataset_bytes", Bytes, "Bytes of those files.";
    MetadataBytes => "metadata_bytes", Bytes, "Bytes of the daemon's node table: the names and attributes of every entry of the source it has seen (about 106 bytes plus the name each); for an s3:// source, with its listing (about 250 bytes, twice the path and the ETag an object).";
    ScanComplete => "scan_complete", Count, "1 once the scan of the source has finished (epochs can end only then), else 0.";
    Epoch => "epoch", Count, "The current dataset-wide epoch: it ends when every file has been read once more.";
    UptimeSeconds => "uptime_seconds", Seconds, "Seconds since the mount.";
    Pid => "pid", Count, "The daemon's process id.";
    KeeperPid => "keeper_pid", Count, "The keeper's process id: it holds the mount's FUSE connection and starts a new daemon when the daemon dies; 0 without a keeper (--no-keeper, or a mount by a user other than root).";
    Resends => "resends", Count, "1 if the kernel sends a successor daemon the requests a dead one had read (FUSE_NOTIFY_RESEND, Linux 6.9 and later), so that no read waits for ever; 0 on an older kernel or without a keeper.";
    DaemonRestarts => "daemon_restarts", Count, "Daemons started after the first: after a crash, a kill or the OOM killer, or a handover (coorfs restart, or coorfs mount again over the mount); why the last one ended is daemon_last_end in the JSON document.";
    Transport => "transport", Text, "How the kernel's requests reach the daemon: io_uring (FUSE over io_uring, Linux 6.14 and later: one queue per CPU, each request answered on the CPU that made it) or dev_fuse (read from /dev/fuse). --io-uring says when io_uring is used; in Prometheus a gauge of 1 labelled with the word.";
    DaemonLongestPauseSeconds => "daemon_longest_pause_seconds", Seconds, "The longest time from a daemon's end to its successor serving: what a read waited at most for a restart.";
}

/// A stat's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Count(u64),
    Ratio(f64),
    Text(&'static str),
}

impl Value {
    /// As the attribute's text: an integer, or a ratio with four decimals.
    pub fn text(self) -> String {
        match self {
            Value::Count(n) => n.to_string(),
            Value::Ratio(r) => format!("{r:.4}"),
            Value::Text(t) => t.to_string(),
        }
    }

    fn json(self) -> serde_json::Value {
        match self {
            Value::Count(n) => n.into(),
            Value::Ratio(r) => serde_json::Number::from_f64((r * 1e4).round() / 1e4)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::Text(t) => t.into(),
        }
    }
}

/// The kinds of FUSE request a mount answers, for the table of requests (`requests` in the
/// stats document): how many of each came and how long the daemon's handler took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Getattr,
    Open,
    Read,
    Release,
    Flush,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Statfs,
    Access,
    Getxattr,
    Listxattr,
    Ioctl,
    Readlink,
    Other,
}

impl Op {
    /// Every kind, in the order the table lists them.
    pub const ALL: [Op; 17] = [
        Op::Lookup,
        Op::Getattr,
        Op::Open,
        Op::Read,
        Op::Release,
        Op::Flush,
        Op::Opendir,
        Op::Readdir,
        Op::Readdirplus,
        Op::Releasedir,
        Op::Statfs,
        Op::Access,
        Op::Getxattr,
        Op::Listxattr,
        Op::Ioctl,
        Op::Readlink,
        Op::Other,
    ];

    /// The request's name, lower case, as the kernel's FUSE_ opcode names it.
    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Open => "open",
            Op::Read => "read",
            Op::Release => "release",
            Op::Flush => "flush",
            Op::Opendir => "opendir",
            Op::Readdir => "readdir",
            Op::Readdirplus => "readdirplus",
            Op::Releasedir => "releasedir",
            Op::Statfs => "statfs",
            Op::Access => "access",
            Op::Getxattr => "getxattr",
            Op::Listxattr => "listxattr",
            Op::Ioctl => "ioctl",
            Op::Readlink => "readlink",
            Op::Other => "other",
        }
    }
}

/// How many requests of each kind came, and the nanoseconds their handlers took on the FUSE
/// threads (a read's fetch, done on another thread, not included).
#[derive(Debug, Default)]
pub struct Requests {
    count: [AtomicU64; Op::ALL.len()],
    nanos: [AtomicU64; Op::ALL.len()],
}

impl Requests {
    /// One request of kind `op` took `nanos`.
    pub fn record(&self, op: Op, nanos: u64) {
        self.count[op as usize].fetch_add(1, Ordering::Relaxed);
        self.nanos[op as usize].fetch_add(nanos, Ordering::Relaxed);
    }

    /// How many requests of kind `op` came.
    pub fn count(&self, op: Op) -> u64 {
        self.count[op as usize].load(Ordering::Relaxed)
    }

    /// `{"lookup": {"count": N, "seconds": S}, ...}` for every kind that came.
    pub fn json(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        for op in Op::ALL {
            let n = self.count(op);
            if n > 0 {
                let seconds = self.nanos[op as usize].load(Ordering::Relaxed) as f64 / 1e9;
                out.insert(
                    op.name().into(),
                    serde_json::json!({"count": n, "seconds": (seconds * 1e6).round() / 1e6}),
                );
            }
        }
        out.into()
    }
}

/// The live counters of a mount (what is not read off the cache or the namespace).
#[derive(Debug, Default)]
pub struct Counters {
    pub reads: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_from_cache: AtomicU64,
    pub bytes_from_source: AtomicU64,
    pub source_errors: AtomicU64,
    pub tier_errors: AtomicU64,
    pub disk_hits: AtomicU64,
    pub bytes_from_disk: AtomicU64,
    pub disk_dropped: AtomicU64,
    pub peer_hits: AtomicU64,
    pub bytes_from_peers: AtomicU64,
    pub peer_errors: AtomicU64,
    pub peer_served: AtomicU64,
    pub bytes_to_peers: AtomicU64,
    pub peer_refused: AtomicU64,
    pub staging_hits: AtomicU64,
    pub shared_hits: AtomicU64,
    /// Reads of a file's first block from the source.
    pub source_file_reads: AtomicU64,
    pub prefetched_blocks: AtomicU64,
    pub prefetched_unused: AtomicU64,
    pub bytes_read: AtomicU64,
    pub readahead_bytes: AtomicU64,
    pub readahead_unused_bytes: AtomicU64,
    pub kernel_reasked_bytes: AtomicU64,
    /// Microseconds.
    pub fetch_stall_us: AtomicU64,
    /// Microseconds.
    pub data_wait_us: AtomicU64,
    pub hints_accepted: AtomicU64,
    pub hints_rejected: AtomicU64,
    pub passthrough_opens: AtomicU64,
    pub passthrough_source_opens: AtomicU64,
    pub stream_direct_opens: AtomicU64,
    pub read_requests: AtomicU64,
    pub told_opens: AtomicU64,
    pub kernel_stores: AtomicU64,
    pub batched_reads: AtomicU64,
}

impl Counters {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// One epoch of one reader: what it read and how it went.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct EpochRecord {
    pub epoch: u64,
    /// Seconds since the mount when the epoch's first file was opened.
    pub start: f64,
    /// Seconds from the epoch's first open to its last (so far, if it is still running).
    pub seconds: f64,
    /// True once the epoch ended: every file was read, or (a job's) a new pass began.
    pub complete: bool,
    /// Distinct files read.
    pub files: u64,
    pub reads: u64,
    pub hits: u64,
    pub misses: u64,
    pub hit_rate: f64,
    /// Bytes of the files accessed (each access its file's size).
    pub bytes_read: u64,
    /// Reads of the source that the daemon made for the epoch (for readers or the
    /// prefetcher): for an object store, its GETs (a part is one), retries aside; a file read
    /// by passthrough from the source is none.
    pub source_reads: u64,
    /// Bytes not read from the source over bytes read (see [`EpochRecord::count_bytes`]).
    pub byte_hit_rate: f64,
    pub bytes_from_cache: u64,
    pub bytes_from_source: u64,
    /// Bytes read from the member of the cluster that owns their file.
    pub bytes_from_peers: u64,
    /// Blocks read from the member of the cluster that owns their file.
    pub peer_hits: u64,
    /// Blocks that member should have served and did not (it failed, or was suspect): each
    /// was read from the source instead.
    pub peer_fallbacks: u64,
    /// Seconds reads spent waiting for the source (summed over concurrent reads).
    pub fetch_stall_seconds: f64,
    /// Reader processes that opened the epoch's files (at most [`READERS_COUNTED`]).
    pub readers: u64,
    /// Seconds reader processes waited for data (the cache missed, a fetch ran): for each
    /// process the time at least one of its reads waited, summed over the processes. Of
    /// `readers` x `seconds`, the share the readers spent waiting rather than preparing
    /// samples or feeding the GPU ([`DataWait`]).
    pub data_wait_seconds: f64,
    /// Accesses of uncached files whose bytes the prefetcher had staged in time.
    pub staging_hits: u64,
    /// Of those, files read for another job.
    pub shared_hits: u64,
    /// Files the prefetcher staged or cached ahead of the reader.
    pub prefetched_files: u64,
    /// Staged blocks dropped unread: the epoch ended without them, or the job stopped reading
    /// (wasted prefetch I/O).
    pub prefetched_unused: u64,
}

impl EpochRecord {
    fn new(epoch: u64, start: f64) -> Self {
        EpochRecord {
            epoch,
            start,
            ..Default::default()
        }
    }

    /// Works out `byte_hit_rate` from the byte counts (see [`byte_hit_rate`]).
    pub fn count_bytes(&mut self) {
        self.byte_hit_rate = byte_hit_rate(self.bytes_read, self.bytes_from_source);
    }

    /// Turns one hit of a file of `size` bytes into a miss: the file was wholly cached at
    /// open, but (LRU) part of it was evicted before it was read.
    pub fn hit_became_miss(&mut self, size: u64) {
        self.hits = self.hits.saturating_sub(1);
        self.misses += 1;
        self.bytes_from_cache -= size.min(self.bytes_from_cache);
        self.hit_rate = self.hits as f64 / self.reads.max(1) as f64;
    }
}

/// The share of `read` bytes that did not come from the source (`from_source` of them): 1 -
/// from_source / read, 0 before any byte. Bytes read ahead for the next epoch may make an
/// epoch's source bytes exceed what it read: then 0.
pub fn byte_hit_rate(read: u64, from_source: u64) -> f64 {
    if read == 0 {
        0.0
    } else {
        1.0 - from_source.min(read) as f64 / read as f64
    }
}

/// How many epochs of history a reader keeps (the oldest are dropped): a bound on memory
/// for mounts that live for thousands of epochs.
pub const EPOCH_HISTORY: usize = 1000;

/// The epochs of one reader: its tracker and the history of its records.
#[derive(Debug)]
pub struct EpochLog {
    tracker: EpochTracker,
    records: Vec<EpochRecord>,
    /// The last accesses (epoch recorded in, hit, size), so that those of a new epoch that
    /// the tracker recognised late can be moved to it (see [`Step::Restarted`]).
    accesses: std::collections::VecDeque<(u64, bool, u64)>,
    /// The processes that opened files in an epoch: the epoch, and their pids.
    readers: (u64, std::collections::HashSet<u32>),
}

/// Reader processes counted in an epoch at most (the pids kept to tell them apart).
pub const READERS_COUNTED: usize = 4096;

impl EpochLog {
    /// A log at the start of epoch 1, following `rule`.
    pub fn new(rule: Boundary) -> Self {
        EpochLog {
            tracker: EpochTracker::new(rule),
            records: Vec::new(),
            accesses: Default::default(),
            readers: Default::default(),
        }
    }

    /// The tracker.
    pub fn tracker(&self) -> &EpochTracker {
        &self.tracker
    }

    /// The files the current epoch will read, if the reader said ([`EpochTracker::plan`]).
    pub fn plan(&mut self, files: Option<std::sync::Arc<fixedbitset::FixedBitSet>>) {
        self.tracker.plan(files);
    }

    /// The record of `epoch`: created if it is the current epoch's and has none yet, else
    /// found in the history (None once it left it).
    fn record(&mut self, epoch: u64, now: f64) -> Option<&mut EpochRecord> {
        if epoch == self.tracker.epoch() && self.records.last().map(|r| r.epoch) != Some(epoch) {
            self.records.push(EpochRecord::new(epoch, now));
            if self.records.len() > EPOCH_HISTORY {
                self.records.remove(0);
            }
        }
        let r = self.records.iter_mut().rev().find(|r| r.epoch == epoch)?;
        if r.start.is_nan() {
            // Created by `update` before the epoch's first open: it starts now.
            r.start = now;
        }
        Some(r)
    }

    /// Records an open of `file` by process `reader` at `now` seconds since the mount, a hit
    /// or a miss of `size` bytes; `total` is the dataset's file count if known. Returns the
    /// epoch the access belongs to, and what it did to the epoch.
    pub fn open(
        &mut self,
        file: FileId,
        reader: u32,
        hit: bool,
        size: u64,
        total: Option<usize>,
        now: f64,
    ) -> (u64, Step) {
        let before = self.tracker.epoch();
        let step = self.tracker.access(file, reader, total);
        let epoch = match step {
            Step::Trailing => before - 1,
            Step::Restarted { moved } => {
                let after = self.tracker.epoch();
                self.move_accesses(before, after, moved as usize, now);
                after
            }
            _ => before,
        };
        if self.tracker.epoch() != before {
            let files = self.tracker.last_epoch_files() as u64;
            if let Some(r) = self.record(before, now) {
                r.files = files;
                r.complete = true;
            }
        }
        if step != Step::Trailing {
            if self.readers.0 != epoch {
                self.readers = (epoch, Default::default());
            }
            if self.readers.1.len() < READERS_COUNTED {
                self.readers.1.insert(reader);
            }
        }
        let readers = self.readers.1.len() as u64;
        if let Some(r) = self.record(epoch, now) {
            count_access(r, hit, size, 1);
            if step != Step::Trailing {
                r.seconds = now - r.start;
                r.readers = readers;
            }
        }
        let current = self.tracker.files_in_epoch() as u64;
        if epoch == self.tracker.epoch()
            && let Some(r) = self.record(epoch, now)
        {
            r.files = current;
        }
        self.accesses.push_back((epoch, hit, size));
        if self.accesses.len() > crate::epoch::HISTORY + 1 {
            self.accesses.pop_front();
        }
        (epoch, step)
    }

    /// Moves the last `moved` accesses before the current one that were recorded in epoch
    /// `from` to epoch `to`.
    fn move_accesses(&mut self, from: u64, to: u64, moved: usize, now: f64) {
        let skip = self.accesses.len().saturating_sub(moved);
        let mut taken = Vec::new();
        for a in self.accesses.iter_mut().skip(skip) {
            if a.0 == from {
                a.0 = to;
                taken.push((a.1, a.2));
            }
        }
        if let Some(r) = self.record(from, now) {
            for &(hit, size) in &taken {
                count_access(r, hit, size, -1);
            }
        }
        if let Some(r) = self.record(to, now) {
            for &(hit, size) in &taken {
                count_access(r, hit, size, 1);
            }
        }
    }

    /// Applies `change` to the record of epoch `epoch`, if it is still in the history. The
    /// current epoch's record is created if the epoch has not had an open yet (a prefetch
    /// for it, following an order hint, can come first).
    pub fn update(&mut self, epoch: u64, change: impl FnOnce(&mut EpochRecord)) {
        // Not started: the epoch's first open sets its start.
        if let Some(r) = self.record(epoch, f64::NAN) {
            change(r);
        }
    }

    /// The history, oldest first.
    pub fn records(&self) -> &[EpochRecord] {
        &self.records
    }
}

/// Adds (`sign` 1) or takes back (-1) one access, a hit or a miss of `size` bytes.
fn count_access(r: &mut EpochRecord, hit: bool, size: u64, sign: i64) {
    let add = |n: &mut u64, by: u64| {
        *n = if sign > 0 {
            *n + by
        } else {
            n.saturating_sub(by)
        }
    };
    add(&mut r.reads, 1);
    add(&mut r.bytes_read, size);
    if hit {
        add(&mut r.hits, 1);
        add(&mut r.bytes_from_cache, size);
    } else {
        add(&mut r.misses, 1);
    }
    r.hit_rate = r.hits as f64 / r.reads.max(1) as f64;
    r.count_bytes();
}

/// Where a job's readers spent an epoch: waiting for data, or doing the rest (reading
/// what was at hand, preparing samples, the GPU's step), as DS-Analyzer asks it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DataWait {
    /// The share of the readers' time spent waiting for data, from 0 to 1.
    pub share: f64,
}

/// From this share of their time waiting for data on, readers are data-bound.
pub const DATA_BOUND_FROM: f64 = 0.25;
/// Epochs shorter than this say nothing yet.
pub const DATA_WAIT_MIN_SECONDS: f64 = 0.5;

impl DataWait {
    /// Of an epoch where `readers` processes read for `seconds` and waited `wait_seconds` in
    /// all; None if it is too short to tell, or no process read.
    pub fn of(wait_seconds: f64, readers: u64, seconds: f64) -> Option<DataWait> {
        if readers == 0 || seconds.is_nan() || seconds < DATA_WAIT_MIN_SECONDS {
            return None;
        }
        let share = (wait_seconds / (readers as f64 * seconds)).clamp(0.0, 1.0);
        Some(DataWait { share })
    }

    /// Of an epoch record (as JSON), if it says.
    pub fn of_record(r: &serde_json::Value) -> Option<DataWait> {
        let n = |k: &str| r.get(k).and_then(serde_json::Value::as_f64);
        DataWait::of(n("data_wait_seconds")?, n("readers")? as u64, n("seconds")?)
    }

    /// True if the readers spent at least [`DATA_BOUND_FROM`] of their time waiting.
    pub fn data_bound(self) -> bool {
        self.share >= DATA_BOUND_FROM
    }

    /// The verdict, for people.
    pub fn verdict(self) -> String {
        let pct = (self.share * 100.0).round();
        if self.data_bound() {
            format!("data-bound {pct:.0}%: more cache or prefetch helps")
        } else {
            format!(
                "compute-bound: storage is not the bottleneck, add CPU workers or offload preprocessing (readers waited for data {pct:.0}% of the time)"
            )
        }
    }
}

/// A mount's stats: counters, plus the dataset-wide epoch log.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    pub counters: Counters,
    /// An object store source's request counters (zero for a directory).
    pub store: std::sync::Arc<crate::source::object::Counters>,
    pub epochs: Mutex<EpochLog>,
    /// The FUSE requests answered.
    pub requests: Requests,
    /// How requests reach the daemon (stat `transport`).
    pub transport: Transport,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            started: Instant::now(),
            counters: Counters::default(),
            store: Default::default(),
            epochs: Mutex::new(EpochLog::new(Boundary::AllRead)),
            requests: Requests::default(),
            transport: Transport::default(),
        }
    }
}

/// How the kernel's requests reach the daemon: asked of the FUSE session (which knows, once
/// its io_uring queues have their entries) whenever a view is taken.
#[derive(Default)]
pub struct Transport {
    io_uring: std::sync::OnceLock<Box<dyn Fn() -> bool + Send + Sync>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Transport {
    /// Set once, by the FUSE session: true while requests come over io_uring.
    pub fn set(&self, io_uring: Box<dyn Fn() -> bool + Send + Sync>) {
        let _ = self.io_uring.set(io_uring);
    }

    /// The stat's value: `io_uring` or `dev_fuse`.
    pub fn name(&self) -> &'static str {
        match self.io_uring.get() {
            Some(on) if on() => "io_uring",
            _ => "dev_fuse",
        }
    }
}

impl Stats {
    /// Seconds since the mount.
    pub fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// Everything a view shows, at one instant.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// One value per entry of [`Stat::ALL`], in that order.
    pub values: Vec<(Stat, Value)>,
    /// Mount facts that are not numbers: source, mount point, policy.
    pub info: Vec<(&'static str, String)>,
    /// The dataset-wide epochs.
    pub epochs: Vec<EpochRecord>,
    /// Every job with its epochs (an array of `JobSummary`).
    pub jobs: serde_json::Value,
    /// The FUSE requests answered, by kind ([`Requests::json`]).
    pub requests: serde_json::Value,
}

impl Snapshot {
    /// The value of `stat`.
    pub fn get(&self, stat: Stat) -> Option<Value> {
        self.values
            .iter()
            .find(|(s, _)| *s == stat)
            .map(|(_, v)| *v)
    }

    /// The `user.coorfs.stats` document, at most `limit` bytes: the kernel caps an
    /// attribute's value at 64 KiB (XATTR_SIZE_MAX), so when the epoch histories do not fit,
    /// only the most recent epochs of each are kept, and `epochs_omitted` says how many
    /// records were left out. Every numeric stat is always there.
    pub fn to_json(&self, limit: usize) -> String {
        let mut keep = usize::MAX;
        loop {
            let text = self.render(keep);
            if text.len() <= limit || keep == 0 {
                return text;
            }
            keep = if keep == usize::MAX {
                EPOCH_HISTORY / 2
            } else {
                keep / 2
            };
        }
    }

    /// The document with at most `keep` epochs of every history.
    fn render(&self, keep: usize) -> String {
        let mut omitted = 0u64;
        let mut recent = |list: &[serde_json::Value]| -> Vec<serde_json::Value> {
            let skip = list.len().saturating_sub(keep);
            omitted += skip as u64;
            list[skip..].to_vec()
        };
        let mut doc = serde_json::Map::new();
        for (k, v) in &self.info {
            doc.insert(k.to_string(), v.clone().into());
        }
        for (s, v) in &self.values {
            doc.insert(s.name().to_string(), v.json());
        }
        let epochs: Vec<serde_json::Value> = self
            .epochs
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or_default())
            .collect();
        doc.insert("epochs".into(), recent(&epochs).into());
        let mut jobs = self.jobs.clone();
        for job in jobs.as_array_mut().into_iter().flatten() {
            if let Some(list) = job.get("epochs").and_then(|e| e.as_array()).cloned() {
                job["epochs"] = recent(&list).into();
            }
        }
        doc.insert("jobs".into(), jobs);
        doc.insert("requests".into(), self.requests.clone());
        doc.insert("epochs_omitted".into(), omitted.into());
        serde_json::Value::Object(doc).to_string()
    }
}

/// The largest `user.coorfs.stats` value the kernel passes (XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;

/// The attribute name of `stat`.
pub fn xattr_name(stat: Stat) -> String {
    format!("{XATTR_PREFIX}{}", stat.name())
}

/// The stat an attribute name refers to, if any.
pub fn stat_of_xattr(name: &str) -> Option<Stat> {
    let suffix = name.strip_prefix(XATTR_PREFIX)?;
    Stat::ALL.iter().copied().find(|s| s.name() == suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip_through_attributes() {
        let mut names: Vec<_> = Stat::ALL.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Stat::ALL.len());
        for s in Stat::ALL {
            assert_eq!(stat_of_xattr(&xattr_name(*s)), Some(*s));
            assert!(!s.help().is_empty());
        }
        assert_eq!(stat_of_xattr("user.coorfs.nope"), None);
        assert_eq!(stat_of_xattr("user.other.hits"), None);
    }

    #[test]
    fn epoch_log_splits_accesses_into_epochs() {
        let mut log = EpochLog::new(Boundary::AllRead);
        // Epoch 1: files 0..3, all misses; epoch 2: file 0 hits, 1 misses, 2 hits.
        for f in 0..3 {
            assert_eq!(log.open(f, 1, false, 10, Some(3), f as f64).0, 1);
        }
        log.update(1, |r| r.bytes_from_source += 30);
        assert_eq!(log.open(0, 1, true, 10, Some(3), 4.0), (2, Step::First));
        assert_eq!(log.open(1, 1, false, 10, Some(3), 5.0).0, 2);
        log.update(2, |r| r.bytes_from_source += 10);
        assert_eq!(log.open(2, 1, true, 10, Some(3), 6.0), (2, Step::Completed));
        let r = log.records();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (
                r[0].files,
                r[0].hits,
                r[0].misses,
                r[0].bytes_from_source,
                r[0].complete
            ),
            (3, 0, 3, 30, true)
        );
        assert_eq!(
            (
                r[1].files,
                r[1].hits,
                r[1].misses,
                r[1].bytes_from_cache,
                r[1].bytes_from_source
            ),
            (3, 2, 1, 20, 10)
        );
        assert!((r[1].hit_rate - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(r[1].seconds, 2.0);
    }

    #[test]
    fn a_job_log_gives_trailing_accesses_to_the_old_epoch_and_a_new_pass_to_the_new() {
        let mut log = EpochLog::new(Boundary::Coverage);
        let total = Some(200);
        for f in 0..200 {
            log.open(f, 1, false, 10, total, 0.0);
        }
        // The last file's second open, after epoch 1 completed.
        assert_eq!(log.open(199, 1, false, 10, total, 1.0), (1, Step::Trailing));
        for f in 0..100 {
            assert_eq!(log.open(f, 2, true, 10, total, 2.0), (2, Step::First));
        }
        // A restart: 5 was read long ago, 150 was not, 6 was: epoch 3 began at 5.
        assert_eq!(log.open(5, 3, true, 10, total, 3.0), (2, Step::Repeat));
        assert_eq!(log.open(150, 3, false, 10, total, 3.0), (2, Step::First));
        assert_eq!(
            log.open(6, 3, true, 10, total, 4.0),
            (3, Step::Restarted { moved: 2 })
        );
        let summary: Vec<_> = log
            .records()
            .iter()
            .map(|r| {
                (
                    r.epoch,
                    r.files,
                    r.reads,
                    r.hits,
                    r.bytes_from_cache,
                    r.complete,
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (1, 200, 201, 0, 0, true),
                (2, 100, 100, 100, 1000, true),
                (3, 3, 3, 2, 20, false),
            ]
        );
    }

    #[test]
    fn snapshot_json_holds_every_stat() {
        let snap = Snapshot {
            values: Stat::ALL.iter().map(|s| (*s, Value::Count(7))).collect(),
            info: vec![("policy", "minio".into())],
            epochs: vec![EpochRecord::new(1, 0.0)],
            jobs: serde_json::json!([{"job": "pgid 1"}]),
            requests: serde_json::json!({}),
        };
        let doc: serde_json::Value = serde_json::from_str(&snap.to_json(XATTR_SIZE_MAX)).unwrap();
        for s in Stat::ALL {
            assert_eq!(doc[s.name()], 7, "{}", s.name());
        }
        assert_eq!(doc["policy"], "minio");
        assert_eq!(doc["epochs"][0]["epoch"], 1);
        assert_eq!(doc["jobs"][0]["job"], "pgid 1");
        assert_eq!(Value::Ratio(0.123456).text(), "0.1235");
    }

    #[test]
    fn long_histories_are_trimmed_to_fit_an_attribute() {
        let epochs: Vec<EpochRecord> = (1..=1000).map(|e| EpochRecord::new(e, 0.0)).collect();
        let job =
            serde_json::json!({"job": "pgid 1", "epochs": serde_json::to_value(&epochs).unwrap()});
        let snap = Snapshot {
            values: Stat::ALL.iter().map(|s| (*s, Value::Count(7))).collect(),
            info: vec![],
            epochs,
            jobs: serde_json::Value::Array(vec![job; 20]),
            requests: serde_json::json!({}),
        };
        let text = snap.to_json(XATTR_SIZE_MAX);
        assert!(text.len() <= XATTR_SIZE_MAX, "{}", text.len());
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        for s in Stat::ALL {
            assert_eq!(doc[s.name()], 7);
        }
        let kept = doc["epochs"].as_array().unwrap();
        assert!(!kept.is_empty() && kept.len() < 1000);
        assert_eq!(
            kept.last().unwrap()["epoch"],
            1000,
            "the most recent are kept"
        );
        let kept_total = kept.len() * 21;
        assert_eq!(
            doc["epochs_omitted"].as_u64().unwrap() as usize,
            21 * 1000 - kept_total
        );
        // Small histories are whole.
        let small = Snapshot {
            epochs: vec![EpochRecord::new(1, 0.0)],
            jobs: serde_json::json!([]),
            requests: serde_json::json!({}),
            ..snap
        };
        let doc: serde_json::Value = serde_json::from_str(&small.to_json(XATTR_SIZE_MAX)).unwrap();
        assert_eq!(doc["epochs_omitted"], 0);
    }

    #[test]
    fn the_verdict_says_data_bound_from_a_quarter_of_the_readers_time_waiting() {
        // (wait seconds, readers, seconds) -> share, if any
        let table = [
            ((62.0, 2, 50.0), Some(0.62)),
            ((10.0, 4, 10.0), Some(0.25)),
            ((3.0, 4, 10.0), Some(0.075)),
            ((50.0, 1, 10.0), Some(1.0)),
            ((1.0, 0, 10.0), None),
            ((0.1, 1, 0.2), None),
            ((0.0, 1, f64::NAN), None),
        ];
        for ((wait, readers, secs), share) in table {
            let got = DataWait::of(wait, readers, secs).map(|d| d.share);
            assert_eq!(got, share, "{wait} {readers} {secs}");
        }
        assert_eq!(
            DataWait::of(62.0, 2, 50.0).unwrap().verdict(),
            "data-bound 62%: more cache or prefetch helps"
        );
        assert_eq!(
            DataWait::of(3.0, 4, 10.0).unwrap().verdict(),
            "compute-bound: storage is not the bottleneck, add CPU workers or offload preprocessing (readers waited for data 8% of the time)"
        );
        let r = serde_json::json!({"data_wait_seconds": 10.0, "readers": 4, "seconds": 10.0});
        assert!(DataWait::of_record(&r).unwrap().data_bound());
        assert_eq!(
            DataWait::of_record(&serde_json::json!({"seconds": 3.0})),
            None
        );
    }
}
