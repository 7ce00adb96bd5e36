//! The store's client: configured from the environment, with its timeout and retries.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;

use super::counting::{Counters, CountingConnector};
use super::direct::Direct;
use super::profile;
use super::url::{Cloud, ObjectUrl};

/// The request timeout: long enough for a block of a few megabytes over a slow link, short
/// enough that a stalled connection is retried. `COORFS_S3_TIMEOUT` sets another.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The request timeout: `COORFS_S3_TIMEOUT` (a duration: `500ms`, `10s`), else [`TIMEOUT`].
fn request_timeout() -> io::Result<Duration> {
    match std::env::var("COORFS_S3_TIMEOUT") {
        Err(_) => Ok(TIMEOUT),
        Ok(text) => match crate::units::parse_duration(&text) {
            Ok(d) if !d.is_zero() => Ok(d),
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "COORFS_S3_TIMEOUT must be more than 0",
            )),
            Err(e) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("COORFS_S3_TIMEOUT: {e}"),
            )),
        },
    }
}
/// How long a request is retried: long enough to outlast a store down for a few seconds (a
/// restart, a failover, a network blip), not so long that a store that is gone keeps the
/// reader waiting for minutes.
const RETRY_FOR: Duration = Duration::from_secs(45);

/// The retries of a request that failed with a 5xx answer, 429 or 408, a timeout or a broken
/// or refused connection: until [`RETRY_FOR`] has passed since it was first sent, with backoff
/// and jitter growing from 0.2 s to at most 8 s between tries (object_store's decorrelated
/// jitter: each wait is drawn between 0.2 s and 3 times the last). object_store's default, 10
/// tries from 0.1 s growing by 2 at most, gave up after 2-3 s: a store down for 8 s failed
/// the read with EIO. Other answers (403, 404, 412) are not retried.
fn retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(8),
            base: 3.0,
        },
        // The time is the limit, not the count (about 11 tries in 45 s).
        max_retries: 100,
        retry_timeout: RETRY_FOR,
    }
}

/// The store of `url`, configured from the environment the way each cloud's own tools are,
/// with every request counted and the same timeout and retries everywhere: the three
/// clouds differ only here. With it, for S3 at an `http://` endpoint, the client that reads
/// GETs' bodies from the socket ([`direct_for`]).
pub(super) fn build_store(
    url: &ObjectUrl,
    counters: Arc<Counters>,
) -> io::Result<(Arc<dyn ObjectStore>, Option<Direct>)> {
    let limit = request_timeout()?;
    let timeout = format!("{}ms", limit.as_millis());
    let connector = CountingConnector(counters.clone());
    let mut direct = None;
    let built: object_store::Result<Arc<dyn ObjectStore>> = match url.cloud {
        Cloud::S3 => {
            let builder = s3(url, timeout);
            let direct_on = direct_for(&builder, &env)?;
            let built = (builder.with_retry(retries()))
                .with_http_connector(connector)
                .build();
            built.map(|s| {
                let s = Arc::new(s);
                if direct_on {
                    direct = Some(Direct::new(s.clone(), limit, counters));
                }
                s as _
            })
        }
        Cloud::Gcs => gcs(url, timeout, &env)
            .with_retry(retries())
            .with_http_connector(connector)
            .build()
            .map(|s| Arc::new(s) as _),
        Cloud::Azure => azure(url, timeout, &env)
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?
            .with_retry(retries())
            .with_http_connector(connector)
            .build()
            .map(|s| Arc::new(s) as _),
    };
    Ok((built.map_err(|e| io::Error::other(e.to_string()))?, direct))
}

/// True if GETs of the S3 store `builder` makes are read from the socket ([`super::direct`]):
/// its endpoint is `http://`, its requests are signed, with no SSE-C key (whose headers only
/// object_store sends) and no proxy (which only object_store's client honours), and
/// `COORFS_S3_DIRECT` is not `0`.
fn direct_for(
    builder: &object_store::aws::AmazonS3Builder,
    env: &dyn Fn(&str) -> Option<String>,
) -> io::Result<bool> {
    use object_store::aws::AmazonS3ConfigKey as K;
    let asked = match env("COORFS_S3_DIRECT").as_deref() {
        None | Some("1") => true,
        Some("0") => false,
        Some(other) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("COORFS_S3_DIRECT must be 0 or 1, not \"{other}\""),
            ));
        }
    };
    let config = |key| builder.get_config_value(&key);
    let plain = config(K::Endpoint).is_some_and(|e| e.starts_with("http://"));
    let unsigned = config(K::SkipSignature).is_some_and(|v| v == "true");
    // The key is not exported under its own name.
    let ssec = ("aws_sse_customer_key_base64".parse::<K>()).is_ok_and(|k| config(k).is_some());
    let proxy = ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
        .iter()
        .any(|v| env(v).is_some());
    Ok(asked && plain && !unsigned && !ssec && !proxy)
}

