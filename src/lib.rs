//! coorfs: a read-only FUSE view of a dataset directory with training-aware caching.
//!
//! Layers, from the kernel down (each uses only those below it):
//! - `fuse`: the only module that knows fuser; turns requests into calls on the core.
//! - `fs`: the filesystem core ([`fs::DatasetFs`]), a coordinator drivable by tests without
//!   a mount: the tree, the read path, how opens are answered (by the daemon, or by the
//!   kernel, which tells it), the handle table, the order file, the mount as a cluster member.
//! - `prefetch`: the [`prefetch::Prefetcher`]: what each job reads next, how deep (the pacer).
//! - `tier`: where a block comes from, nearest first, behind one trait ([`tier::Tier`]):
//!   memory (the cache), staging, recent blocks, then one fetch per block from the local
//!   disk, a peer or the source (an object store's in parts, the rest read ahead).
//! - `cluster`: many servers, one cache: who owns a file, who the members are, the peer server.
//! - `cache`: the block cache: pure policies (MinIO, LRU) and the stores they need.
//! - `jobs`: who reads, and the ledger where every access and byte is counted.
//! - `stats`: the statistics every view renders (`coorfs stats`, the Prometheus metrics).
//! - `source`: the dataset behind a trait (a directory, or a prefix of an S3, GCS or Azure
//!   bucket), with a fault-injecting wrapper.
//! - `block`, `namespace`, `epoch`: block buffers, node ids for the source tree, epoch
//!   tracking (pure).
//!
//! Around them: `cli` (clap, at the edge), `helper` (mount(8)'s command line as `coorfs
//! mount`'s), `config` (plain structs), `budget` (how much memory the cache may take: the
//! memory cgroup) and `elastic` (the budget that follows it), `daemon` (mount life cycle),
//! `mountinfo` (what `/proc/self/mountinfo` says of a path), `keeper` (the process that holds
//! a mount's connection and replaces a daemon that dies) and `handover` (what a successor
//! daemon takes over), `manpage` (generated from the CLI), `reader` (`coorfs read`),
//! `analyze` (`coorfs analyze`: measure the storage, simulate the cache, predict data stalls),
//! `run` (`coorfs run`: a training command whose DataLoaders hand the mount their order,
//! through the Python hook of `python/coorfs/run.py`), `units` (sizes and durations).

pub mod analyze;
pub mod block;
pub mod budget;
pub mod cache;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod elastic;
pub mod epoch;
pub mod fs;
pub mod fuse;
pub mod handover;
pub mod helper;
pub mod jobs;
pub mod keeper;
pub mod manpage;
pub mod mountinfo;
pub mod namespace;
pub mod prefetch;
pub mod reader;
pub mod run;
pub mod source;
pub mod stats;
pub mod tier;
pub mod units;
