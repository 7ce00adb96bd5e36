//! How members of a cluster know each other: every request between peers is signed with a
//! secret that every member holds (`--cluster-secret-file`).
//!
//! The signature is HMAC-SHA256 (RFC 2104) of the request's method, its target (path and
//! query, exactly as sent) and a timestamp, sent as `Authorization: coorfs-hmac
//! t=<unix seconds>,s=<64 hex digits>`. The server computes it again and compares in constant
//! time ([`hmac::Mac::verify_slice`]), and refuses a timestamp more than [`SKEW`] away from its
//! own clock: a captured request can be replayed for at most that long, and only to read again
//! what it read. The secret never crosses the network.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far a request's timestamp may be from the server's clock, in seconds.
pub const SKEW: u64 = 60;
/// The fewest bytes a secret may have (128 bits).
pub const MIN_SECRET: usize = 16;
/// The scheme of the `Authorization` header.
pub const SCHEME: &str = "coorfs-hmac";

/// Why a secret file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read the cluster secret file {0}: {1}")]
    Read(String, std::io::Error),
    #[error("the cluster secret file {0} may be read by other users (mode {1:o}): chmod 600 it")]
    Exposed(String, u32),
    #[error(
        "the cluster secret in {0} is {1} bytes; it needs at least {MIN_SECRET} (e.g. `head -c 32 /dev/urandom | base64 > FILE`)"
    )]
    Short(String, usize),
}

/// Why a request's signature was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no coorfs-hmac authorization")]
    Missing,
    #[error("a malformed authorization")]
    Malformed,
    #[error("a timestamp more than {SKEW} s from this clock")]
    Stale,
    #[error("a wrong signature")]
    Wrong,
}

/// The cluster's shared secret.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The secret in file `path`, without its trailing white space. The file must be readable
    /// by its owner alone, and the secret at least [`MIN_SECRET`] bytes.
    pub fn load(path: &Path) -> Result<Secret, SecretError> {
        let name = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|e| SecretError::Read(name.clone(), e))?;
        if meta.mode() & 0o077 != 0 {
            return Err(SecretError::Exposed(name, meta.mode() & 0o777));
        }
        let bytes = std::fs::read(path).map_err(|e| SecretError::Read(name.clone(), e))?;
        Secret::new(bytes.trim_ascii_end().to_vec()).map_err(|n| SecretError::Short(name, n))
    }

    /// `bytes` as a secret; Err(its length) if shorter than [`MIN_SECRET`].
    pub fn new(bytes: Vec<u8>) -> Result<Secret, usize> {
        if bytes.len() < MIN_SECRET {
            return Err(bytes.len());
        }
        Ok(Secret(bytes))
    }

    fn mac(&self, method: &str, target: &str, t: u64) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        for part in [
            method.as_bytes(),
            target.as_bytes(),
            t.to_string().as_bytes(),
        ] {
            mac.update(part);
            mac.update(b"\n");
        }
        mac
    }

    /// The `Authorization` header of a request `method target` sent at `t` (unix seconds).
    pub fn sign_at(&self, method: &str, target: &str, t: u64) -> String {
        let sig = self.mac(method, target, t).finalize().into_bytes();
        let hex: String = sig.iter().map(|b| format!("{b:02x}")).collect();
        format!("{SCHEME} t={t},s={hex}")
    }

    /// The `Authorization` header of a request `method target` sent now.
    pub fn sign(&self, method: &str, target: &str) -> String {
        self.sign_at(method, target, unix_now())
    }

    /// Checks the `authorization` header of a request `method target` received at `now`.
    pub fn verify_at(
        &self,
        method: &str,
        target: &str,
        authorization: Option<&str>,
        now: u64,
    ) -> Result<(), Refused> {
        let rest = authorization
            .and_then(|a| a.strip_prefix(SCHEME))
            .and_then(|a| a.strip_prefix(' '))
            .ok_or(Refused::Missing)?;
        let (t, s) = rest.split_once(',').ok_or(Refused::Malformed)?;
        let t: u64 = t
            .strip_prefix("t=")
            .and_then(|t| t.parse().ok())
            .ok_or(Refused::Malformed)?;
        let s = s.strip_prefix("s=").ok_or(Refused::Malformed)?;
        let sig = unhex(s).ok_or(Refused::Malformed)?;
        if t.abs_diff(now) > SKEW {
            return Err(Refused::Stale);
        }
        self.mac(method, target, t)
            .verify_slice(&sig)
            .map_err(|_| Refused::Wrong)
    }

    /// The signature of `record` (a member's entry in etcd, [`super::etcd`]), in hex.
    pub fn sign_record(&self, record: &str) -> String {
        let sig = self.mac("RECORD", record, 0).finalize().into_bytes();
        sig.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// True if `sig` is the signature of `record` (compared in constant time).
    pub fn verify_record(&self, record: &str, sig: &str) -> bool {
        unhex(sig).is_some_and(|sig| self.mac("RECORD", record, 0).verify_slice(&sig).is_ok())
    }

    /// Checks the `authorization` header of a request `method target` received now.
    pub fn verify(
        &self,
        method: &str,
        target: &str,
        authorization: Option<&str>,
    ) -> Result<(), Refused> {
        self.verify_at(method, target, authorization, unix_now())
    }
}

