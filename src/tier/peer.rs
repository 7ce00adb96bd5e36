//! The peer tier: a block of a file that another member of the cluster owns is asked of that
//! member, over HTTP, before the source is read ([`crate::cluster`]).
//!
//! Which member owns a file is rendezvous hashing of its dataset-relative path over the
//! members ([`crate::cluster::owner`]); a file this member owns is no peer's, and the tier
//! answers nothing for it (the source is read, and the cache here keeps it). The request names
//! the version the reader opened ([`crate::cluster::wire`]); the reply must carry that version,
//! exactly the block's length in bytes and their CRC32C. A reply that does not (another
//! version, a short body, a wrong checksum, a refusal), a timeout or a connection error is a
//! fault of this tier ([`PeerFault`], logged with the member's name where the chain passes
//! over it): the read goes on to the source ([`super::look_up`]), and the member is
//! *suspect*: not asked for a second, doubling with each fault in a row up to
//! [`MAX_BACKOFF`]. A read never fails because a peer did.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::error::PeerFault;
use super::{DataError, Found, Tier, Want, Why};
use crate::block::{Block, BlockSize};
use crate::cluster::auth::Secret;
use crate::cluster::members::Membership;
use crate::cluster::wire::{BlockRequest, CRC_HEADER, VERSION_HEADER, version_value};
use crate::stats::{Counters, Stats};

/// How long a peer may take to answer a block request, from connect to the last byte.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// How long a peer may take to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest a suspect member goes unasked.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The bytes of a refusal's body that a fault keeps (the member's words: short).
const STATUS_BODY_MAX: u64 = 256;

/// A member of the cluster, as the tier knows it.
#[derive(Debug)]
struct Member {
    /// Its advertised address (`host:port`), which is also its name for ownership.
    name: String,
    /// Faults in a row.
    faults: AtomicU32,
    /// Not asked before this.
    suspect_until: Mutex<Option<Instant>>,
}

impl Member {
    fn suspect(&self) -> bool {
        self.suspect_until
            .lock()
            .is_some_and(|until| Instant::now() < until)
    }

    fn failed(&self) -> Duration {
        let faults = self.faults.fetch_add(1, Ordering::Relaxed).min(16);
        let backoff = Duration::from_secs(1 << faults).min(MAX_BACKOFF);
        *self.suspect_until.lock() = Some(Instant::now() + backoff);
        backoff
    }

    fn answered(&self) {
        if self.faults.swap(0, Ordering::Relaxed) > 0 {
            *self.suspect_until.lock() = None;
        }
    }
}

/// See the module documentation.
pub struct PeerTier {
    membership: Arc<Membership>,
    /// What this member knows of each member it asked, by name.
    members: Mutex<HashMap<String, Arc<Member>>>,
    secret: Secret,
    agent: ureq::Agent,
    /// `http` or, with TLS between members, `https`.
    scheme: &'static str,
    blocks: BlockSize,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for PeerTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTier")
            .field("membership", &self.membership)
            .finish_non_exhaustive()
    }
}

impl PeerTier {
    /// The tier of a member of `membership`, asking with `secret` (over TLS trusting the
    /// authorities of `tls`, if given), for files cut into `blocks`.
    pub fn new(
        membership: Arc<Membership>,
        secret: Secret,
        tls: Option<&crate::cluster::tls::PeerTls>,
        blocks: BlockSize,
        stats: Arc<Stats>,
    ) -> Self {
        let mut agent = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .max_idle_connections_per_host(16)
            .http_status_as_error(false);
        if let Some(tls) = tls {
            agent = agent.tls_config(tls.client());
        }
        PeerTier {
            scheme: if tls.is_some() { "https" } else { "http" },
            agent: agent.build().into(),
            membership,
            members: Mutex::new(HashMap::new()),
            secret,
            blocks,
            stats,
        }
    }

    /// What this member knows of member `name`; a member that left and came back starts
    /// afresh.
    fn member(&self, name: &str) -> Arc<Member> {
        let mut members = self.members.lock();
        if let Some(m) = members.get(name) {
            return m.clone();
        }
        // Forget the members that left, so that the map holds no more than the members.
        let view = self.membership.view();
        members.retain(|n, _| view.names.contains(n));
        let m = Arc::new(Member {
            name: name.to_string(),
            faults: AtomicU32::new(0),
            suspect_until: Mutex::new(None),
        });
        members.insert(name.to_string(), m.clone());
        m
    }

