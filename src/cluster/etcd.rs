//! Membership in etcd (`--cluster NAME --etcd URL`): a member registers itself under a lease
//! and watches the others come and go.
//!
//! Each member puts one key, `/coorfs/clusters/NAME/members/ADDR` (ADDR its advertised
//! `host:port`), under a lease of [`LEASE_TTL`] that it keeps alive. The value is a record
//! (its address, cache budget, host and pid) signed with the cluster's secret, so that a
//! writer of etcd who lacks the secret cannot add a member that peers would route reads to:
//! a record whose signature does not check is ignored, with a warning. Every member watches
//! the prefix and, at every change (and after a lease's life without one), reads the whole
//! member set again and hands it to its [`Membership`]. A member that is killed stops
//! renewing its lease and leaves the set when the lease runs out (within [`LEASE_TTL`]); one
//! that unmounts revokes its lease and leaves at once. In between, reads of its files fail over to the source (the peer tier's backoff).
//!
//! A key is taken only if nobody holds it (an etcd transaction on its create revision): a
//! second daemon with the same address is refused, and a member restarted after `kill -9`
//! waits for its former lease to run out. If etcd becomes unreachable, a member keeps the
//! last set it saw and tries again every second; if its lease ran out meanwhile it registers
//! afresh.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use serde::{Deserialize, Serialize};

use super::ClusterError;
use super::auth::Secret;
use super::members::Membership;

/// How long a member stays in the set after its daemon stops renewing its lease.
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// How long a call to etcd may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// The wait between attempts when etcd fails.
const RETRY: Duration = Duration::from_secs(1);

/// Where a member registers.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// etcd's client URLs (`--etcd`).
    pub endpoints: Vec<String>,
    /// The cluster's name (`--cluster`).
    pub cluster: String,
}

impl EtcdConfig {
    /// The prefix of the cluster's member keys.
    pub fn prefix(&self) -> String {
        format!("/coorfs/clusters/{}/members/", self.cluster)
    }
}

/// What a member says of itself in etcd.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// Its advertised address, where peers reach its server.
    pub addr: String,
    /// Its cache budget in bytes.
    pub cache_bytes: u64,
    pub host: String,
    pub pid: u32,
}

/// The value of a member's key: the record's JSON, signed.
#[derive(Serialize, Deserialize)]
struct Signed {
    record: String,
    sig: String,
}

/// `record`, signed with `secret` for cluster `cluster`.
fn seal(secret: &Secret, cluster: &str, record: &Record) -> Vec<u8> {
    let json = serde_json::to_string(record).expect("a record serializes");
    let sig = secret.sign_record(&format!("{cluster}\n{json}"));
    serde_json::to_vec(&Signed { record: json, sig }).expect("a signed record serializes")
}

/// The record in `value`, if it is signed with `secret` for `cluster` and names `addr`.
fn open(secret: &Secret, cluster: &str, addr: &str, value: &[u8]) -> Option<Record> {
    let signed: Signed = serde_json::from_slice(value).ok()?;
    if !secret.verify_record(&format!("{cluster}\n{}", signed.record), &signed.sig) {
        return None;
    }
    let record: Record = serde_json::from_str(&signed.record).ok()?;
    (record.addr == addr).then_some(record)
}

/// A member's registration: dropping it (or [`Registration::leave`]) ends it.
pub struct Registration {
    client: Client,
    lease: Arc<std::sync::atomic::AtomicI64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    rt: tokio::runtime::Handle,
    /// The latest records of the members, by address.
    records: Arc<parking_lot::Mutex<std::collections::BTreeMap<String, Record>>>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").finish_non_exhaustive()
    }
}

/// Everything the loops share.
#[derive(Clone)]
struct Member {
    config: EtcdConfig,
    record: Record,
    secret: Secret,
    membership: Arc<Membership>,
    lease: Arc<std::sync::atomic::AtomicI64>,
    records: Arc<parking_lot::Mutex<std::collections::BTreeMap<String, Record>>>,
}

/// An etcd error, for a log line or the mount's error.
fn why(e: etcd_client::Error) -> String {
    e.to_string()
}

impl Member {
    fn key(&self) -> String {
        format!("{}{}", self.config.prefix(), self.record.addr)
    }