/// Seconds since the epoch.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The bytes of 64 hex digits (a SHA-256 HMAC), if that is what `s` is.
fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn secret(fill: u8) -> Secret {
        Secret::new(vec![fill; 32]).unwrap()
    }

    #[test]
    fn a_signed_request_passes_and_any_change_to_it_fails() {
        let (s, t) = (secret(1), 1_800_000_000);
        let target = "/v1/block?path=a%2Fb.jpg&block=0";
        let auth = s.sign_at("GET", target, t);
        assert!(auth.starts_with("coorfs-hmac t=1800000000,s="), "{auth}");
        assert_eq!(s.verify_at("GET", target, Some(&auth), t + 5), Ok(()));
        // Another path, block, method, key or time: refused.
        let other = "/v1/block?path=a%2Fc.jpg&block=0";
        assert_eq!(
            s.verify_at("GET", other, Some(&auth), t),
            Err(Refused::Wrong)
        );
        assert_eq!(
            s.verify_at("HEAD", target, Some(&auth), t),
            Err(Refused::Wrong)
        );
        assert_eq!(
            secret(2).verify_at("GET", target, Some(&auth), t),
            Err(Refused::Wrong)
        );
        let moved = auth.replace("t=1800000000", "t=1800000001");
        assert_eq!(
            s.verify_at("GET", target, Some(&moved), t),
            Err(Refused::Wrong)
        );
        // Replayed too late, or sent from a clock far ahead.
        assert_eq!(
            s.verify_at("GET", target, Some(&auth), t + SKEW + 1),
            Err(Refused::Stale)
        );
        assert_eq!(
            s.verify_at("GET", target, Some(&auth), t - SKEW - 1),
            Err(Refused::Stale)
        );
    }

    #[test]
    fn a_missing_or_malformed_authorization_is_refused_without_a_panic() {
        let s = secret(1);
        let t = 1_800_000_000;
        for (auth, why) in [
            (None, Refused::Missing),
            (Some(""), Refused::Missing),
            (Some("Bearer abc"), Refused::Missing),
            (Some("coorfs-hmac"), Refused::Missing),
            (Some("coorfs-hmac t=1800000000"), Refused::Malformed),
            (Some("coorfs-hmac t=x,s=00"), Refused::Malformed),
            (Some("coorfs-hmac t=1800000000,s=zz"), Refused::Malformed),
            (Some("coorfs-hmac t=1800000000,s=é"), Refused::Malformed),
        ] {
            assert_eq!(s.verify_at("GET", "/", auth, t), Err(why), "{auth:?}");
        }
        let long = format!("coorfs-hmac t=1800000000,s={}", "é".repeat(32));
        assert_eq!(
            s.verify_at("GET", "/", Some(&long), t),
            Err(Refused::Malformed)
        );
        let zero = format!("coorfs-hmac t=1800000000,s={}", "0".repeat(64));
        assert_eq!(s.verify_at("GET", "/", Some(&zero), t), Err(Refused::Wrong));
    }

    #[test]
    fn a_secret_file_must_be_private_and_long_enough() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Secret::load(&file).unwrap_err().to_string();
        assert!(
            e.contains("may be read by other users (mode 644): chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = Secret::load(&file).unwrap();
        // The trailing newline is not part of it.
        let same = Secret::new(b"0123456789abcdef0123".to_vec()).unwrap();
        assert_eq!(
            same.verify_at("GET", "/", Some(&s.sign_at("GET", "/", 7)), 7),
            Ok(())
        );
        std::fs::write(&file, "short\n").unwrap();
        let e = Secret::load(&file).unwrap_err().to_string();
        assert!(e.contains("is 5 bytes; it needs at least 16"), "{e}");
        let e = Secret::load(&dir.path().join("none"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cannot read the cluster secret file"), "{e}");
        assert_eq!(format!("{s:?}"), "Secret(..)", "never logged");
    }
}
