//! TLS between members (`--peer-tls-cert`, `--peer-tls-key`, `--peer-tls-ca`), with rustls.
//!
//! Without it, members talk plain HTTP: every request is signed ([`super::auth`]), so nobody
//! without the secret is served, but the blocks cross the network in the clear and a reply is
//! not authenticated. With it, every member serves HTTPS with its certificate and key, and
//! asks the others over HTTPS, trusting only the certificate authorities in the CA file: a
//! member's certificate must name the host of its address (`--peers` entry or `--advertise`),
//! as a DNS name or an IP address. Members do not present certificates of their own: the
//! signature with the secret already says who asks. Every member of a cluster uses TLS, or
//! none does (a member asking another in the other way gets errors, and reads the source).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{0}: {1}")]
    Read(PathBuf, String),
    #[error("{0} holds no certificate (PEM)")]
    NoCertificate(PathBuf),
    #[error("--peer-tls-cert {0} and --peer-tls-key {1} do not make a server key: {2}")]
    Server(PathBuf, PathBuf, rustls::Error),
}

/// A member's TLS: its server's configuration and the authorities it trusts.
#[derive(Clone)]
pub struct PeerTls {
    pub server: Arc<rustls::ServerConfig>,
    pub roots: Arc<Vec<ureq::tls::Certificate<'static>>>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

/// The crypto of every TLS connection: ring's.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl PeerTls {
    /// The TLS of a member serving with the certificate chain in `cert` and the private key in
    /// `key`, trusting the authorities in `ca` (all PEM files).
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<PeerTls, TlsError> {
        let read = |p: &Path| std::fs::read(p).map_err(|e| TlsError::Read(p.into(), e.to_string()));
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
            .collect::<Result<_, _>>()
            .map_err(|e| TlsError::Read(cert.into(), e.to_string()))?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate(cert.into()));
        }
        let private = PrivateKeyDer::from_pem_slice(&read(key)?)
            .map_err(|e| TlsError::Read(key.into(), format!("no private key (PEM): {e}")))?;
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, private))
            .map_err(|e| TlsError::Server(cert.into(), key.into(), e))?;
        let roots: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&read(ca)?)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if roots.is_empty() {
            return Err(TlsError::NoCertificate(ca.into()));
        }
        Ok(PeerTls {
            server: Arc::new(server),
            roots: Arc::new(roots),
        })
    }

    /// How the peer tier's client trusts the members.
    pub fn client(&self) -> ureq::tls::TlsConfig {
        ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(ureq::tls::RootCerts::Specific(self.roots.clone()))
            .build()
    }
}
