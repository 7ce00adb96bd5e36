//! Where a dataset lives: the source's URL, and the store's keys of the dataset's paths.

use std::io;
use std::path::{Path, PathBuf};

use object_store::path::Path as Key;

/// The URL scheme of an S3 source.
pub const SCHEME: &str = "s3://";

/// Where a dataset lives in an object store: `s3://BUCKET/PREFIX`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectUrl {
    pub bucket: String,
    /// The key prefix, without a leading or trailing `/` (empty: the whole bucket).
    pub prefix: String,
}

impl ObjectUrl {
    /// True if `source` names an object store (`s3://...`) rather than a directory.
    pub fn is_url(source: &Path) -> bool {
        source
            .as_os_str()
            .as_encoded_bytes()
            .starts_with(SCHEME.as_bytes())
    }

    /// Parses `s3://BUCKET[/PREFIX]`.
    pub fn parse(source: &Path) -> Result<Self, String> {
        let text = source
            .to_str()
            .ok_or_else(|| format!("{}: not UTF-8", source.display()))?;
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| format!("{text}: not an s3:// URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b));
        if !valid_bucket {
            return Err(format!(
                "{text}: \"{bucket}\" is not a bucket name (3 to 63 of a-z, 0-9, '-', '.')"
            ));
        }
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
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
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
    pub(super) fn key(&self, rel: &Path) -> io::Result<Key> {
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

/// The store's key `text`, as written. `Key::from` percent-encodes `?`, `#`, `%`, `\` and
/// non-ASCII characters into the key itself, and the request's URL then encodes them again: a
/// GET of `q?x.bin` asked for `q%253Fx.bin` and found nothing. The listing's keys are parsed
/// the same way (`Key::parse`), so every path of the tree is one; any other names no object.
pub(super) fn key_of(text: &str) -> io::Result<Key> {
    Key::parse(text).map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))
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
                bucket: "my-bucket".into(),
                prefix: "train/images".into()
            }
        );
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