    /// The member to ask for `want`, and the digest of the members as this member sees them;
    /// None if nobody is: a member serves what it owns from its source and asks nobody for a
    /// peer's request (members whose lists disagreed would otherwise ask each other in a
    /// ring), and a suspect member is not asked.
    fn asked(&self, want: &Want<'_>) -> Option<(Arc<Member>, u64)> {
        if want.why == Why::Peer {
            return None;
        }
        let view = self.membership.view();
        let i = view.owner(want.rel.as_os_str().as_bytes());
        if i == view.me {
            return None;
        }
        let m = self.member(&view.names[i]);
        (!m.suspect()).then_some((m, view.digest))
    }

    /// Block `want.key` from member `m`.
    fn ask(&self, m: &Member, digest: u64, want: &Want<'_>) -> Result<Block, PeerFault> {
        let v = want.key.version;
        let request = BlockRequest {
            path: want.rel.as_os_str().as_bytes().to_vec(),
            block: want.key.block,
            size: v.size,
            mtime_ns: v.mtime_ns,
            ctime_ns: v.ctime_ns,
            members: digest,
        };
        let target = request.target();
        let mut reply = self
            .agent
            .get(format!("{}://{}{target}", self.scheme, m.name))
            .header("authorization", self.secret.sign("GET", &target))
            .call()
            .map_err(|e| PeerFault::Transport(Arc::new(e)))?;
        if reply.status() != 200 {
            // The member's words, if short (its refusal, or why its read failed).
            let status = reply.status().as_u16();
            let body = reply.body_mut().with_config().limit(STATUS_BODY_MAX);
            let body = body.read_to_string().unwrap_or_default();
            return Err(PeerFault::Status { status, body });
        }
        let version = reply
            .headers()
            .get(VERSION_HEADER)
            .and_then(|h| h.to_str().ok());
        if version != Some(&version_value(v.size, v.mtime_ns, v.ctime_ns)) {
            return Err(PeerFault::OtherVersion(version.map(str::to_string)));
        }
        let crc: u32 = reply
            .headers()
            .get(CRC_HEADER)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse().ok())
            .ok_or(PeerFault::NoChecksum)?;
        let len = self.blocks.len(v.size, want.key.block) as usize;
        // Straight into the block: no buffer to grow and copy from.
        let mut block = Block::zeroed(len).map_err(|e| PeerFault::NoMemory(Arc::new(e)))?;
        let mut body = reply
            .body_mut()
            .with_config()
            .limit(len as u64 + 1)
            .reader();
        let mut got = 0;
        loop {
            let room = &mut block.whole_mut()[got..];
            if room.is_empty() {
                // A body longer than the block: one more byte says so.
                got += body
                    .read(&mut [0])
                    .map_err(|e| PeerFault::Body(Arc::new(e)))?;
                break;
            }
            let n = body.read(room).map_err(|e| PeerFault::Body(Arc::new(e)))?;
            if n == 0 {
                break;
            }
            got += n;
        }
        if got != len {
            return Err(PeerFault::Length { got, len });
        }
        block.truncate(len);
        if crc32c::crc32c(&block) != crc {
            return Err(PeerFault::Checksum);
        }
        Ok(block)
    }
}

