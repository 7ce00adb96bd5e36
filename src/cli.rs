//! The command line. clap stays here: each subcommand's arguments convert into the plain
//! config structs of the library. The man page (`man/coorfs.1`) is generated from these
//! definitions (see `manpage.rs`), so `--help` and the man page cannot disagree.
//!
//! Every way a command fails is a [`CommandError`]: one line for the user and one exit
//! status, decided in one place ([`CommandError::exit_code`]), which the man page's EXIT
//! STATUS describes.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::analyze::AnalyzeError;
use crate::cache::PolicyKind;
use crate::config::MountConfig;
use crate::daemon::{DaemonOptions, MountError};
use crate::reader::ReadError;
use crate::run::RunError;
use crate::stats::view::StatsError;
use crate::units::parse_duration;

/// The whole command line.
#[derive(Debug, Parser)]
#[command(
    name = "coorfs",
    version,
    about = "A read-only FUSE view of a dataset directory that keeps deep-learning training fed",
    long_about = "coorfs mounts a dataset directory read-only and serves it to unchanged training \
jobs (PyTorch, TensorFlow, anything that reads files) with training-aware caching: a cache \
that keeps what it admitted instead of thrashing like the page cache under per-epoch random \
order, prefetch of the files a job has not read yet in its epoch, and statistics that show \
where the time goes.",
    after_help = "Run 'coorfs <COMMAND> --help' for the options of each command; 'man coorfs' \
for everything, including the statistics attributes."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
// Parsed once per run: the size of the mount's options costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Mount SOURCE read-only at MOUNTPOINT and serve it from a background daemon.
    #[command(
        long_about = "Mount SOURCE read-only at MOUNTPOINT. The command returns once the mount \
answers, leaving a daemon that serves it until 'coorfs umount MOUNTPOINT', 'umount MOUNTPOINT' \
or a SIGTERM/SIGINT to the daemon. With --foreground it stays attached, logs to stderr and \
unmounts on Ctrl-C.\n\nEvery write (write, create, mkdir, rename, unlink, truncate, chmod, \
setxattr, ...) fails with EROFS; the source is never written to.\n\nSOURCE may be a prefix of \
an object store: s3://BUCKET/PREFIX (AWS S3 or an S3-compatible store), gs://BUCKET/PREFIX \
(Google Cloud Storage), az://CONTAINER/PREFIX or https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX \
(Azure Blob Storage). Each is configured the way its cloud's tools are: S3 by AWS_ENDPOINT_URL \
(AWS_ALLOW_HTTP=true for a plain-HTTP endpoint), AWS_REGION, AWS_ACCESS_KEY_ID, \
AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, else the profile AWS_PROFILE (default: default) of \
~/.aws/credentials and ~/.aws/config, else instance metadata; GCS by \
GOOGLE_APPLICATION_CREDENTIALS, else gcloud's application default credentials, else the metadata \
server (STORAGE_EMULATOR_HOST: an emulator); Azure by AZURE_STORAGE_ACCOUNT with \
AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, or AZURE_STORAGE_CONNECTION_STRING, else a \
service principal or managed identity (AZURE_STORAGE_USE_EMULATOR=true: Azurite). The mount \
returns once the prefix's first level is listed; each folder is listed when first looked up, \
and the rest in the background (--manifest: no listing at all). Keys become paths, '/' \
separating directories; objects are files of mode 0444 owned by root. An object's version is \
its ETag: the listing is trusted for --metadata-ttl, then an open asks the store again, and \
every read is a ranged GET on the version the open saw (If-Match), so bytes of two versions \
are never mixed: a read of an object replaced since its open fails with ESTALE. Throttling, \
server errors, timeouts (a request unanswered for 30 s, or COORFS_S3_TIMEOUT) and resets or \
refused connections are retried with backoff and jitter for up to 45 s (source_retried, \
source_throttled); 403 gives EACCES, 404 ENOENT, at once. At an http:// S3 endpoint a GET's \
body is read from the socket into the cache's blocks (COORFS_S3_DIRECT=0: through the object \
store client). A prefix no object has is mounted empty, with a warning on stderr.",
        after_help = "Examples:\n  coorfs mount /data/imagenet /mnt/train\n  coorfs mount \
--foreground --log-level debug /data/imagenet /mnt/train\n  AWS_PROFILE=training coorfs mount \
--cache-dir /var/cache/coorfs --disk-cache-size 500G s3://datasets/imagenet/train /mnt/train\n  \
GOOGLE_APPLICATION_CREDENTIALS=/etc/coorfs/sa.json coorfs mount gs://datasets/train /mnt/train\n  \
coorfs manifest az://datasets/train > train.manifest && coorfs mount --manifest train.manifest \
az://datasets/train /mnt/train"
    )]
    Mount(MountArgs),
    /// Unmount a coorfs mount and wait for its daemon to exit.
    #[command(
        visible_alias = "unmount",
        long_about = "Unmount a coorfs mount and wait for its daemon to exit. 'umount \
MOUNTPOINT' and 'fusermount3 -u MOUNTPOINT' work too, but return before the daemon is gone."
    )]
    Umount(UmountArgs),
    /// Hand a coorfs mount to a new daemon while jobs read it (an upgrade in place).
    #[command(
        long_about = "Hand a coorfs mount to a new daemon, with the same options, while jobs \
read it: reads wait for a moment and none fails. Run as root, the new daemon is this coorfs \
binary (after a package upgrade, the new version), and the mount's keeper starts this one from \
then on. 'coorfs mount SOURCE MOUNTPOINT' over a live mount of the same source does the same \
when run from another coorfs binary than the mount's daemon (an upgraded package). \
Needs the mount's keeper (a mount by root without --no-keeper); root or the user who mounted \
may ask."
    )]
    Restart(RestartArgs),
    /// Print a shell's completion script for coorfs.
    #[command(
        long_about = "Print the completion script of SHELL (bash, zsh, fish, elvish or \
powershell) for coorfs on standard output, e.g. 'coorfs completions bash > \
/usr/share/bash-completion/completions/coorfs'. The .deb (scripts/build-deb.sh) and \
scripts/install.sh install those of bash, zsh and fish."
    )]
    Completions(CompletionsArgs),
    /// Show a mount's statistics: cache, hits and misses, bytes, epochs.
    #[command(
        long_about = "Show the statistics of a coorfs mount: accesses, hits and misses, bytes from \
the cache and from the source, what the cache holds, and every epoch so far. The same numbers \
are extended attributes of the mount's root: 'getfattr -d -m - MOUNTPOINT' lists them, and \
user.coorfs.stats holds them all as one JSON document (what --json prints). Each job gets a \
verdict for its last epoch: data-bound (a quarter or more of its readers' time went to waiting \
for data: more cache or prefetch helps) or compute-bound (add CPU workers or offload \
preprocessing).",
        after_help = "Examples:\n  coorfs stats /mnt/train\n  coorfs stats --watch 2 /mnt/train\n  \
getfattr -n user.coorfs.hit_rate --only-values /mnt/train"
    )]
    Stats(StatsArgs),
    /// Read a directory like a training job and report each epoch's throughput.
    #[command(
        long_about = "Read every file below DIR once per epoch, whole, in a fresh random order \
each epoch, split across worker processes of one process group (like a PyTorch DataLoader), \
and print each epoch's files/s and MiB/s. Use it to measure a mount against the directory \
it mirrors, or to warm a cache.",
        after_help = "Example:\n  coorfs read --procs 2 --epochs 3 /mnt/train"
    )]
    Read(ReadArgs),
    /// Measure the storage, simulate the cache and predict data stalls before training.
    #[command(
        long_about = "Answer \"how much memory should this dataset get, and will my GPUs wait?\" \
before training. Scans DATASET (file count, bytes, sizes); measures the storage with random \
whole-file reads of sampled files that bypass the page cache, at queue depths 1, 4, 16 and 64; \
simulates epochs in a fresh random order each with the real file sizes, for the page cache \
(LRU), coorfs's MinIO cache and MinIO with prefetch; and predicts each epoch's fetch time \
(bytes from storage / measured throughput), the samples/s storage sustains and, with --rate, \
whether training waits for data (a fetch stall) and the smallest cache that avoids it.\n\nWith \
--mount it also reads cached files through a live coorfs mount of DATASET (the hit path) and \
prints the mount's last epochs beside the prediction. The sampled files' pages are dropped \
from the page cache before and after they are read.",
        after_help = "Examples:\n  coorfs analyze /data/imagenet --cache-size 64G --rate 2500\n  \
coorfs analyze /data/imagenet --sweep --rate 2500 --plot stalls.svg --json report.json\n  \
coorfs analyze /data/imagenet --mount /mnt/train --time 10s"
    )]
    Analyze(AnalyzeArgs),
    /// Run a command whose PyTorch DataLoaders (and WebDataset shards) hand each epoch's order
    /// to the coorfs mount.
    #[command(
        override_usage = "coorfs run [--mount MOUNTPOINT] [--group NAME] [--] CMD [ARG]...",
        long_about = "Run CMD (a training job, unchanged) so that every PyTorch DataLoader whose \
dataset's files are on a coorfs mount hands each epoch's order to that mount before the epoch's \
first batch: an order hint, which its prefetcher then follows exactly. Python processes that CMD \
starts load a start-up hook (a sitecustomize module on PYTHONPATH, written by coorfs run to a \
private temporary directory; nothing needs installing) that, once torch is imported, takes each \
epoch's order from the DataLoader's own sampler (RandomSampler, SequentialSampler, \
SubsetRandomSampler, WeightedRandomSampler, DistributedSampler, or a BatchSampler over one), with \
the same indices, batches and random numbers as without coorfs run. The files of the samples come \
from the dataset: ImageFolder's samples, a coorfs_paths list or method (for custom datasets), \
Subset, ConcatDataset. A WebDataset pipeline (the webdataset package) hands the shards each \
process opens, in its shuffled order, before it opens the first: each DataLoader worker or rank \
its own, and the mount joins them into the job's epoch. The hook also spares each binary \
open() of a file of a coorfs mount the isatty() question CPython asks of every file it opens, \
which the kernel sends to the daemon as an ioctl: a round trip a file, several times the rest of a \
hot small file's read. The file is buffered as open() would buffer it.\n\nAnything else (a command that is not Python, no torch, another sampler, \
a dataset without paths or not on a coorfs mount, a hint the mount refuses) runs exactly as \
without coorfs run, with one line on standard error saying why no hint was given. Signals sent \
to coorfs run (INT, TERM, HUP, QUIT, USR1, USR2) are passed to CMD, and coorfs run exits with \
CMD's status (128 + N if signal N ended it; 127 if CMD is not found, 126 if it cannot be run).\n\n\
With --group NAME, every job started with the same NAME draws the same order each epoch (a \
coordinated group, such as the trials of a hyper-parameter search): the samplers' permutations \
come from a generator seeded with NAME (DistributedSampler: its seed), as coorfs.HintedSampler's \
group= does, instead of from the job's own random numbers. The mount then reads each file it does \
not cache once a round for the whole group.",
        after_help = "Examples:\n  coorfs run -- python train.py --data /mnt/train\n  \
coorfs run --mount /mnt/train -- torchrun --nproc-per-node 2 train.py\n  \
for lr in 0.1 0.01 0.001; do coorfs run --group sweep-7 -- python train.py --lr $lr & done"
    )]
    Run(RunArgs),
    /// Print the manifest of an object store's prefix: every object's key, size and ETag.
    #[command(
        long_about = "List all of URL (s3://, gs://, az:// or https://ACCOUNT.blob.core.windows.net/) \
as 'coorfs mount' would, in parallel across its folders, and print its manifest on standard \
output: a header line, then KEY<TAB>SIZE<TAB>ETAG<TAB>LAST_MODIFIED an object. 'coorfs mount \
--manifest FILE URL MOUNTPOINT' then mounts it without listing anything.",
        after_help = "Example:\n  coorfs manifest s3://datasets/imagenet/train > train.manifest\n  \
coorfs mount --manifest train.manifest s3://datasets/imagenet/train /mnt/train"
    )]
    Manifest(ManifestArgs),
    /// Hand a coorfs mount the order of the files a job reads next (an order hint).
    #[command(
        long_about = "Hand the coorfs mount at MOUNTPOINT the order in which this job reads files \
next (an order hint): paths relative to MOUNTPOINT (or absolute, below it), one per line, read \
from FILE or, without it or with -, standard input. The mount's prefetcher then fetches those \
files in that order, as far ahead as its staging area allows. The hint belongs to the job that \
the coorfs hint process is part of (see coorfs mount --job-key): under --job-key uid or none, the \
user's or everybody's readers; under the default, a job hands over its own hints from its own \
processes, with the Python package (coorfs.write_order, coorfs.HintedSampler) or coorfs run. A hint the mount refuses \
changes nothing and exits with status 2 and the reason: a path that is no file of the mount or \
one this user may not read (No such file or directory), a line that is no path or names a \
directory (Invalid argument), a hint larger than any order of the dataset (File too large), \
more hint memory than --hint-memory allows this user (Disk quota exceeded).",
        after_help = "Examples:\n  (cd /mnt/train && find . -type f | shuf) | coorfs hint /mnt/train\n  \
coorfs hint /mnt/train epoch-7-order.txt"
    )]
    Hint(HintArgs),
}

