//! The store's client: configured from the environment, with its timeout and retries.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;

use super::counting::{Counters, CountingConnector};
use super::profile;
use super::url::ObjectUrl;

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

/// The store of `url`, configured from the environment and the AWS profile files, with
/// every request counted.
pub(super) fn build_store(
    url: &ObjectUrl,
    counters: Arc<Counters>,
) -> io::Result<Arc<dyn ObjectStore>> {
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
    // An endpoint written as http:// says plain HTTP, as it does to the AWS CLI.
    let allow_http = AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp);
    let plain = (builder.get_config_value(&AmazonS3ConfigKey::Endpoint))
        .is_some_and(|e| e.starts_with("http://"));
    if plain && std::env::var_os("AWS_ALLOW_HTTP").is_none() {
        builder = builder.with_config(allow_http, "true");
    }
    let timeout = format!("{}ms", request_timeout()?.as_millis());
    builder = builder.with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), timeout);
    let store = builder
        .with_retry(retries())
        .with_http_connector(CountingConnector(counters))
        .build()
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(Arc::new(store))
}