impl Tier for PeerTier {
    fn name(&self) -> &'static str {
        "peer"
    }

    fn origin(&self) -> super::fetch::Origin {
        super::fetch::Origin::Peer
    }

    fn may_find(&self, want: &Want<'_>) -> bool {
        self.asked(want).is_some()
    }

    fn get(&self, want: &Want<'_>) -> Result<Option<Found<'_>>, DataError> {
        let Some((m, digest)) = self.asked(want) else {
            return Ok(None);
        };
        let counters = &self.stats.counters;
        match self.ask(&m, digest, want) {
            Ok(block) => {
                m.answered();
                Counters::add(&counters.peer_hits, 1);
                Counters::add(&counters.bytes_from_peers, block.len() as u64);
                Ok(Some(Found::Block(Arc::new(block))))
            }
            Err(fault) => {
                Counters::add(&counters.peer_errors, 1);
                Err(DataError::Peer {
                    peer: m.name.clone(),
                    fault,
                    backoff: m.failed(),
                })
            }
        }
    }

    fn admit(&self, _want: &Want<'_>, _data: &Arc<Block>) -> bool {
        false
    }

    fn remove(&self, _want: &Want<'_>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::wire::version_value;
    use crate::tier::tests::want;
    use std::io::Write;

    const SIZE: usize = 1000;

    /// A member at a port of its own that answers one request with `reply` (raw HTTP); its
    /// address.
    fn one_reply(reply: Vec<u8>) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            // The request's head, up to its blank line.
            let mut head = Vec::new();
            let mut byte = [0u8];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = conn.write_all(&reply);
        });
        addr
    }

    fn reply(status: u16, crc: Option<u32>, version: Option<String>, body: &[u8]) -> Vec<u8> {
        let mut r = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
        if let Some(crc) = crc {
            r += &format!("{CRC_HEADER}: {crc}\r\n");
        }
        if let Some(v) = version {
            r += &format!("{VERSION_HEADER}: {v}\r\n");
        }
        r += "connection: close\r\n\r\n";
        let mut r = r.into_bytes();
        r.extend_from_slice(body);
        r
    }

    /// A tier of a member of two whose other member, at `peer`, owns file "f".
    fn tier_asking(peer: &str) -> (PeerTier, Arc<Stats>) {
        let me = (0..)
            .map(|i| format!("me-{i}:1"))
            .find(|me| crate::cluster::owner::owner(&[peer, me.as_str()], b"f") == Some(0))
            .unwrap();
        let membership = Arc::new(Membership::fixed(vec![peer.to_string(), me], 1));
        let secret = Secret::new(b"0123456789abcdef".to_vec()).unwrap();
        let blocks = BlockSize::new(std::num::NonZeroU64::new(1 << 20).unwrap());
        let stats = Arc::new(Stats::default());
        (
            PeerTier::new(membership, secret, None, blocks, stats.clone()),
            stats,
        )
    }

    #[test]
    fn a_reply_that_is_not_the_block_asked_for_is_a_fault_and_its_member_is_left_alone() {
        let body = vec![7u8; SIZE];
        let crc = crc32c::crc32c(&body);
        let version = || Some(version_value(SIZE as u64, 0, 0));
        let other = vec![8u8; SIZE];
        // (the reply, the start of the fault it is; None: the block)
        for (why, reply, fault) in [
            ("the block", reply(200, Some(crc), version(), &body), None),
            (
                "a wrong checksum",
                reply(200, Some(crc), version(), &other),
                Some("a wrong checksum"),
            ),
            (
                "no checksum",
                reply(200, None, version(), &body),
                Some("no checksum"),
            ),
            (
                "a short body",
                reply(200, Some(crc), version(), &body[1..]),
                Some("999 bytes of 1000"),
            ),
            (
                "a long body",
                reply(200, Some(crc), version(), &[&body[..], b"x"].concat()),
                Some("1001 bytes of 1000"),
            ),
            (
                "another version",
                reply(
                    200,
                    Some(crc),
                    Some(version_value(SIZE as u64, 1, 0)),
                    &body,
                ),
                Some("a reply for another version (Some("),
            ),
            (
                "no version",
                reply(200, Some(crc), None, &body),
                Some("a reply for another version (None)"),
            ),
            (
                "a refusal",
                reply(409, None, None, b"another version"),
                Some("HTTP 409: another version"),
            ),
            (
                "a reply cut short",
                b"HTTP/1.1 200 OK\r\ncontent-le".to_vec(),
                Some(""),
            ),
        ] {
            let peer = one_reply(reply);
            let (tier, stats) = tier_asking(&peer);
            let w = want(1, SIZE as u64, 0, Why::Read);
            match (tier.get(&w), fault) {
                (Ok(Some(Found::Block(b))), None) => assert_eq!(&b[..], &body[..], "{why}"),
                (Err(e), Some(fault)) => {
                    let DataError::Peer {
                        peer: name,
                        fault: got,
                        ..
                    } = &e
                    else {
                        panic!("{why}: {e}")
                    };
                    assert_eq!(name, &peer, "{why}");
                    assert!(got.to_string().starts_with(fault), "{why}: {e}");
                    assert_eq!(e.errno(), libc::EIO, "{why}");
                }
                (other, _) => panic!("{why}: {:?}", other.map(|f| f.is_some())),
            }
            let ok = fault.is_none();
            let c = &stats.counters;
            assert_eq!(Counters::get(&c.peer_errors), u64::from(!ok), "{why}");
            assert_eq!(Counters::get(&c.peer_hits), u64::from(ok), "{why}");
            if !ok {
                // Suspect now: the next read goes straight to the source, unasked.
                assert!(matches!(tier.get(&w), Ok(None)), "{why}");
                assert_eq!(Counters::get(&c.peer_errors), 1, "{why}");
            }
        }
    }

    #[test]
    fn a_member_asks_nobody_for_a_file_it_owns_or_for_a_peer() {
        let (tier, stats) = tier_asking("127.0.0.1:1");
        // A peer's request: served from this member's source, no ring.
        assert!(matches!(tier.get(&want(1, 10, 0, Why::Peer)), Ok(None)));
        assert_eq!(Counters::get(&stats.counters.peer_errors), 0);
    }
}