/// `coorfs mount`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("membership").args(["peers", "cluster"])))]
pub struct MountArgs {
    /// The dataset directory to expose, or an object store's prefix: s3://BUCKET/PREFIX,
    /// gs://BUCKET/PREFIX, az://CONTAINER/PREFIX or
    /// https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX.
    pub source: PathBuf,
    /// The empty directory where it appears.
    pub mountpoint: PathBuf,

    /// Stay in the foreground and log to stderr; Ctrl-C unmounts.
    #[arg(short, long, help_heading = "Mount")]
    pub foreground: bool,
    /// Let other users access the mount (the kernel still checks the source's permissions).
    #[arg(long, help_heading = "Mount")]
    pub allow_other: bool,
    /// Let the kernel evaluate the source's POSIX ACLs, so that an ACL entry can grant what
    /// the mode bits do not. Without it, entries that deny are still honoured (files are
    /// opened as the reading user); with it, every permission check of a user who does not
    /// own the file costs one more round trip to the daemon (the kernel caches no ACL of a
    /// FUSE file).
    #[arg(long, help_heading = "Mount")]
    pub acl: bool,
    /// Who opens files. auto: every open asks the daemon; where the scan at mount shows that
    /// the kernel may open them itself (as root, a dataset of files under 4 MiB on average, a
    /// source it can watch, no POSIX ACLs unless --acl) and opens come 1,000 a second, the
    /// kernel does from then on, checking the source's live modes, and tells the daemon of
    /// each open (hits, epochs, prefetch; by eBPF, else fanotify: COORFS_TOLD_BY): a file
    /// whose pages it holds, and a directory it has listed, cost no round trip. daemon: every
    /// open asks the daemon, which opens the source file as the caller. kernel: the kernel
    /// from the first open, even where the daemon cannot be told of them. Stats opens and
    /// opens_why say which and why.
    #[arg(long, value_enum, value_name = "WHO", default_value_t = OpensArg::Auto, help_heading = "Mount")]
    pub opens: OpensArg,
    /// The same as --opens kernel.
    #[arg(long, help_heading = "Mount", conflicts_with = "opens")]
    pub fast_open: bool,
    /// Serve every read through the daemon. By default, where the kernel offers FUSE
    /// passthrough (Linux 6.9+) and the daemon has CAP_SYS_ADMIN, the kernel reads cached
    /// files over 64 KiB, files the cache will not keep, and files of 4 MiB or more that the
    /// page cache holds whole, by itself, with no round trip per read; opens still go through
    /// the daemon (permissions, jobs, epochs, hits). Off as well with --fast-open and
    /// --read-delay.
    #[arg(long, help_heading = "Mount")]
    pub no_passthrough: bool,
    /// Serve the mount from the daemon alone. By default (as root) a small keeper process
    /// holds the mount's FUSE connection and starts a new daemon when the daemon dies (a
    /// crash, kill -9, the OOM killer): readers wait a moment instead of failing with
    /// "Transport endpoint is not connected". Mounts by other users never have a keeper.
    #[arg(long, help_heading = "Mount")]
    pub no_keeper: bool,
    /// How the kernel's requests reach the daemon. FUSE over io_uring (Linux 6.14+, as root)
    /// answers each request on the CPU that made it with one system call; /dev/fuse is the
    /// read loop of every kernel. off (the default: on hot small files it measured no
    /// faster, see docs/DESIGN.md): /dev/fuse only; auto: io_uring where a daemon's death
    /// cannot cost a read (without a keeper); on: under a keeper too, where a daemon that
    /// dies or hands over strands the reads its ring holds. As root, auto and on turn the
    /// fuse module's enable_uring on at mount (and say so in the log); stat transport says
    /// which is in use.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = IoUringArg::Off, help_heading = "Mount")]
    pub io_uring: IoUringArg,
    /// Mount even if MOUNTPOINT is not empty (its contents are hidden while mounted).
    #[arg(long, help_heading = "Mount")]
    pub allow_non_empty: bool,
    /// FUSE worker threads [default: one per CPU].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024), help_heading = "Mount")]
    pub threads: Option<u16>,
    /// How long the kernel caches names and attributes (e.g. 30s, 24h), and how long a
    /// directory unchanged since the scan is listed from memory. The dataset must not change
    /// while training; a changed file is still detected when it is opened.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_duration, help_heading = "Mount")]
    pub metadata_ttl: Duration,
    /// An object store's objects from FILE instead of a listing: KEY<TAB>SIZE<TAB>ETAG a
    /// line (and optionally <TAB>LAST_MODIFIED, RFC 3339), KEY the object's whole key, as
    /// 'coorfs manifest URL' writes it. The mount then lists nothing, at any size; the
    /// manifest is trusted for --metadata-ttl like a listing, and an object changed since is
    /// still detected at its first read (ESTALE, then the new version).
    #[arg(long, value_name = "FILE", help_heading = "Mount")]
    pub manifest: Option<PathBuf>,