/// The process's environment variable `name`, if set and not empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// S3 as the AWS tools see it: `AWS_ENDPOINT_URL`, `AWS_REGION`, the keys (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), else the profile files ([`profile`]), else
/// instance metadata. An `http://` endpoint says plain HTTP, as it does to the AWS CLI.
fn s3(url: &ObjectUrl, timeout: String) -> object_store::aws::AmazonS3Builder {
    use object_store::ClientConfigKey;
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
    // Keys from the environment are a set: none of the profile's is mixed in with them.
    let env_keys = builder
        .get_config_value(&AmazonS3ConfigKey::AccessKeyId)
        .is_some();
    for (key, value) in profile::settings(&profile::Files::from_env()) {
        let Ok(key) = key.parse::<AmazonS3ConfigKey>() else {
            continue;
        };
        let credential = matches!(
            key,
            AmazonS3ConfigKey::AccessKeyId
                | AmazonS3ConfigKey::SecretAccessKey
                | AmazonS3ConfigKey::Token
        );
        if !(credential && env_keys) && builder.get_config_value(&key).is_none() {
            builder = builder.with_config(key, value);
        }
    }
    let allow_http = AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp);
    let plain = (builder.get_config_value(&AmazonS3ConfigKey::Endpoint))
        .is_some_and(|e| e.starts_with("http://"));
    if plain && std::env::var_os("AWS_ALLOW_HTTP").is_none() {
        builder = builder.with_config(allow_http, "true");
    }
    builder.with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), timeout)
}

/// GCS as Google's client libraries see it: `GOOGLE_APPLICATION_CREDENTIALS` (a service
/// account's key or a user's), else gcloud's application default credentials, else the
/// metadata server of the VM or pod; `STORAGE_EMULATOR_HOST` names an emulator (fake-gcs-server),
/// which takes requests unsigned. object_store reads the `GOOGLE_*` variables itself.
fn gcs(
    url: &ObjectUrl,
    timeout: String,
    env: &dyn Fn(&str) -> Option<String>,
) -> object_store::gcp::GoogleCloudStorageBuilder {
    use object_store::ClientConfigKey;
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    let mut builder = GoogleCloudStorageBuilder::from_env().with_bucket_name(&url.bucket);
    if let Some(host) = env("STORAGE_EMULATOR_HOST") {
        let base = if host.contains("://") {
            host
        } else {
            format!("http://{host}")
        };
        let plain = base.starts_with("http://");
        builder = builder
            .with_config(GoogleConfigKey::BaseUrl, base.trim_end_matches('/'))
            .with_config(GoogleConfigKey::SkipSignature, "true");
        if plain {
            builder =
                builder.with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "true");
        }
    }
    builder.with_config(GoogleConfigKey::Client(ClientConfigKey::Timeout), timeout)
}

