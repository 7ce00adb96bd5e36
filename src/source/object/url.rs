//! Where a dataset lives: the source's URL, and the store's keys of the dataset's paths.

use std::path::{Path, PathBuf};

use object_store::path::Path as Key;

use crate::source::{SourceError, SourceResult};

/// The object stores a source may name, each by its URL scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cloud {
    /// `s3://BUCKET/PREFIX`: Amazon S3 or an S3-compatible store.
    S3,
    /// `gs://BUCKET/PREFIX`: Google Cloud Storage.
    Gcs,
    /// `az://CONTAINER/PREFIX` or `https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX`:
    /// Azure Blob Storage.
    Azure,
}

/// The URL schemes of object stores, with the cloud of each.
pub const SCHEMES: [(&str, Cloud); 4] = [
    ("s3://", Cloud::S3),
    ("gs://", Cloud::Gcs),
    ("az://", Cloud::Azure),
    ("https://", Cloud::Azure),
];

/// The host of an Azure storage account's blob service is `ACCOUNT` and this.
const AZURE_BLOB_HOST: &str = ".blob.core.windows.net";

/// Where a dataset lives in an object store: `s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX`,
/// `az://CONTAINER/PREFIX` or `https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectUrl {
    pub cloud: Cloud,
    /// The bucket, or Azure's container.
    pub bucket: String,
    /// The key prefix, without a leading or trailing `/` (empty: the whole bucket).
    pub prefix: String,
    /// The Azure storage account an `https://` URL names (else the environment's).
    pub account: Option<String>,
}

impl ObjectUrl {
    /// True if `source` names an object store (`s3://`, `gs://`, `az://`, `https://`) rather
    /// than a directory.
    pub fn is_url(source: &Path) -> bool {
        let bytes = source.as_os_str().as_encoded_bytes();
        SCHEMES.iter().any(|(s, _)| bytes.starts_with(s.as_bytes()))
    }