    /// The cache budget. auto (the default) is elastic, like the page cache: the cache grows
    /// while the memory cgroup (a container's limit; without one, the host) has more free than
    /// a reserve kept for the job (a sixteenth of the limit, 32 MiB to 1 GiB; of the host's
    /// memory, 256 MiB to 4 GiB) and had for 10 s, and drops its newest files and gives their
    /// memory back when it has less or the kernel reports memory pressure. A SIZE (K/M/G/T suffixes) is a fixed
    /// budget, refused when it and --prefetch-memory do not fit in what the memory cgroup
    /// has left; 0 only with --policy none or a --cache-dir.
    #[arg(long, value_name = "SIZE|auto", value_parser = parse_size_or_auto, help_heading = "Cache")]
    pub cache_size: Option<SizeOrAuto>,
    /// What the cache keeps: minio admits files while there is room and never evicts (the
    /// best possible under random per-epoch order); lru evicts the least recently used (what
    /// the page cache does); none caches nothing and leaves caching to the kernel.
    #[arg(long, value_enum, default_value_t = PolicyKind::MinIo, help_heading = "Cache")]
    pub policy: PolicyKind,
    /// Files up to this size are cached whole; larger ones in blocks of this size, so that
    /// random access into big files caches only what is read.
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_block_size, help_heading = "Cache")]
    pub block_size: std::num::NonZeroU64,
    /// A second cache on local disk, below memory, that survives restarts: blocks read from
    /// the source are written to DIR while there is room (never evicted; first those the
    /// memory cache does not keep, so that the two hold more together), found again after
    /// an unmount, a kill or a reboot, and checked (source version, CRC32C) before they are
    /// served. DIR is created 0700 if missing; it must hold nothing but coorfs's files, not be
    /// writable by other users, nor lie inside the source or the mount point; one daemon uses
    /// it at a time (datasets mounted in turn over it keep apart).
    #[arg(long, value_name = "DIR", help_heading = "Cache")]
    pub cache_dir: Option<PathBuf>,
    /// The disk tier's budget (K/M/G/T suffixes) [default: half of the space free on DIR's
    /// filesystem at mount]. A directory filled under a larger budget drops the blocks past
    /// this one at mount (a warning in the log).
    #[arg(long, value_name = "SIZE", requires = "cache_dir", value_parser = parse_nonzero_size, help_heading = "Cache")]
    pub disk_cache_size: Option<u64>,

    /// How far the kernel reads ahead in a file a reader streams through (K/M/G suffixes):
    /// the mount's readahead window, which grows while the reader reads on and shrinks when
    /// it seeks. Files of 4 MiB and more that the cache does not hold whole (shards: tar,
    /// TFRecord, MDS) are read through the kernel's page cache, so that their small reads
    /// cost no round trip to the daemon, and their pages are dropped when the file is
    /// closed. Set as root at mount (the mount's read_ahead_kb); 0 keeps the kernel's 128K.
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = parse_readahead, help_heading = "Reading")]
    pub readahead: u64,
    /// An object store (s3://) object larger than a block is read in ranged GETs of SIZE
    /// (K/M/G suffixes; rounded down to whole blocks of --block-size): the first read of a
    /// part fetches the rest of it too, so a big object read once costs one GET per part,
    /// several in flight. Where one stream of the store brings more than a part in a
    /// request's wait (a server nearby), a GET spans several parts: up to what the readahead
    /// buffer holds (4 parts, within --prefetch-memory) while the cache has room for them,
    /// else what the buffer has room for. A reader that seeks (random records, a Parquet
    /// footer) reads just the blocks it asks for once the cache has no room for the rest. A
    /// directory source is read block by block.
    #[arg(long, value_name = "SIZE", default_value = "8M", value_parser = parse_part_size, help_heading = "Reading")]
    pub part_size: u64,

    /// Turn off prefetch: read only what jobs ask for.
    #[arg(long, help_heading = "Prefetch")]
    pub no_prefetch: bool,
    /// The staging area for prefetched files the cache does not keep, on top of the cache
    /// (K/M/G suffixes). On bandwidth-bound storage prefetch uses at most 2 MiB of it.
    /// [default: 256M; in a memory cgroup, a sixteenth of its limit, 8 MiB to 256 MiB]
    #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size, help_heading = "Prefetch")]
    pub prefetch_memory: Option<u64>,
    /// Prefetch reads in flight at most. coorfs learns from the reads how the storage
    /// answers: on latency-bound storage (network filesystems) it keeps N in flight; on
    /// bandwidth-bound storage one, only while no job waits for the storage.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024), help_heading = "Prefetch")]
    pub prefetch_depth: u16,
    /// Do not share between jobs: a block read for one job is not kept in the staging area
    /// for the other jobs that have still to read its file this epoch (each job then reads
    /// every file the cache does not hold from the source itself).
    #[arg(long, help_heading = "Jobs")]
    pub no_share: bool,

    /// What makes a job (one training run, with its own epochs): auto = the process group
    /// (a DataLoader's workers share their parent's), except that each program a
    /// script runs at once (the trials of a sweep) is a job with what it starts; pgid = the
    /// process group, always; sid = the session; uid = the user; none = one job for all.
    #[arg(long, value_enum, default_value_t = JobKeyArg::Auto, help_heading = "Jobs")]
    pub job_key: JobKeyArg,
    /// Forget a job after this long without reading (e.g. 10m).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration, help_heading = "Jobs")]
    pub job_idle_timeout: Duration,
    /// Memory for order hints (MOUNTPOINT/.coorfs-order), pending and accepted, of all users
    /// together; one user may hold half of it (K/M/G suffixes). A hint past it fails with
    /// EDQUOT.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_nonzero_size, help_heading = "Jobs")]
    pub hint_memory: u64,

    /// Join a cluster of mounts of one shared dataset, one per server: every member's address
    /// (HOST:PORT), this one's included, in the same order on every member. Each member
    /// caches the files it owns (rendezvous hashing of the path) and serves them to the others
    /// over HTTP, which ask it before they read the source. Needs --node-rank and
    /// --cluster-secret-file. For members that come and go, see --cluster.
    #[arg(
        long,
        value_name = "HOST:PORT,...",
        value_delimiter = ',',
        requires = "cluster_secret_file",
        conflicts_with = "cluster",
        help_heading = "Cluster"
    )]
    pub peers: Vec<String>,
    /// This member's place in --peers, from 0 [default: torchrun's GROUP_RANK, else NODE_RANK,
    /// from the environment].
    #[arg(
        long,
        value_name = "N",
        env = "COORFS_NODE_RANK",
        requires = "peers",
        help_heading = "Cluster"
    )]
    pub node_rank: Option<usize>,
    /// Join cluster NAME, whose members register in etcd (--etcd) and find each other there:
    /// a member joins when it mounts and leaves when it unmounts, or some seconds after its
    /// daemon dies. Needs --etcd, --peer-listen and --cluster-secret-file.
    #[arg(long, value_name = "NAME", requires_all = ["etcd", "peer_listen", "cluster_secret_file"], help_heading = "Cluster")]
    pub cluster: Option<String>,
    /// etcd's client URLs (e.g. http://10.0.0.5:2379), for --cluster.
    #[arg(
        long,
        value_name = "URL,...",
        value_delimiter = ',',
        requires = "cluster",
        help_heading = "Cluster"
    )]
    pub etcd: Vec<String>,
    /// The address the other members reach this one at, for --cluster [default:
    /// --peer-listen, unless that is every interface].
    #[arg(
        long,
        value_name = "HOST:PORT",
        requires = "cluster",
        help_heading = "Cluster"
    )]
    pub advertise: Option<String>,
    /// A file holding the cluster's secret (at least 16 bytes, readable by its owner alone):
    /// every request between members is signed with it, and so is every member's record in
    /// etcd.
    #[arg(
        long,
        value_name = "FILE",
        requires = "membership",
        help_heading = "Cluster"
    )]
    pub cluster_secret_file: Option<PathBuf>,
    /// Where this member's peer server listens [default with --peers: its own entry there].
    #[arg(
        long,
        value_name = "ADDR:PORT",
        requires = "membership",
        help_heading = "Cluster"
    )]
    pub peer_listen: Option<std::net::SocketAddr>,

    /// This member's TLS certificate chain (PEM): members serve each other over HTTPS. Needs
    /// --peer-tls-key and --peer-tls-ca; every member of the cluster must use TLS.
    #[arg(long, value_name = "FILE", requires_all = ["membership", "peer_tls_key", "peer_tls_ca"], help_heading = "Cluster")]
    pub peer_tls_cert: Option<PathBuf>,
    /// The private key of --peer-tls-cert (PEM).
    #[arg(
        long,
        value_name = "FILE",
        requires = "peer_tls_cert",
        help_heading = "Cluster"
    )]
    pub peer_tls_key: Option<PathBuf>,
    /// The certificate authorities (PEM) a member's certificate must come from; it must name
    /// the host of the member's address.
    #[arg(
        long,
        value_name = "FILE",
        requires = "peer_tls_cert",
        help_heading = "Cluster"
    )]
    pub peer_tls_ca: Option<PathBuf>,

    /// Serve every statistic as Prometheus metrics at http://ADDR:PORT/metrics (e.g.
    /// 127.0.0.1:9464; anyone who can reach the address can read them, as every user of the
    /// mount can read its statistics).
    #[arg(long, value_name = "ADDR:PORT", help_heading = "Statistics")]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// Add DURATION to every read of the source, to emulate network storage in benchmarks
    /// (e.g. --policy none --read-delay 2ms makes a slow mirror of a directory). Every read
    /// then goes through the daemon (no FUSE passthrough).
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = parse_duration, help_heading = "Testing")]
    pub read_delay: Duration,

    /// Append the daemon's log to FILE (without it, a background daemon logs nowhere).
    #[arg(long, value_name = "FILE", help_heading = "Logging")]
    pub log_file: Option<PathBuf>,
    /// Log filter: error, warn, info, debug, trace, or a tracing directive such as
    /// coorfs=debug [default: RUST_LOG, else info]. At debug, each FUSE request, the fetches
    /// done for it and their GETs log a line as they end, with their times.
    #[arg(long, value_name = "LEVEL", value_parser = parse_log_level, help_heading = "Logging")]
    pub log_level: Option<String>,
}

