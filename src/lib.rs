//! coorfs: a read-only FUSE view of a dataset directory with training-aware caching.
//!
//! Layers, from the kernel down:
//! - `fuse`: the only module that knows fuser; turns requests into calls on the core.
//! - `fs`: the filesystem core ([`fs::DatasetFs`]), drivable by tests without a mount.
//! - `namespace`: node ids for the source tree.
//! - `cache`: the block cache (policies, MinIO's arena, merged in-flight fetches).
//! - `fetch`: the one path by which file data is read from the source.
//! - `source`: the dataset directory behind a trait, with a fault-injecting wrapper.
//! - `epoch`, `stats`: epoch tracking (pure) and the statistics every view renders.
//!
//! Around them: `cli` (clap, at the edge), `config` (plain structs), `budget` (how much
//! memory the cache may take: the memory cgroup), `daemon` (mount life cycle), `manpage`
//! (generated from the CLI), `analyze` (`coorfs analyze`: measure the storage, simulate the
//! cache, predict data stalls), `run` (`coorfs run`: a training command whose DataLoaders hand
//! the mount their order, through the Python hook of `python/coorfs/run.py`).

pub mod analyze;
pub mod budget;
pub mod cache;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod epoch;
pub mod fetch;
pub mod fs;
pub mod fuse;
pub mod jobs;
pub mod manpage;
pub mod mountinfo;
pub mod namespace;
pub mod prefetch;
pub mod reader;
pub mod run;
pub mod source;
pub mod stats;
pub mod statsview;
pub mod units;
