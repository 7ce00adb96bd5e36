//! coorfs: a read-only FUSE view of a dataset directory with training-aware caching.
//!
//! Layers, from the kernel down:
//! - `fuse`: the only module that knows fuser; turns requests into calls on the core.
//! - `fs`: the filesystem core ([`fs::DatasetFs`]), drivable by tests without a mount.
//! - `namespace`: node ids for the source tree.
//! - `source`: the dataset directory behind a trait, with a fault-injecting wrapper.
//!
//! Around them: `cli` (clap, at the edge), `config` (plain structs), `daemon` (mount life
//! cycle), `manpage` (generated from the CLI).

pub mod cli;
pub mod config;
pub mod daemon;
pub mod fs;
pub mod fuse;
pub mod manpage;
pub mod mountinfo;
pub mod namespace;
pub mod reader;
pub mod source;
pub mod units;