/// `coorfs manifest`.
#[derive(Debug, Args)]
pub struct ManifestArgs {
    /// The object store's prefix: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://CONTAINER/PREFIX.
    pub url: PathBuf,
}

/// `coorfs hint`.
#[derive(Debug, Args)]
pub struct HintArgs {
    /// The mount point of a coorfs mount.
    pub mountpoint: PathBuf,
    /// The order, one path per line; standard input if absent or -.
    pub file: Option<PathBuf>,
}

/// `coorfs umount`.
#[derive(Debug, Args)]
pub struct UmountArgs {
    /// The mount point of a coorfs mount.
    pub mountpoint: PathBuf,
    /// Detach a busy mount now; it goes away when its last user leaves (success: a line on
    /// stderr says the daemon stays until then).
    #[arg(long)]
    pub lazy: bool,
    /// How long to wait for the daemon to exit.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `coorfs completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `coorfs restart`.
#[derive(Debug, Args)]
pub struct RestartArgs {
    /// The mount point of a coorfs mount.
    pub mountpoint: PathBuf,
}

/// `coorfs stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The mount point of a coorfs mount.
    pub mountpoint: PathBuf,
    /// Print the JSON document (the user.coorfs.stats attribute) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECONDS until interrupted.
    #[arg(long, value_name = "SECONDS", value_parser = parse_watch)]
    pub watch: Option<f64>,
}

