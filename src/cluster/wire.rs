//! What peers say to each other: one request, a block of a file, and its reply.
//!
//! ```text
//! GET /v1/block?path=train/cat/1.jpg&block=0&size=112640&mtime=...&ctime=...&members=...
//! Authorization: coorfs-hmac t=...,s=...                       (see [`super::auth`])
//!
//! 200, the block's bytes, x-coorfs-crc32c: <CRC32C of them, decimal>,
//!      x-coorfs-version: <size> <mtime> <ctime> (of the file they were read from)
//! 400 a malformed request or a path outside the dataset    401 not signed by a member
//! 404 no such file   409 another version there, or other members   414 a target too long
//! 502 the owner's read of its source failed
//! ```
//!
//! The path is relative to the dataset root, its bytes percent-encoded (names need not be
//! UTF-8). The asker names the version it expects (size, mtime and ctime in nanoseconds: the
//! members' views of one shared directory agree on those, not on device or inode numbers),
//! so the owner never sends the bytes of another version, and the digest of its member list
//! ([`members_digest`]): members that list different members would disagree on owners, and
//! each would cache files the others ask someone else for; the owner refuses them when the
//! members are fixed (`--peers`). Members in etcd may differ for a moment while a change
//! travels, and are served. A path is confined as the FUSE side confines one
//! ([`confined`]), and the owner opens it beneath the dataset root as well.

use std::fmt::Write as _;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// The longest request target a member accepts: a path of 4 KiB (PATH_MAX), encoded.
pub const MAX_TARGET: usize = 3 * 4096 + 256;
/// The header that carries the CRC32C of a block.
pub const CRC_HEADER: &str = "x-coorfs-crc32c";
/// The header that carries the version of the file a block was read from.
pub const VERSION_HEADER: &str = "x-coorfs-version";

/// The value of [`VERSION_HEADER`] for a file of `size` bytes modified at `mtime_ns` and
/// changed at `ctime_ns`: the three, space-separated.
pub fn version_value(size: u64, mtime_ns: i64, ctime_ns: i64) -> String {
    format!("{size} {mtime_ns} {ctime_ns}")
}
/// The path of a block request.
pub const BLOCK_PATH: &str = "/v1/block";

/// Bytes sent as they are in a path: the unreserved characters and `/`.
const PATH_BYTES: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// A request for block `block` of the file at `path` (relative to the dataset root), which
/// the asker knows as `size` bytes, modified at `mtime_ns` and changed at `ctime_ns`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRequest {
    pub path: Vec<u8>,
    pub block: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// The asker's [`members_digest`].
    pub members: u64,
}

/// The digest of a member list, in its order: xxh3 of the names, each ended by a newline.
pub fn members_digest<S: AsRef<str>>(members: &[S]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for m in members {
        h.update(m.as_ref().as_bytes());
        h.update(b"\n");
    }
    h.digest()
}

/// Why a request target was refused (400 or 414).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    #[error("a request target longer than {MAX_TARGET} bytes")]
    TooLong,
    #[error("no such request")]
    Unknown,
    #[error("a missing or malformed parameter")]
    Malformed,
    #[error("a path outside the dataset")]
    Outside,
}

