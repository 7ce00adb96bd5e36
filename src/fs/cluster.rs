//! The mount as a member of a cluster: its peer server, its registration in etcd, and what
//! `coorfs stats` says of the members ([`crate::cluster`]).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::DatasetFs;
use crate::block::Block;
use crate::cache::BlockKey;
use crate::cluster::ClusterError;
use crate::cluster::etcd;
use crate::cluster::members::View;
use crate::cluster::server::{PeerServer, ServedBlocks};
use crate::jobs::JobKey;
use crate::namespace::Namespace;
use crate::tier::{Tiers, Want, Why};
use crate::units::format_size;

/// The blocks the peer server serves: the memory cache's, else one fetch (merged with any
/// fetch of the block in flight, [`crate::tier::fetch`]) from the tiers behind the fetcher.
struct TierBlocks(Tiers);

impl ServedBlocks for TierBlocks {
    fn block(&self, rel: &Path, key: BlockKey) -> std::io::Result<Arc<Block>> {
        let memory = &self.0.memory;
        if let Some(block) = memory.copy_of(&key) {
            return Ok(block);
        }
        let want = Want {
            key,
            rel,
            job: JobKey::All,
            epoch: 0,
            why: Why::Peer,
            stream: true,
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.0.fetcher.fetch(
            Arc::from(rel),
            &want,
            &|| memory.copy_of(&key),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
            Box::new(|_| {}),
        );
        match rx.recv() {
            Ok(Ok(block)) => Ok(block),
            // The asker logs the cause with the refusal (its body).
            Ok(Err(e)) => Err(std::io::Error::new(
                std::io::Error::from_raw_os_error(e.errno()).kind(),
                e,
            )),
            Err(_) => Err(std::io::Error::other("the fetch ended")),
        }
    }
}

/// The mount's part in a cluster: the cluster it is a member of (none outside one), its
/// registration in etcd while it lasts, and the members' shares for the stats.
#[derive(Default)]
pub(super) struct Membership {
    pub(super) config: Option<crate::cluster::ClusterConfig>,
    registration: Mutex<Option<etcd::Registration>>,
    shares: Mutex<Shares>,
}

impl Membership {
    pub(super) fn new(config: Option<crate::cluster::ClusterConfig>) -> Self {
        Membership {
            config,
            ..Default::default()
        }
    }
}

/// The members' shares of the files seen so far, as last counted.
#[derive(Debug, Default)]
struct Shares {
    /// The membership change and file count they were counted at.
    at: Option<(u64, usize)>,
    /// Per member, in the view's order: files and bytes owned.
    owned: Vec<(u64, u64)>,
}

/// Files and bytes each member of `view` owns, of the files of `ns`.
fn count_shares(ns: &Namespace, view: &View) -> Vec<(u64, u64)> {
    let mut owned = vec![(0u64, 0u64); view.names.len()];
    for f in ns.files_in_inode_order() {
        let Some(node) = ns.file_node(f) else {
            continue;
        };
        let (Some(path), Some(info)) = (ns.path(node), ns.info(node)) else {
            continue;
        };
        let share = &mut owned[view.owner(path.as_os_str().as_bytes())];
        share.0 += 1;
        share.1 += info.version.size;
    }
    owned
}

impl DatasetFs {
    /// Starts serving the files this member of a cluster owns to the others (see
    /// [`crate::cluster::server`]) and, with etcd, registers it; nothing outside a cluster.
    pub fn start_cluster(&self) -> Result<(), ClusterError> {
        let Some(c) = &self.membership.config else {
            return Ok(());
        };
        let fail = |e| ClusterError::Listen(c.listen, e);
        let listener = std::net::TcpListener::bind(c.listen).map_err(fail)?;
        let server = Arc::new(PeerServer::new(
            c.membership.clone(),
            self.tree.source.clone(),
            self.reads.tiers.memory.blocks(),
            Box::new(TierBlocks(self.reads.tiers.clone())),
            c.secret.clone(),
            self.reads.ledger.stats().clone(),
        ));
        let tls = c.tls.as_ref().map(|t| t.server.clone());
        server
            .serve(listener, self._io.handle(), tls)
            .map_err(fail)?;
        let view = c.membership.view();
        tracing::info!(
            "cluster member {}: serving peers on {}",
            view.my_name(),
            c.listen
        );
        if let Some(config) = &c.etcd {
            let record = etcd::Record {
                addr: view.my_name().to_string(),
                cache_bytes: self.reads.tiers.memory.capacity(),
                host: hostname(),
                pid: std::process::id(),
            };
            let registration = etcd::join(
                config,
                record,
                &c.secret,
                c.membership.clone(),
                self._io.handle(),
            )?;
            let view = c.membership.view();
            tracing::info!(
                "joined cluster {} in etcd ({}): {} members: {}",
                config.cluster,
                config.endpoints.join(","),
                view.names.len(),
                view.names.join(" ")
            );
            *self.membership.registration.lock() = Some(registration);
        }
        Ok(())
    }

    /// Leaves the cluster in etcd at once (at unmount), rather than when the lease runs out.
    pub fn leave_cluster(&self) {
        if let Some(r) = self.membership.registration.lock().take() {
            r.leave();
        }
    }

    /// What the stats say of the cluster: this member's place, and every member's share of
    /// the files seen so far (and its cache budget, where etcd tells it).
    pub(super) fn cluster_info(&self) -> Vec<(&'static str, String)> {
        let Some(c) = &self.membership.config else {
            return Vec::new();
        };
        let view = c.membership.view();
        let at = (c.membership.changes(), self.tree.ns.file_count());
        let owned = {
            let mut shares = self.membership.shares.lock();
            if shares.at != Some(at) {
                shares.owned = count_shares(&self.tree.ns, &view);
                shares.at = Some(at);
            }
            shares.owned.clone()
        };
        let total_bytes: u64 = owned.iter().map(|o| o.1).sum();
        let registration = self.membership.registration.lock();
        let members: Vec<String> = view
            .names
            .iter()
            .zip(&owned)
            .map(|(name, (files, bytes))| {
                let pct = if total_bytes == 0 {
                    0.0
                } else {
                    100.0 * *bytes as f64 / total_bytes as f64
                };
                let budget = registration
                    .as_ref()
                    .and_then(|r| r.record(name))
                    .map(|r| format!(", cache {}", format_size(r.cache_bytes)))
                    .unwrap_or_default();
                format!(
                    "{name} owns {pct:.1}% ({files} files, {}{budget})",
                    format_size(*bytes)
                )
            })
            .collect();
        let how = match &c.etcd {
            Some(e) => format!("cluster {} in etcd", e.cluster),
            None => "--peers".to_string(),
        };
        vec![
            (
                "cluster",
                format!(
                    "member {} of {} ({}), {how}",
                    view.me,
                    view.names.len(),
                    view.my_name()
                ),
            ),
            ("members", members.join("; ")),
        ]
    }
}

/// This machine's name, for a member's record.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}
