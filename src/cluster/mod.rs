//! Many servers, one cache: the members of a cluster each cache the files they own and serve
//! them to the others, which ask before they read the shared storage.
//!
//! - [`owner`]: which member owns a file (rendezvous hashing of its path over the members).
//! - [`auth`]: how members know each other (every request signed with the cluster's secret).
//! - [`wire`]: the one request (a block of a file, at a version) and its reply.
//! - [`server`]: the peer server, which serves the blocks of the files this member owns.
//!
//! The asking side is a tier of the read path, in front of the source
//! ([`crate::tier::peer`]).
pub mod auth;
pub mod owner;
pub mod server;
pub mod wire;

use std::net::SocketAddr;

/// A member's place in its cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Every member's advertised address (`host:port`), this one's included, in the order of
    /// `--peers`: the names ownership is hashed over.
    pub members: Vec<String>,
    /// This member's index in `members` (`--node-rank`).
    pub me: usize,
    /// Where this member's peer server listens.
    pub listen: SocketAddr,
    /// The cluster's secret.
    pub secret: auth::Secret,
}

impl ClusterConfig {
    /// True if this member owns the file at `path` (relative to the dataset root).
    pub fn owns(&self, path: &[u8]) -> bool {
        owner::owner(&self.members, path) == Some(self.me)
    }
}

/// Why the cluster options cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("--peers: \"{0}\" is not HOST:PORT")]
    BadPeer(String),
    #[error("--peers names {0} twice")]
    Twice(String),
    #[error("--peers: cannot resolve {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error("--node-rank {0} is no place in --peers ({1} members: 0 to {max})", max = .1 - 1)]
    Rank(usize, usize),
    #[error(transparent)]
    Secret(#[from] auth::SecretError),
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
            let port = m
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(p))) if !host.is_empty() && p != 0) {
                return Err(ClusterError::BadPeer(m.clone()));
            }
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
            members,
            me,
            listen,
            secret,
        })
    }
}
