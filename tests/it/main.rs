//! The integration tests: one binary, a module per area, sharing `common/`. They mount for
//! real (root and /dev/fuse are required; CI runs as root). One area's tests:
//! `scripts/test.sh -- cache::`; one test: `scripts/test.sh -- cache::name_of_the_test`.

mod common;

mod analyze;
mod cache;
mod cluster;
mod cluster_etcd;
mod core;
mod disk;
mod docs;
mod elastic;
mod fastopen;
mod frameworks;
mod helper;
mod hints;
mod install;
mod io_uring;
mod jobs;
mod keeper;
mod layout;
mod lifecycle;
mod manpage;
mod metrics;
mod mirror;
mod passthrough;
mod prefetch;
mod python;
mod readonly;
mod run;
mod s3;
mod security;
mod shards;
mod sharing;
mod stalls;
mod stores;