fn parse_watch(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v >= 0.1 && v.is_finite() => Ok(v),
        _ => Err(format!(
            "\"{text}\": expected a number of seconds, at least 0.1"
        )),
    }
}

/// `coorfs read`.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// The directory to read (recursively).
    pub dir: PathBuf,
    /// Worker processes.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub procs: u16,
    /// Epochs.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub epochs: u32,
    /// Seed of the shuffles (epoch E reads in the order of seed + E).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Read in sorted order instead of a random one.
    #[arg(long)]
    pub sorted: bool,
    /// Bytes per read call (K/M/G suffixes).
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_nonzero_size)]
    pub buffer: u64,
    /// Print one JSON object per epoch instead of a table row.
    #[arg(long)]
    pub json: bool,
    /// Before each epoch, hand its order to the coorfs mount at DIR (DIR/.coorfs-order), so
    /// that its prefetcher follows it exactly.
    #[arg(long)]
    pub hint: bool,
}

/// `coorfs run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Hint only DataLoaders whose files are below this coorfs mount point [default: any coorfs
    /// mount their files are on].
    #[arg(long, value_name = "MOUNTPOINT")]
    pub mount: Option<PathBuf>,
    /// Draw each epoch's order from NAME, like every job run with the same NAME (a coordinated
    /// group), instead of from the job's own random numbers.
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// The command and its arguments: everything after --, or from the first word that is not
    /// an option of coorfs run.
    #[arg(value_name = "CMD", required = true, num_args = 1.., trailing_var_arg = true)]
    pub command: Vec<std::ffi::OsString>,
}

