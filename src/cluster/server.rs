//! The peer server: serves the blocks of the files this member owns to the other members.
//!
//! It listens on the address given (`--peer-listen`, by default this member's own entry of
//! `--peers`), never on every interface unless told to. Every request must be signed with the
//! cluster's secret ([`super::auth`]); an unsigned one gets 401 and is counted
//! (`peer_refused`), as is a malformed one or one for a path outside the dataset (400), one
//! from a member that lists other members than `--peers` here (409: the two would disagree on
//! owners) or a target too long (414). A signed request names a path relative to the dataset root, judged
//! like the FUSE side's ([`super::wire::confined`]) and opened beneath the root by the source,
//! so that no request reads outside the dataset, symbolic links included.
//!
//! At most [`MAX_IN_FLIGHT`] requests are served at once (the asker reads the source for a
//! 503). The server checks a request against the source (a regular file of the version asked
//! for, a block it has) and takes the block from its member through [`ServedBlocks`]: the
//! mount's tiers (`crate::fs`), which serve it from the cache if it holds it, else fetch it
//! once from the tiers behind the member's fetcher: the source, since a member asks no peer
//! for a file it owns. The cache then keeps it as its policy keeps what is read, so each
//! member's cache fills with the files it owns. The trait keeps this module below the tiers,
//! whose peer tier is this server's client.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use super::auth::Secret;
use super::wire::{
    BadRequest, BlockRequest, CRC_HEADER, MAX_TARGET, VERSION_HEADER, version_value,
};
use crate::block::{Block, BlockSize};
use crate::cache::BlockKey;
use crate::namespace::Kind;
use crate::source::{Creds, DatasetSource};
use crate::stats::{Counters, Stats};

/// Requests served at once; past it a request gets 503 at once. A member asks with one
/// request per block its readers miss, as many as its fetch threads (64 by default).
pub const MAX_IN_FLIGHT: usize = 256;

/// Where the server takes the blocks it serves: its member's tiers.
pub trait ServedBlocks: Send + Sync {
    /// Block `key` of the file at `rel`: from the cache, else fetched once (and blocking
    /// until it is). An error is the fetch's.
    fn block(&self, rel: &Path, key: BlockKey) -> std::io::Result<Arc<Block>>;
}

/// What the server needs of its member.
pub struct PeerServer {
    source: Arc<dyn DatasetSource>,
    /// How the member's files are cut into blocks.
    blocks: BlockSize,
    served: Box<dyn ServedBlocks>,
    secret: Secret,
    stats: Arc<Stats>,
    /// The members, as this member sees them.
    membership: Arc<super::members::Membership>,
    /// Requests being served (see [`MAX_IN_FLIGHT`]).
    slots: tokio::sync::Semaphore,
}

impl PeerServer {
    /// The server of a member of `membership` that checks requests against `source` and
    /// serves the `blocks` of its files from `served`, for peers that hold `secret`, counting
    /// in `stats`.
    pub fn new(
        membership: Arc<super::members::Membership>,
        source: Arc<dyn DatasetSource>,
        blocks: BlockSize,
        served: Box<dyn ServedBlocks>,
        secret: Secret,
        stats: Arc<Stats>,
    ) -> Self {
        PeerServer {
            source,
            blocks,
            served,
            secret,
            stats,
            membership,
            slots: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
        }
    }