/// Azure Blob Storage as the Azure CLI and SDKs see it: the account of an `https://` URL, else
/// `AZURE_STORAGE_ACCOUNT`; a key (`AZURE_STORAGE_KEY`), a SAS (`AZURE_STORAGE_SAS_TOKEN`) or a
/// connection string (`AZURE_STORAGE_CONNECTION_STRING`, Azurite's too), else a service
/// principal, workload or managed identity (object_store's `AZURE_*` variables, and the
/// instance metadata service). `AZURE_STORAGE_USE_EMULATOR=true` is Azurite at
/// `AZURITE_BLOB_STORAGE_URL` (default `http://127.0.0.1:10000`). A missing account is one
/// line that says what to set.
fn azure(
    url: &ObjectUrl,
    timeout: String,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<object_store::azure::MicrosoftAzureBuilder, String> {
    use object_store::ClientConfigKey;
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    let mut builder = MicrosoftAzureBuilder::from_env().with_container_name(&url.bucket);
    for (key, value) in azure_settings(url, env)? {
        builder = builder.with_config(key, value);
    }
    let emulator =
        (builder.get_config_value(&AzureConfigKey::UseEmulator)).is_some_and(|v| v == "true");
    if !emulator
        && builder
            .get_config_value(&AzureConfigKey::AccountName)
            .is_none()
    {
        return Err(format!(
            "no Azure storage account: set AZURE_STORAGE_ACCOUNT (and AZURE_STORAGE_KEY or \
             AZURE_STORAGE_SAS_TOKEN, else a managed identity signs), or \
             AZURE_STORAGE_CONNECTION_STRING, or mount https://ACCOUNT.blob.core.windows.net/{}/...",
            url.bucket
        ));
    }
    Ok(builder.with_config(AzureConfigKey::Client(ClientConfigKey::Timeout), timeout))
}

/// The settings of an Azure store beside object_store's own `AZURE_*` variables: the
/// account an `https://` URL names, the Azure CLI's variables, and a connection string's
/// fields. A malformed connection string is an error that says so.
fn azure_settings(
    url: &ObjectUrl,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(object_store::azure::AzureConfigKey, String)>, String> {
    use object_store::ClientConfigKey;
    use object_store::azure::AzureConfigKey as K;
    let mut out = Vec::new();
    if let Some(text) = env("AZURE_STORAGE_CONNECTION_STRING") {
        for field in text.split(';').map(str::trim).filter(|f| !f.is_empty()) {
            let (name, value) = field.split_once('=').ok_or_else(|| {
                format!("AZURE_STORAGE_CONNECTION_STRING: \"{field}\" is no NAME=VALUE field")
            })?;
            let value = value.to_string();
            match name {
                "AccountName" => out.push((K::AccountName, value)),
                "AccountKey" => out.push((K::AccessKey, value)),
                "SharedAccessSignature" => out.push((K::SasKey, value)),
                "UseDevelopmentStorage" if value == "true" => out.push((K::UseEmulator, value)),
                "BlobEndpoint" => {
                    if value.starts_with("http://") {
                        out.push((K::Client(ClientConfigKey::AllowHttp), "true".into()));
                    }
                    out.push((K::Endpoint, value.trim_end_matches('/').to_string()));
                }
                _ => {}
            }
        }
    }
    if let Some(account) = env("AZURE_STORAGE_ACCOUNT") {
        out.push((K::AccountName, account));
    }
    if let Some(key) = env("AZURE_STORAGE_KEY") {
        out.push((K::AccessKey, key));
    }
    if let Some(account) = &url.account {
        out.push((K::AccountName, account.clone()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::azure::AzureConfigKey as K;

    #[test]
    fn azure_reads_the_cli_variables_a_connection_string_and_the_urls_account() {
        let url = ObjectUrl::parse(std::path::Path::new("az://data/train")).unwrap();
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let cs = vars(&[(
            "AZURE_STORAGE_CONNECTION_STRING",
            "DefaultEndpointsProtocol=http;AccountName=dev;AccountKey=a2V5;\
             BlobEndpoint=http://127.0.0.1:10000/dev;",
        )]);
        let got = azure_settings(&url, &cs).unwrap();
        assert!(got.contains(&(K::AccountName, "dev".into())));
        assert!(got.contains(&(K::AccessKey, "a2V5".into())));
        assert!(got.contains(&(K::Endpoint, "http://127.0.0.1:10000/dev".into())));
        let cli = vars(&[
            ("AZURE_STORAGE_ACCOUNT", "acct"),
            ("AZURE_STORAGE_KEY", "k"),
        ]);
        let got = azure_settings(&url, &cli).unwrap();
        assert_eq!(
            got,
            [(K::AccountName, "acct".into()), (K::AccessKey, "k".into())]
        );
        let https = ObjectUrl::parse(std::path::Path::new(
            "https://mine.blob.core.windows.net/data/train",
        ))
        .unwrap();
        // The URL's account wins: it is the last said.
        assert_eq!(
            azure_settings(&https, &cli).unwrap().last().unwrap().1,
            "mine"
        );
        let bad = vars(&[("AZURE_STORAGE_CONNECTION_STRING", "AccountName")]);
        assert_eq!(
            azure_settings(&url, &bad).unwrap_err(),
            "AZURE_STORAGE_CONNECTION_STRING: \"AccountName\" is no NAME=VALUE field"
        );
    }
}