impl RunArgs {
    /// What to run.
    pub fn into_config(self) -> crate::run::RunConfig {
        crate::run::RunConfig {
            mount: self.mount,
            group: self.group,
            command: self.command,
        }
    }
}

/// `--opens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OpensArg {
    Auto,
    Daemon,
    Kernel,
}

/// `--io-uring`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IoUringArg {
    Auto,
    On,
    Off,
}

/// `--job-key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum JobKeyArg {
    Auto,
    Pgid,
    Sid,
    Uid,
    None,
}

/// `coorfs analyze`.
#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// The dataset directory (what coorfs mount would serve).
    pub dataset: PathBuf,

    /// The memory to analyse, as coorfs cache or page cache, in bytes (K/M/G/T suffixes), at
    /// most the dataset's size [default: the --mount's cache size, else what coorfs mount's
    /// elastic budget would start at here: what the memory cgroup (or the host) has free
    /// beyond the staging area and the reserve it keeps for the job].
    #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size, help_heading = "Prediction")]
    pub cache_size: Option<u64>,
    /// Also simulate every cache size from 0 to 100% of the dataset, in steps of 5%.
    #[arg(long, help_heading = "Prediction")]
    pub sweep: bool,
    /// Samples (files) per second the GPUs consume: gives the verdict on fetch stalls and the
    /// smallest cache without one.
    #[arg(long, value_name = "SAMPLES_PER_SEC", value_parser = parse_rate, help_heading = "Prediction")]
    pub rate: Option<f64>,
    /// Epochs to simulate (epoch 1 always reads everything from storage).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..=1000), help_heading = "Prediction")]
    pub epochs: u32,
    /// Bytes (K/M/G/T suffixes) of the prefetcher's staging buffer, beyond the cache, for the
    /// "minio + prefetch" column.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = crate::units::parse_size, help_heading = "Prediction")]
    pub staging: u64,

    /// Time for all read measurements together, split evenly across the queue depths (1, 4,
    /// 16, 64) of the storage and of the --mount's hit path (e.g. 10s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = parse_nonzero_duration, help_heading = "Measurement")]
    pub time: Duration,
    /// Seed of the sampled files and of the simulated orders (epoch E in the order of
    /// coorfs read --seed N).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        help_heading = "Measurement"
    )]
    pub seed: u64,
    /// A live coorfs mount of DATASET: measure reads of its cached files, and show its last
    /// epochs beside the prediction for its cache size.
    #[arg(long, value_name = "MOUNTPOINT", help_heading = "Measurement")]
    pub mount: Option<PathBuf>,

    /// Write the whole report as JSON to FILE ('-': to stdout, instead of the text).
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub json: Option<PathBuf>,
    /// Draw hit rate and predicted epoch time against cache size (0-100% of the dataset) as
    /// SVG to FILE.
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub plot: Option<PathBuf>,
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!(
            "\"{text}\": expected samples per second, more than 0"
        )),
    }
}

fn parse_nonzero_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err(format!("\"{text}\": must be more than 0, e.g. 10s")),
        d => Ok(d),
    }
}

impl AnalyzeArgs {
    /// The analysis's configuration.
    pub fn into_config(self) -> crate::analyze::AnalyzeConfig {
        crate::analyze::AnalyzeConfig {
            dataset: self.dataset,
            cache_size: self.cache_size,
            sweep: self.sweep,
            rate: self.rate,
            epochs: self.epochs,
            staging: self.staging,
            time: self.time,
            seed: self.seed,
            mount: self.mount,
            json: self.json,
            plot: self.plot,
        }
    }
}