    /// Serves on `listener` (bound already: a bad address is the mount's error, before it
    /// mounts), on the runtime of `rt`, over TLS with `tls` if given.
    pub fn serve(
        self: Arc<Self>,
        listener: std::net::TcpListener,
        rt: &tokio::runtime::Handle,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<()> {
        listener.set_nonblocking(true)?;
        let app = Router::new().fallback(handle).with_state(self);
        let _guard = rt.enter();
        let stopped = |e: std::io::Error| tracing::error!("the peer server stopped: {e}");
        match tls {
            Some(config) => {
                let config = axum_server::tls_rustls::RustlsConfig::from_config(config);
                let server = axum_server::from_tcp_rustls(listener, config)?;
                rt.spawn(async move {
                    if let Err(e) = server.serve(app.into_make_service()).await {
                        stopped(e);
                    }
                });
            }
            None => {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                rt.spawn(async move {
                    if let Err(e) = axum::serve(listener, app).await {
                        stopped(e);
                    }
                });
            }
        }
        Ok(())
    }

    fn refuse(&self, status: StatusCode, why: impl std::fmt::Display) -> Response {
        Counters::add(&self.stats.counters.peer_refused, 1);
        tracing::debug!("peer request refused: {status}: {why}");
        (status, why.to_string()).into_response()
    }

    /// Block `r`, from the cache or fetched; the status of a refusal otherwise.
    fn read(&self, r: &BlockRequest) -> Result<Arc<Block>, (StatusCode, String)> {
        let rel = Path::new(OsStr::from_bytes(&r.path));
        let meta = self.source.metadata(rel, &Creds::DAEMON).map_err(|e| {
            let status = match e.errno() {
                libc::ENOENT | libc::ENOTDIR => StatusCode::NOT_FOUND,
                libc::EXDEV | libc::ELOOP => StatusCode::BAD_REQUEST,
                _ => StatusCode::BAD_GATEWAY,
            };
            (status, e.to_string())
        })?;
        let v = meta.version;
        if meta.attr.kind != Kind::File {
            return Err((StatusCode::NOT_FOUND, "not a regular file".into()));
        }
        if (v.size, v.mtime_ns, v.ctime_ns) != (r.size, r.mtime_ns, r.ctime_ns) {
            return Err((StatusCode::CONFLICT, "another version".into()));
        }
        if r.block >= self.blocks.count(v.size) {
            return Err((StatusCode::BAD_REQUEST, "no such block".into()));
        }
        let key = BlockKey {
            version: v,
            block: r.block,
        };
        (self.served.block(rel, key)).map_err(|e| (StatusCode::BAD_GATEWAY, e.to_string()))
    }
}

/// A block shared with the response body that sends it.
struct Shared(Arc<Block>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

async fn handle(
    State(s): State<Arc<PeerServer>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let target = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_string(), |pq| pq.as_str().to_string());
    if target.len() > MAX_TARGET {
        return s.refuse(StatusCode::URI_TOO_LONG, BadRequest::TooLong);
    }
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|a| a.to_str().ok());
    if let Err(why) = s.secret.verify(method.as_str(), &target, auth) {
        return s.refuse(StatusCode::UNAUTHORIZED, why);
    }
    if method != Method::GET {
        return s.refuse(StatusCode::METHOD_NOT_ALLOWED, "GET only");
    }
    let request = match BlockRequest::parse(&target) {
        Ok(r) => r,
        Err(BadRequest::Unknown) => return s.refuse(StatusCode::NOT_FOUND, BadRequest::Unknown),
        Err(e) => return s.refuse(StatusCode::BAD_REQUEST, e),
    };
    // Members fixed by --peers must list the same members; members in etcd may see different
    // sets for a moment, while news of a change travels, and serve each other meanwhile.
    if s.membership.is_fixed() && request.members != s.membership.view().digest {
        tracing::warn!(
            "a peer lists other members than --peers here: check every member's --peers"
        );
        return s.refuse(StatusCode::CONFLICT, "another list of members");
    }
    let Ok(_slot) = s.slots.try_acquire() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response();
    };
    // The source's metadata and a fetch block: off the runtime's one worker.
    let server = s.clone();
    // `read` serves only the version asked for.
    let version = version_value(request.size, request.mtime_ns, request.ctime_ns);
    let read = tokio::task::spawn_blocking(move || server.read(&request)).await;
    match read {
        Ok(Ok(block)) => {
            let counters = &s.stats.counters;
            Counters::add(&counters.peer_served, 1);
            Counters::add(&counters.bytes_to_peers, block.len() as u64);
            let crc = crc32c::crc32c(&block);
            // The block itself goes out, not a copy of it.
            let body = axum::body::Bytes::from_owner(Shared(block));
            let headers = [(CRC_HEADER, crc.to_string()), (VERSION_HEADER, version)];
            (headers, Body::from(body)).into_response()
        }
        Ok(Err((status, why))) if status == StatusCode::BAD_REQUEST => s.refuse(status, why),
        Ok(Err((status, why))) => (status, why).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