/// True if `path` names something beneath the dataset root: relative, not empty, no NUL, and
/// no component that is empty, `.` or `..`.
pub fn confined(path: &[u8]) -> bool {
    !path.is_empty()
        && !path.contains(&0)
        && path
            .split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

impl BlockRequest {
    /// The request target (path and query) that asks for it.
    pub fn target(&self) -> String {
        // Bytes that are not UTF-8 are encoded one by one, like any other reserved byte.
        let path: String = match std::str::from_utf8(&self.path) {
            Ok(s) => utf8_percent_encode(s, PATH_BYTES).to_string(),
            Err(_) => self.path.iter().fold(String::new(), |mut out, b| {
                let _ = write!(out, "%{b:02X}");
                out
            }),
        };
        format!(
            "{BLOCK_PATH}?path={path}&block={}&size={}&mtime={}&ctime={}&members={:016x}",
            self.block, self.size, self.mtime_ns, self.ctime_ns, self.members
        )
    }

    /// The request a target asks for, if it is a well-formed one for a confined path.
    pub fn parse(target: &str) -> Result<BlockRequest, BadRequest> {
        if target.len() > MAX_TARGET {
            return Err(BadRequest::TooLong);
        }
        let query = target
            .strip_prefix(BLOCK_PATH)
            .and_then(|q| q.strip_prefix('?'))
            .ok_or(BadRequest::Unknown)?;
        let (mut path, mut block, mut size, mut mtime, mut ctime, mut members) =
            (None, None, None, None, None, None);
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').ok_or(BadRequest::Malformed)?;
            let slot = match key {
                "path" => {
                    let bytes: Vec<u8> = percent_decode_str(value).collect();
                    if path.replace(bytes).is_some() {
                        return Err(BadRequest::Malformed);
                    }
                    continue;
                }
                "block" => &mut block,
                "size" => &mut size,
                "mtime" => &mut mtime,
                "ctime" => &mut ctime,
                "members" => &mut members,
                _ => return Err(BadRequest::Malformed),
            };
            if slot.replace(value).is_some() {
                return Err(BadRequest::Malformed);
            }
        }
        let num = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok());
        let time = |v: Option<&str>| v.and_then(|v| v.parse::<i64>().ok());
        let request = BlockRequest {
            path: path.ok_or(BadRequest::Malformed)?,
            block: num(block).ok_or(BadRequest::Malformed)?,
            size: num(size).ok_or(BadRequest::Malformed)?,
            mtime_ns: time(mtime).ok_or(BadRequest::Malformed)?,
            ctime_ns: time(ctime).ok_or(BadRequest::Malformed)?,
            members: members
                .filter(|m| m.len() == 16)
                .and_then(|m| u64::from_str_radix(m, 16).ok())
                .ok_or(BadRequest::Malformed)?,
        };
        if !confined(&request.path) {
            return Err(BadRequest::Outside);
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(path: &[u8]) -> BlockRequest {
        BlockRequest {
            path: path.to_vec(),
            block: 3,
            size: 12_345_678,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: -5,
            members: members_digest(&["a:1", "b:2"]),
        }
    }

    #[test]
    fn a_target_reads_back_as_the_request_it_was_made_from() {
        for path in [
            &b"train/cat/1.jpg"[..],
            b"a b/c&d=e?f#g%h+i",
            b"\xff\xfe/not-utf8",
            "é/日本".as_bytes(),
        ] {
            let r = request(path);
            assert_eq!(
                BlockRequest::parse(&r.target()),
                Ok(r.clone()),
                "{}",
                r.target()
            );
        }
        assert_eq!(
            request(b"a/b c").target(),
            format!(
                "/v1/block?path=a/b%20c&block=3&size=12345678&mtime=1700000000123456789&ctime=-5&members={:016x}",
                members_digest(&["a:1", "b:2"])
            )
        );
        // The order of the members is part of the list: it names each one's rank.
        assert_ne!(
            members_digest(&["a:1", "b:2"]),
            members_digest(&["b:2", "a:1"])
        );
        assert_ne!(members_digest(&["a:1", "b:2"]), members_digest(&["a:1b:2"]));
    }

    #[test]
    fn paths_outside_the_dataset_and_malformed_targets_are_refused() {
        for path in [
            &b"../etc/passwd"[..],
            b"/etc/passwd",
            b"a/../../b",
            b"a/./b",
            b"a//b",
            b"a/",
            b"",
            b"a\0b",
            b"..",
        ] {
            assert!(!confined(path), "{path:?}");
            assert_eq!(
                BlockRequest::parse(&request(path).target()),
                Err(BadRequest::Outside),
                "{path:?}"
            );
        }
        // Encoded traversal is decoded before it is judged.
        let sneaky = "/v1/block?path=%2E%2E%2Fetc%2Fshadow&block=0&size=1&mtime=0&ctime=0&members=0000000000000000";
        assert_eq!(BlockRequest::parse(sneaky), Err(BadRequest::Outside));
        let good = "/v1/block?path=a&block=0&size=1&mtime=0&ctime=0&members=00000000000000ff";
        assert!(BlockRequest::parse(good).is_ok());
        for (target, why) in [
            ("/v2/block?path=a", BadRequest::Unknown),
            ("/v1/block", BadRequest::Unknown),
            (
                "/v1/block?path=a&block=0&size=1&mtime=0",
                BadRequest::Malformed,
            ),
            (
                "/v1/block?path=a&block=x&size=1&mtime=0&ctime=0",
                BadRequest::Malformed,
            ),
            (
                "/v1/block?path=a&block=0&size=-1&mtime=0&ctime=0",
                BadRequest::Malformed,
            ),
            (
                "/v1/block?path=a&path=b&block=0&size=1&mtime=0&ctime=0",
                BadRequest::Malformed,
            ),
            (
                "/v1/block?path=a&block=0&block=1&size=1&mtime=0&ctime=0",
                BadRequest::Malformed,
            ),
            (
                "/v1/block?path=a&block=0&size=1&mtime=0&ctime=0&x=1",
                BadRequest::Malformed,
            ),
            ("/v1/block?path=a&block", BadRequest::Malformed),
            (
                "/v1/block?path=a&block=0&size=1&mtime=0&ctime=0&members=ff",
                BadRequest::Malformed,
            ),
        ] {
            assert_eq!(BlockRequest::parse(target), Err(why), "{target}");
        }
        let long = format!("/v1/block?path={}", "a".repeat(MAX_TARGET));
        assert_eq!(BlockRequest::parse(&long), Err(BadRequest::TooLong));
    }

    proptest! {
        #[test]
        fn any_confined_path_survives_the_wire(
            parts in proptest::collection::vec(proptest::collection::vec(1u8..=255, 1..12), 1..5),
            block in any::<u64>(),
        ) {
            let path = parts.join(&b'/');
            prop_assume!(confined(&path));
            let r = BlockRequest { block, ..request(&path) };
            prop_assert_eq!(BlockRequest::parse(&r.target()), Ok(r));
        }
    }
}