    /// Parses the URL of an object store's prefix; an error says what is wrong in one line.
    pub fn parse(source: &Path) -> Result<Self, String> {
        let text = source
            .to_str()
            .ok_or_else(|| format!("{}: not UTF-8", source.display()))?;
        let (rest, cloud) = (SCHEMES.iter())
            .find_map(|(scheme, cloud)| Some((text.strip_prefix(scheme)?, *cloud)))
            .ok_or_else(|| format!("{text}: not an s3://, gs:// or az:// URL"))?;
        let (mut bucket, mut prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let mut account = None;
        if text.starts_with("https://") {
            let name = (bucket.strip_suffix(AZURE_BLOB_HOST))
                .filter(|a| (3..=24).contains(&a.len()))
                .filter(|a| {
                    a.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                })
                .ok_or_else(|| {
                    format!(
                        "{text}: an https:// source is an Azure storage account's blob service: \
                         https://ACCOUNT{AZURE_BLOB_HOST}/CONTAINER/PREFIX"
                    )
                })?;
            account = Some(name.to_string());
            (bucket, prefix) = prefix.split_once('/').unwrap_or((prefix, ""));
        }
        check_bucket(text, cloud, bucket)?;
        let prefix = prefix.trim_matches('/');
        if prefix
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
            && !prefix.is_empty()
        {
            return Err(format!(
                "{text}: the prefix has an empty, '.' or '..' component"
            ));
        }
        Ok(ObjectUrl {
            cloud,
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            account,
        })
    }

    /// The URL, for messages and the stats: as given, with no trailing `/`.
    pub fn name(&self) -> PathBuf {
        let (scheme, bucket) = match (self.cloud, &self.account) {
            (Cloud::S3, _) => ("s3://", self.bucket.clone()),
            (Cloud::Gcs, _) => ("gs://", self.bucket.clone()),
            (Cloud::Azure, None) => ("az://", self.bucket.clone()),
            (Cloud::Azure, Some(a)) => {
                ("https://", format!("{a}{AZURE_BLOB_HOST}/{}", self.bucket))
            }
        };
        PathBuf::from(format!("{scheme}{bucket}/{}", self.prefix))
    }

    /// The key prefix of directory `rel` (relative to the dataset's root), ending in `/`
    /// unless it is the bucket's root.
    pub(super) fn dir_prefix(&self, rel: &Path) -> String {
        let mut p = self.prefix.clone();
        for c in rel.components() {
            if !p.is_empty() {
                p.push('/');
            }
            p.push_str(&c.as_os_str().to_string_lossy());
        }
        if !p.is_empty() {
            p.push('/');
        }
        p
    }

    /// The key of file `rel` (or of the prefix of directory `rel`, without its `/`).
    pub(super) fn key(&self, rel: &Path) -> SourceResult<Key> {
        key_of(self.dir_prefix(rel).trim_end_matches('/'))
    }

    /// The path of `key` relative to the dataset's root, if it is beneath the prefix and a
    /// safe path: no empty, `.` or `..` component, no NUL.
    pub(super) fn rel_of(&self, key: &str) -> Option<PathBuf> {
        let rest = if self.prefix.is_empty() {
            key
        } else {
            key.strip_prefix(&self.prefix)?.strip_prefix('/')?
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let safe = parts
            .iter()
            .all(|c| !c.is_empty() && *c != "." && *c != ".." && !c.contains('\0'));
        safe.then(|| parts.iter().collect())
    }
}

/// Checks `bucket` against the naming rules of `cloud`, so that a typo is one clear line
/// before any request: S3's 3 to 63 of a-z, 0-9, `-`, `.`; GCS's the same and `_`; Azure's
/// containers 3 to 63 of a-z, 0-9, `-`.
fn check_bucket(text: &str, cloud: Cloud, bucket: &str) -> Result<(), String> {
    let (what, extra): (&str, &[u8]) = match cloud {
        Cloud::S3 => ("a bucket name (3 to 63 of a-z, 0-9, '-', '.')", b"-."),
        Cloud::Gcs => ("a bucket name (3 to 63 of a-z, 0-9, '-', '_', '.')", b"-_."),
        Cloud::Azure => ("a container name (3 to 63 of a-z, 0-9, '-')", b"-"),
    };
    let valid = (3..=63).contains(&bucket.len())
        && (bucket.bytes())
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || extra.contains(&b));
    if valid {
        Ok(())
    } else {
        Err(format!("{text}: \"{bucket}\" is not {what}"))
    }
}

/// The store's key `text`, as written. `Key::from` percent-encodes `?`, `#`, `%`, `\` and
/// non-ASCII characters into the key itself, and the request's URL then encodes them again: a
/// GET of `q?x.bin` asked for `q%253Fx.bin` and found nothing. The listing's keys are parsed
/// the same way (`Key::parse`), so every path of the tree is one; any other names no object.
pub(super) fn key_of(text: &str) -> SourceResult<Key> {
    Key::parse(text).map_err(|_| SourceError::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Result<ObjectUrl, String> {
        ObjectUrl::parse(Path::new(s))
    }

    #[test]
    fn urls_parse_and_bad_ones_say_why() {
        assert_eq!(
            url("s3://my-bucket/train/images/").unwrap(),
            ObjectUrl {
                cloud: Cloud::S3,
                bucket: "my-bucket".into(),
                prefix: "train/images".into(),
                account: None,
            }
        );
        let gs = url("gs://my_bucket/train/").unwrap();
        assert_eq!(
            (gs.cloud, gs.bucket.as_str(), gs.prefix.as_str()),
            (Cloud::Gcs, "my_bucket", "train")
        );
        assert_eq!(gs.name(), Path::new("gs://my_bucket/train"));
        let az = url("az://data/train").unwrap();
        assert_eq!((az.cloud, az.account.clone()), (Cloud::Azure, None));
        let https = url("https://acct1.blob.core.windows.net/data/train/x").unwrap();
        assert_eq!(
            (
                https.cloud,
                https.account.as_deref(),
                https.bucket.as_str(),
                https.prefix.as_str()
            ),
            (Cloud::Azure, Some("acct1"), "data", "train/x")
        );
        assert_eq!(
            https.name(),
            Path::new("https://acct1.blob.core.windows.net/data/train/x")
        );
        assert_eq!(
            url("az://my_container/x").unwrap_err(),
            "az://my_container/x: \"my_container\" is not a container name (3 to 63 of a-z, 0-9, '-')"
        );
        assert!(
            url("https://example.com/x")
                .unwrap_err()
                .contains("Azure storage account")
        );
        assert_eq!(
            url("ftp://x/y").unwrap_err(),
            "ftp://x/y: not an s3://, gs:// or az:// URL"
        );
        assert!(ObjectUrl::is_url(Path::new("gs://b/p")));
        assert_eq!(url("s3://bkt").unwrap().prefix, "");
        assert!(
            url("s3://Bad_Bucket/x")
                .unwrap_err()
                .contains("not a bucket name")
        );
        assert!(url("s3://bkt/a/../b").unwrap_err().contains("'..'"));
        assert!(url("s3://bkt/a//b").unwrap_err().contains("empty"));
        assert!(ObjectUrl::is_url(Path::new("s3://b/p")));
        assert!(!ObjectUrl::is_url(Path::new("/data")));
    }

    #[test]
    fn keys_map_to_safe_paths_beneath_the_prefix() {
        let u = url("s3://bkt/data").unwrap();
        assert_eq!(u.rel_of("data/a/b.jpg"), Some(PathBuf::from("a/b.jpg")));
        assert_eq!(u.rel_of("database/x"), None);
        assert_eq!(u.rel_of("data/a/../etc"), None);
        assert_eq!(u.rel_of("data/a//b"), None);
        assert_eq!(u.rel_of("data/dir/"), None);
        assert_eq!(
            u.key(Path::new("a/b.jpg")).unwrap().as_ref(),
            "data/a/b.jpg"
        );
        // As listed: not percent-encoded (the request's URL encodes it, once).
        let odd = "data/d?#%/\\\u{fc}ber 100%.bin";
        assert_eq!(
            u.rel_of(odd),
            Some(PathBuf::from("d?#%/\\\u{fc}ber 100%.bin"))
        );
        assert_eq!(u.key(&u.rel_of(odd).unwrap()).unwrap().as_ref(), odd);
        assert_eq!(u.dir_prefix(Path::new("a")), "data/a/");
        assert_eq!(u.dir_prefix(Path::new("")), "data/");
        let root = url("s3://bkt").unwrap();
        assert_eq!(root.dir_prefix(Path::new("")), "");
        assert_eq!(root.rel_of("x"), Some(PathBuf::from("x")));
    }
}