/// `--policy` takes the cache's own kinds, by [`PolicyKind::name`]; the impl is here so that
/// clap stays in this module.
impl clap::ValueEnum for PolicyKind {
    fn value_variants<'a>() -> &'a [Self] {
        &PolicyKind::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

fn parse_block_size(text: &str) -> Result<std::num::NonZeroU64, String> {
    let size = crate::units::parse_size(text)?;
    // A page at least (smaller blocks only add overhead); at most what one FUSE reply and
    // one source read sensibly move.
    match std::num::NonZeroU64::new(size) {
        Some(size) if (4096..=(256 << 20)).contains(&size.get()) => Ok(size),
        _ => Err(format!("\"{text}\": must be between 4K and 256M")),
    }
}

fn parse_readahead(text: &str) -> Result<u64, String> {
    let size = crate::units::parse_size(text)?;
    // The kernel takes read_ahead_kb in KiB; beyond 1 GiB a reader's window is memory that
    // no stream needs.
    if size <= (1 << 30) {
        Ok(size)
    } else {
        Err(format!("\"{text}\": must be at most 1G"))
    }
}

fn parse_part_size(text: &str) -> Result<u64, String> {
    let size = crate::units::parse_size(text)?;
    // One GET's body is held in memory until its blocks are handed out.
    if ((1 << 20)..=(1 << 30)).contains(&size) {
        Ok(size)
    } else {
        Err(format!("\"{text}\": must be between 1M and 1G"))
    }
}

/// Half of the space free for the daemon on the filesystem that holds (or will hold) `dir`.
fn half_the_free_space(dir: &std::path::Path) -> std::io::Result<u64> {
    let mut at = std::path::absolute(dir)?;
    while !at.exists() && at.pop() {}
    let st = rustix::fs::statvfs(&at)?;
    Ok(st.f_bavail * st.f_frsize / 2)
}

/// A size, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeOrAuto {
    Auto,
    Bytes(u64),
}

fn parse_size_or_auto(text: &str) -> Result<SizeOrAuto, String> {
    if text.trim().eq_ignore_ascii_case("auto") {
        return Ok(SizeOrAuto::Auto);
    }
    crate::units::parse_size(text)
        .map(SizeOrAuto::Bytes)
        .map_err(|e| format!("{e}, or auto"))
}

fn parse_nonzero_size(text: &str) -> Result<u64, String> {
    match crate::units::parse_size(text)? {
        0 => Err(format!("\"{text}\": must be more than 0")),
        n => Ok(n),
    }
}

fn parse_log_level(text: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(text)
        .map(|_| text.to_string())
        .map_err(|e| format!("\"{text}\": {e}"))
}

impl ReadArgs {
    /// The read plan.
    pub fn plan(&self) -> crate::reader::ReadPlan {
        crate::reader::ReadPlan {
            dir: self.dir.clone(),
            procs: self.procs as usize,
            epochs: self.epochs as usize,
            seed: self.seed,
            sorted: self.sorted,
            buffer: self.buffer as usize,
            hint: self.hint,
        }
    }
}

impl MountArgs {
    /// The mount's configuration and how its daemon runs.
    pub fn into_config(self) -> Result<(MountConfig, DaemonOptions), MountError> {
        let mut config = MountConfig::new(self.source, self.mountpoint);
        if let Some(threads) = self.threads {
            config.threads = threads as usize;
        }
        config.metadata_ttl = self.metadata_ttl;
        // Absolute: the daemon's working directory is /.
        config.manifest = (self.manifest.as_deref())
            .map(std::path::absolute)
            .transpose()
            .map_err(|e| MountError::BadUrl(format!("--manifest: {e}")))?;
        config.allow_other = self.allow_other;
        config.acl = self.acl;
        config.opens = match (self.fast_open, self.opens) {
            (true, _) | (_, OpensArg::Kernel) => crate::config::Opens::Kernel,
            (_, OpensArg::Daemon) => crate::config::Opens::Daemon,
            (_, OpensArg::Auto) => crate::config::Opens::Auto,
        };
        config.passthrough = !self.no_passthrough;
        config.keeper = !self.no_keeper;
        config.io_uring = match self.io_uring {
            IoUringArg::Auto => crate::config::IoUring::Auto,
            IoUringArg::On => crate::config::IoUring::On,
            IoUringArg::Off => crate::config::IoUring::Off,
        };
        config.allow_non_empty = self.allow_non_empty;
        if let Some(SizeOrAuto::Bytes(size)) = self.cache_size {
            config.cache.capacity = size;
            config.cache_size_given = true;
        }
        config.cache.policy = self.policy;
        config.cache.block_size = self.block_size;
        config.readahead = self.readahead;
        config.part_size = self.part_size;
        config.prefetch = crate::prefetch::PrefetchConfig {
            enabled: !self.no_prefetch,
            memory: self.prefetch_memory.unwrap_or(config.prefetch.memory),
            depth: self.prefetch_depth as usize,
            share: !self.no_share,
        };
        config.prefetch_memory_given = self.prefetch_memory.is_some();
        config.jobs = crate::jobs::JobConfig {
            key: match self.job_key {
                JobKeyArg::Auto => crate::jobs::JobKeyKind::Auto,
                JobKeyArg::Pgid => crate::jobs::JobKeyKind::Pgid,
                JobKeyArg::Sid => crate::jobs::JobKeyKind::Sid,
                JobKeyArg::Uid => crate::jobs::JobKeyKind::Uid,
                JobKeyArg::None => crate::jobs::JobKeyKind::None,
            },
            idle_timeout: self.job_idle_timeout,
        };
        config.hint_limits = crate::jobs::HintLimits::of_total(self.hint_memory);
        config.read_delay = self.read_delay;
        config.metrics_addr = self.metrics_addr;
        if let Some(dir) = self.cache_dir {
            let size = match self.disk_cache_size {
                Some(size) => size,
                None => half_the_free_space(&dir)
                    .map_err(|e| crate::tier::disk::DiskError::Io(dir.clone(), e))?,
            };
            config.disk = Some(crate::tier::disk::DiskConfig { dir, size });
        }
        config.cluster = match (self.cluster, &self.cluster_secret_file) {
            (Some(name), Some(secret)) => Some(crate::cluster::ClusterConfig::in_etcd(
                name,
                self.etcd,
                self.peer_listen
                    .expect("clap requires --peer-listen with --cluster"),
                self.advertise,
                secret,
            )?),
            (None, Some(secret)) if !self.peers.is_empty() => {
                let rank = match self.node_rank {
                    Some(rank) => rank,
                    None => crate::cluster::rank_from_environment()?,
                };
                Some(crate::cluster::ClusterConfig::new(
                    self.peers,
                    rank,
                    secret,
                    self.peer_listen,
                )?)
            }
            _ => None,
        };
        if let (Some(cluster), Some(cert), Some(key), Some(ca)) = (
            config.cluster.as_mut(),
            &self.peer_tls_cert,
            &self.peer_tls_key,
            &self.peer_tls_ca,
        ) {
            cluster.tls = Some(
                crate::cluster::tls::PeerTls::load(cert, key, ca)
                    .map_err(crate::cluster::ClusterError::from)?,
            );
        }
        let options = DaemonOptions {
            foreground: self.foreground,
            log_file: self.log_file,
            log_level: self.log_level,
        };
        Ok((config, options))
    }
}

/// Why a command failed: the line the user reads (after "coorfs: ") and the exit status.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The command line itself: clap's first line.
    #[error("{0} (see coorfs --help)")]
    Usage(String),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Read(#[from] ReadError),
    /// `coorfs read` read every epoch, but some files failed (each is counted in its report).
    #[error("some files could not be read")]
    FilesUnreadable,
    #[error(transparent)]
    Stats(#[from] StatsError),
    #[error(transparent)]
    Analyze(#[from] AnalyzeError),
    #[error(transparent)]
    Run(#[from] RunError),
    /// `coorfs hint`: the order could not be read.
    #[error("{0}: {1}")]
    HintInput(PathBuf, std::io::Error),
}

impl CommandError {
    /// The exit status of bad input: a command line, path, value or mount that cannot work.
    pub const BAD_INPUT: u8 = 2;
    /// The exit status of a failure of the system: the kernel, a daemon or a file refused.
    pub const FAILED: u8 = 1;
    /// `coorfs run`'s CMD cannot be found, or found and not executed: a shell's statuses.
    pub const NOT_FOUND: u8 = 127;
    pub const NOT_EXECUTABLE: u8 = 126;

    /// The process exit status for this error ([`Self::BAD_INPUT`] or [`Self::FAILED`]; for a
    /// command `coorfs run` cannot start, [`Self::NOT_FOUND`] or [`Self::NOT_EXECUTABLE`]).
    pub fn exit_code(&self) -> u8 {
        let bad_input = match self {
            CommandError::Usage(_) => true,
            CommandError::Mount(e) => match e {
                MountError::Mount(..)
                | MountError::Unmount(..)
                | MountError::Handover(..)
                | MountError::DaemonLingers { .. }
                | MountError::FuseUnusable(_) => false,
                MountError::SourceMissing(_)
                | MountError::SourceNotDir(_)
                | MountError::SourceUnreadable(..)
                | MountError::BadUrl(_)
                | MountError::MountpointMissing(_)
                | MountError::MountpointNotDir(_)
                | MountError::MountpointUnusable(..)
                | MountError::MountpointNotEmpty(_)
                | MountError::MountpointInsideSource { .. }
                | MountError::SourceInsideMountpoint { .. }
                | MountError::AlreadyMounted(_)
                | MountError::MountInProgress(_)
                | MountError::SourceIsCoorfs(_)
                | MountError::SourceInsideCoorfs { .. }
                | MountError::DeadMount(_)
                | MountError::NoFuseDevice
                | MountError::FuseDenied
                | MountError::CacheTooLarge { .. }
                | MountError::CacheSizeZero
                | MountError::Cluster(_)
                | MountError::MetricsListen(..)
                | MountError::Disk(_)
                | MountError::DiskInside(_)
                | MountError::DiskWithoutPolicy
                | MountError::Memory(_)
                | MountError::LogFile(..)
                | MountError::BadEnv(_)
                | MountError::NotMounted(_)
                | MountError::NoKeeper(_)
                | MountError::Busy(_) => true,
            },
            // A directory that cannot be listed or holds nothing, an order the mount refuses;
            // a worker that cannot be started is the system's.
            CommandError::Read(e) => match e {
                ReadError::List(..) | ReadError::Empty(_) | ReadError::Hint(..) => true,
                ReadError::Worker(_) => false,
            },
            CommandError::FilesUnreadable => false,
            CommandError::HintInput(..) => true,
            // A path that is no coorfs mount or cannot be read; a daemon that answers garbage
            // is the system's.
            CommandError::Stats(e) => match e {
                StatsError::NotMounted(_) | StatsError::Read(..) => true,
                StatsError::Garbled(..) => false,
            },
            CommandError::Analyze(e) => match e {
                AnalyzeError::Missing(_)
                | AnalyzeError::NotADirectory(_)
                | AnalyzeError::Unreadable(..)
                | AnalyzeError::Empty(_)
                | AnalyzeError::NoData { .. }
                | AnalyzeError::PseudoFilesystem { .. }
                | AnalyzeError::CacheTooLarge { .. }
                | AnalyzeError::Output { .. }
                | AnalyzeError::Mount(_)
                | AnalyzeError::OtherDataset { .. }
                | AnalyzeError::NothingReadable { .. } => true,
                AnalyzeError::Write(..) | AnalyzeError::Plot(..) => false,
            },
            CommandError::Run(e) => match e {
                RunError::NotFound(_) => return Self::NOT_FOUND,
                RunError::NotExecutable(..) => return Self::NOT_EXECUTABLE,
                RunError::NotAMount(_) | RunError::BadGroup(_) => true,
                RunError::Wait(..) => false,
            },
        };
        if bad_input {
            Self::BAD_INPUT
        } else {
            Self::FAILED
        }
    }
}
