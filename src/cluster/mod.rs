//! Many servers, one cache: the members of a cluster each cache the files they own and serve
//! them to the others, which ask before they read the shared storage.
//!
//! - [`owner`]: which member owns a file (rendezvous hashing of its path over the members).
//! - [`auth`]: how members know each other (every request signed with the cluster's secret).
//! - [`wire`]: the one request (a block of a file, at a version) and its reply.
//! - [`server`]: the peer server, which serves the blocks of the files this member owns.
//! - [`members`]: who the members are now, fixed (`--peers`) or followed in [`etcd`]
//!   (`--cluster`, `--etcd`).
//! - [`tls`]: TLS between members, if asked for.
//!
//! This module turns the cluster options into a member's place in its cluster
//! ([`ClusterConfig`]).
//!
//! The asking side is a tier of the read path, in front of the source
//! ([`crate::tier::peer`]).
pub mod auth;
pub mod etcd;
pub mod members;
pub mod owner;
pub mod server;
pub mod tls;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

use members::Membership;

/// A member's place in its cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The members now: fixed by `--peers`, or followed in etcd.
    pub membership: Arc<Membership>,
    /// Where this member's peer server listens.
    pub listen: SocketAddr,
    /// The cluster's secret.
    pub secret: auth::Secret,
    /// Where the members register (`--cluster`, `--etcd`), if not fixed by `--peers`.
    pub etcd: Option<etcd::EtcdConfig>,
    /// TLS between members (`--peer-tls-*`), if any.
    pub tls: Option<tls::PeerTls>,
}

/// Why the cluster options cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{0}: \"{1}\" is not HOST:PORT")]
    BadAddress(&'static str, String),
    #[error("--peers names {0} twice")]
    Twice(String),
    #[error("--peers: cannot resolve {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error("--node-rank {0} is no place in --peers ({1} members: 0 to {max})", max = .1 - 1)]
    Rank(usize, usize),
    #[error("--cluster \"{0}\": a cluster's name is 1 to 64 letters, digits, '.', '_' or '-'")]
    BadName(String),
    #[error(
        "--peer-listen {0} is every interface: pass --advertise HOST:PORT, the address the other members reach this one at"
    )]
    NoAdvertise(SocketAddr),
    #[error("etcd at {0}: {1}")]
    Etcd(String, String),
    #[error(transparent)]
    Secret(#[from] auth::SecretError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(
        "--peers needs this member's place: --node-rank N, or COORFS_NODE_RANK, GROUP_RANK (torchrun) or NODE_RANK in the environment"
    )]
    NoRank,
    #[error("{0}={1:?} is not a node rank (0, 1, 2, ...)")]
    BadRank(&'static str, String),
    #[error("the peer server cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
}

/// The node rank that launchers put in the environment: torchrun's GROUP_RANK, else the
/// NODE_RANK that launch scripts pass to torchrun's --node-rank (COORFS_NODE_RANK is read as
/// --node-rank itself).
pub fn rank_from_environment() -> Result<usize, ClusterError> {
    for name in ["GROUP_RANK", "NODE_RANK"] {
        if let Some(value) = std::env::var_os(name) {
            let value = value.to_string_lossy().into_owned();
            return value
                .trim()
                .parse()
                .map_err(|_| ClusterError::BadRank(name, value));
        }
    }
    Err(ClusterError::NoRank)
}

/// Checks that `addr` is HOST:PORT (a non-empty host, a port from 1), for option `option`.
fn check_address(option: &'static str, addr: &str) -> Result<(), ClusterError> {
    let port = addr
        .rsplit_once(':')
        .map(|(host, port)| (host, port.parse::<u16>()));
    if matches!(port, Some((host, Ok(p))) if !host.is_empty() && p != 0) {
        Ok(())
    } else {
        Err(ClusterError::BadAddress(option, addr.to_string()))
    }
}

impl ClusterConfig {
    /// The configuration of member `me` of `members` (`--peers`), with the secret in
    /// `secret_file`, listening on `listen` or else on its own entry of `members`.
    pub fn new(
        members: Vec<String>,
        me: usize,
        secret_file: &std::path::Path,
        listen: Option<SocketAddr>,
    ) -> Result<ClusterConfig, ClusterError> {
        use std::net::ToSocketAddrs;
        for (i, m) in members.iter().enumerate() {
            check_address("--peers", m)?;
            if members[..i].contains(m) {
                return Err(ClusterError::Twice(m.clone()));
            }
        }
        if me >= members.len() {
            return Err(ClusterError::Rank(me, members.len()));
        }
        let secret = auth::Secret::load(secret_file)?;
        let listen = match listen {
            Some(addr) => addr,
            None => members[me]
                .to_socket_addrs()
                .map_err(|e| ClusterError::Resolve(members[me].clone(), e))?
                .next()
                .ok_or_else(|| {
                    ClusterError::Resolve(members[me].clone(), std::io::ErrorKind::NotFound.into())
                })?,
        };
        Ok(ClusterConfig {
            membership: Arc::new(Membership::fixed(members, me)),
            listen,
            secret,
            etcd: None,
            tls: None,
        })
    }

    /// The configuration of a member of cluster `name`, registered in etcd at `endpoints`,
    /// listening on `listen` and reached by the others at `advertise` (by default `listen`,
    /// unless that is every interface), with the secret in `secret_file`.
    pub fn in_etcd(
        name: String,
        endpoints: Vec<String>,
        listen: SocketAddr,
        advertise: Option<String>,
        secret_file: &std::path::Path,
    ) -> Result<ClusterConfig, ClusterError> {
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
            return Err(ClusterError::BadName(name));
        }
        let advertise = match advertise {
            Some(a) => a,
            None if listen.ip().is_unspecified() => return Err(ClusterError::NoAdvertise(listen)),
            None => listen.to_string(),
        };
        check_address("--advertise", &advertise)?;
        let secret = auth::Secret::load(secret_file)?;
        Ok(ClusterConfig {
            membership: Arc::new(Membership::dynamic(advertise)),
            listen,
            secret,
            etcd: Some(etcd::EtcdConfig {
                endpoints,
                cluster: name,
            }),
            tls: None,
        })
    }
}