    /// Takes this member's key under a new lease; waits up to twice [`LEASE_TTL`] for a
    /// former holder's lease to run out.
    async fn register(&self, client: &mut Client) -> Result<(), String> {
        let lease = client
            .lease_grant(LEASE_TTL.as_secs() as i64, None)
            .await
            .map_err(why)?
            .id();
        let key = self.key();
        let value = seal(&self.secret, &self.config.cluster, &self.record);
        let give_up = tokio::time::Instant::now() + 2 * LEASE_TTL;
        loop {
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.clone(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            if client.txn(txn).await.map_err(why)?.succeeded() {
                break;
            }
            if tokio::time::Instant::now() >= give_up {
                let _ = client.lease_revoke(lease).await;
                return Err(format!(
                    "another member holds {} in cluster {} (is a daemon with this address running?)",
                    self.record.addr, self.config.cluster
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.lease
            .store(lease, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Reads the member set and hands it on; returns the revision it read at.
    async fn refresh(&self, client: &mut Client) -> Result<i64, String> {
        let prefix = self.config.prefix();
        let got = client
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(why)?;
        let mut records = std::collections::BTreeMap::new();
        for kv in got.kvs() {
            let Some(addr) = kv.key_str().ok().and_then(|k| k.strip_prefix(&prefix)) else {
                continue;
            };
            match open(&self.secret, &self.config.cluster, addr, kv.value()) {
                Some(record) => {
                    records.insert(addr.to_string(), record);
                }
                None => tracing::warn!(
                    "etcd: ignoring member {addr} of cluster {}: its record is not signed with this cluster's secret",
                    self.config.cluster
                ),
            }
        }
        let names: Vec<String> = records.keys().cloned().collect();
        *self.records.lock() = records;
        if self.membership.set(names) {
            let view = self.membership.view();
            tracing::info!(
                "cluster {}: {} members: {}",
                self.config.cluster,
                view.names.len(),
                view.names.join(" ")
            );
        }
        Ok(got.header().map_or(0, |h| h.revision()))
    }

    /// Keeps the lease alive; registers afresh if it ran out.
    async fn keep_alive(self, mut client: Client) {
        let mut failures = 0;
        loop {
            if let Err(e) = self.renew(&mut client, &mut failures).await {
                failed("keeping this member's lease", &e, &mut failures);
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Renews the lease every third of its life, until a call fails or the lease is gone
    /// (then registers again).
    async fn renew(&self, client: &mut Client, failures: &mut u32) -> Result<(), String> {
        let lease = self.lease.load(std::sync::atomic::Ordering::Relaxed);
        let (mut keeper, mut replies) = client.lease_keep_alive(lease).await.map_err(why)?;
        loop {
            keeper.keep_alive().await.map_err(why)?;
            let reply = tokio::time::timeout(CALL_TIMEOUT, replies.message())
                .await
                .map_err(|_| "no reply".to_string())?
                .map_err(why)?;
            recovered(failures);
            if reply.is_none_or(|r| r.ttl() <= 0) {
                tracing::warn!(
                    "etcd: this member's lease ran out; registering {} again",
                    self.record.addr
                );
                self.register(client).await?;
                return Ok(());
            }
            tokio::time::sleep(LEASE_TTL / 3).await;
        }
    }

    /// Follows the member set.
    async fn watch(self, mut client: Client) {
        let mut failures = 0;
        loop {
            if let Err(e) = self.follow(&mut client, &mut failures).await {
                failed("watching the members", &e, &mut failures);
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    async fn follow(&self, client: &mut Client, failures: &mut u32) -> Result<(), String> {
        let revision = self.refresh(client).await?;
        recovered(failures);
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let mut stream = client
            .watch(self.config.prefix(), Some(options))
            .await
            .map_err(why)?;
        loop {
            // A watch that stays quiet for a lease's life is checked by reading the set
            // again: a member's departure then shows within two lease lives even if the
            // watch missed it (one CI run saw a dead member outlive its lease by 20 s).
            let Ok(message) = tokio::time::timeout(LEASE_TTL, stream.message()).await else {
                self.refresh(client).await?;
                continue;
            };
            let Some(reply) = message.map_err(why)? else {
                return Err("the watch ended".into());
            };
            if reply.canceled() {
                return Err("the watch was cancelled".into());
            }
            if !reply.events().is_empty() {
                self.refresh(client).await?;
            }
        }
    }
}

/// One more failed attempt at `what`: a warning for the first, then one a minute (an etcd
/// that is down for an hour does not fill the log).
fn failed(what: &str, e: &str, failures: &mut u32) {
    *failures += 1;
    if *failures == 1 || (*failures).is_multiple_of(60) {
        tracing::warn!(
            "etcd: {what}: {e}; trying again every second (attempt {failures}); the members stay as last seen",
            failures = *failures
        );
    }
}

/// A call to etcd succeeded: says so if calls had been failing.
fn recovered(failures: &mut u32) {
    if *failures > 0 {
        tracing::info!(
            "etcd: reachable again after {failures} failed attempts",
            failures = *failures
        );
        *failures = 0;
    }
}

/// Registers this member (`record`) in the cluster of `config`, reads the member set into
/// `membership`, and keeps both up to date on `rt` until the registration is dropped.
pub fn join(
    config: &EtcdConfig,
    record: Record,
    secret: &Secret,
    membership: Arc<Membership>,
    rt: &tokio::runtime::Handle,
) -> Result<Registration, ClusterError> {
    let member = Member {
        config: config.clone(),
        record,
        secret: secret.clone(),
        membership,
        lease: Default::default(),
        records: Default::default(),
    };
    let endpoints = config.endpoints.join(",");
    let fail = |e: String| ClusterError::Etcd(endpoints.clone(), e);
    let options = ConnectOptions::new()
        .with_connect_timeout(CALL_TIMEOUT)
        .with_timeout(CALL_TIMEOUT)
        .with_keep_alive(LEASE_TTL / 3, CALL_TIMEOUT);
    let client = rt.block_on(async {
        let mut client = Client::connect(&config.endpoints, Some(options))
            .await
            .map_err(why)?;
        member.register(&mut client).await?;
        member.refresh(&mut client).await?;
        Ok::<_, String>(client)
    });
    let client = client.map_err(fail)?;
    let tasks = vec![
        rt.spawn(member.clone().keep_alive(client.clone())),
        rt.spawn(member.clone().watch(client.clone())),
    ];
    Ok(Registration {
        client,
        lease: member.lease,
        tasks,
        rt: rt.clone(),
        records: member.records,
    })
}

impl Registration {
    /// The record of member `addr`, as last read from etcd.
    pub fn record(&self, addr: &str) -> Option<Record> {
        self.records.lock().get(addr).cloned()
    }

    /// Leaves the cluster now: the others hear of it at once, not when the lease runs out.
    pub fn leave(mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let lease = self.lease.load(std::sync::atomic::Ordering::Relaxed);
        let mut client = self.client.clone();
        let revoked = self.rt.block_on(async move {
            tokio::time::timeout(CALL_TIMEOUT, client.lease_revoke(lease)).await
        });
        match revoked {
            Ok(Ok(_)) => tracing::info!("left the cluster"),
            Ok(Err(e)) => tracing::warn!("etcd: leaving the cluster: {e}"),
            Err(_) => tracing::warn!("etcd: leaving the cluster: no reply"),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_opens_only_with_the_secret_and_cluster_and_address_it_was_sealed_for() {
        let secret = Secret::new(b"0123456789abcdef".to_vec()).unwrap();
        let other = Secret::new(b"fedcba9876543210".to_vec()).unwrap();
        let record = Record {
            addr: "10.0.0.1:7070".into(),
            cache_bytes: 1 << 30,
            host: "node1".into(),
            pid: 42,
        };
        let value = seal(&secret, "train", &record);
        assert_eq!(
            open(&secret, "train", "10.0.0.1:7070", &value),
            Some(record)
        );
        assert_eq!(open(&other, "train", "10.0.0.1:7070", &value), None);
        assert_eq!(open(&secret, "eval", "10.0.0.1:7070", &value), None);
        assert_eq!(open(&secret, "train", "10.0.0.2:7070", &value), None);
        // A record altered after it was signed.
        let tampered = String::from_utf8(value).unwrap().replace("node1", "evil1");
        assert_eq!(
            open(&secret, "train", "10.0.0.1:7070", tampered.as_bytes()),
            None
        );
        assert_eq!(open(&secret, "train", "10.0.0.1:7070", b"not json"), None);
    }
}
