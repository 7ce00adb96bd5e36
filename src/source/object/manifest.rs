//! A manifest: the objects of a prefix, one a line, so that a mount lists nothing
//! (`--manifest FILE`); `coorfs manifest URL` writes one from a listing.
//!
//! A line is `KEY<TAB>SIZE<TAB>ETAG`, and optionally `<TAB>LAST_MODIFIED` (RFC 3339); KEY is
//! the object's whole key in the bucket, as listed (keys outside the prefix are skipped).
//! Lines starting with `#` and blank lines are skipped. Without a time an object takes the
//! manifest file's. A line that is none of this fails the mount with its number and why.

use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectMeta;
use object_store::path::Path as Key;

use super::tree::{Object, drop_markers};
use super::url::ObjectUrl;

/// A manifest's objects by folder: each object's name, size, time and ETag.
pub(super) type Folders = std::collections::HashMap<PathBuf, Vec<(Box<str>, Object)>>;

/// The objects `file` lists beneath `url`'s prefix, by the folder beneath it that holds them:
/// the tree's compact entries straight away (a million lines are read in a second, with no
/// object held twice).
pub(super) fn read(file: &Path, url: &ObjectUrl) -> io::Result<Folders> {
    let fail = |e: io::Error| io::Error::new(e.kind(), format!("manifest {}: {e}", file.display()));
    let f = std::fs::File::open(file).map_err(fail)?;
    let written: chrono::DateTime<chrono::Utc> = f
        .metadata()
        .and_then(|m| m.modified())
        .map_err(fail)?
        .into();
    let mut folders = Folders::new();
    for (n, line) in io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(fail)?;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "manifest {} line {}: {why}: KEY<TAB>SIZE<TAB>ETAG[<TAB>LAST_MODIFIED] expected",
                    file.display(),
                    n + 1
                ),
            )
        };
        let fields: Vec<&str> = line.split('\t').collect();
        if !(3..=4).contains(&fields.len()) {
            return Err(bad(&format!("{} fields", fields.len())));
        }
        let size: u64 = fields[1]
            .parse()
            .map_err(|_| bad(&format!("size {:?} is no number", fields[1])))?;
        let last_modified: chrono::DateTime<chrono::Utc> = match fields.get(3) {
            Some(t) => chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|_| bad(&format!("time {t:?} is not RFC 3339")))?
                .into(),
            None => written,
        };
        Key::parse(fields[0]).map_err(|_| bad(&format!("key {:?} is no safe path", fields[0])))?;
        let Some(rel) = url.rel_of(fields[0]) else {
            continue;
        };
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name().and_then(|n| n.to_str()))
        else {
            continue;
        };
        let etag = Some(fields[2]).filter(|t| !t.is_empty());
        let mtime_ns = last_modified.timestamp_nanos_opt().unwrap_or(0);
        let object = Object::of(size, mtime_ns, etag);
        match folders.get_mut(parent) {
            Some(entries) => entries.push((name.into(), object)),
            None => {
                folders.insert(parent.to_path_buf(), vec![(name.into(), object)]);
            }
        }
    }
    Ok(folders)
}

/// Writes the manifest of `objects` to `out`, a header line first.
pub fn write(name: &Path, objects: &[ObjectMeta], out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "# coorfs manifest of {}: KEY, SIZE, ETAG, LAST_MODIFIED",
        name.display()
    )?;
    for o in objects {
        writeln!(
            out,
            "{}\t{}\t{}\t{}",
            o.location,
            o.size,
            o.e_tag.as_deref().unwrap_or(""),
            o.last_modified.to_rfc3339()
        )?;
    }
    Ok(())
}

/// Lists all of `url` (in parallel across its first levels' prefixes) and writes its
/// manifest to `out`; returns the objects' number.
pub fn list_and_write(url: &ObjectUrl, out: &mut dyn Write) -> io::Result<usize> {
    let counters = Arc::new(super::Counters::default());
    let (store, _) = super::store::build_store(url, counters)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let name = url.name();
    let (prefix, listed_name) = (url.prefix.clone(), name.clone());
    let objects = runtime
        .block_on(async move { super::listing::list_all(store, &prefix, &listed_name).await })?;
    // A folder marker `k/` lists as `k` (the client drops its `/`): beside an object `k`, the
    // object is kept ([`drop_markers`]).
    let keyed = (objects.into_iter())
        .map(|o| (PathBuf::from(o.location.as_ref()), o))
        .collect();
    let objects: Vec<ObjectMeta> = drop_markers(keyed).0.into_iter().map(|(_, o)| o).collect();
    write(&name, &objects, out)?;
    Ok(objects.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_reads_back_what_was_written_and_a_bad_line_says_where() {
        let url = ObjectUrl::parse(Path::new("s3://bkt/data")).unwrap();
        let t = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let o = |key: &str, size| ObjectMeta {
            location: Key::parse(key).unwrap(),
            last_modified: t,
            size,
            e_tag: Some("\"abc\"".into()),
            version: None,
        };
        let mut text = Vec::new();
        write(
            &url.name(),
            &[o("data/a/x 1%.bin", 5), o("data/b", 0), o("other/c", 1)],
            &mut text,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m");
        std::fs::write(&file, &text).unwrap();
        let back = read(&file, &url).unwrap();
        let mut got: Vec<(PathBuf, u64, Option<String>, i64)> = (back.iter())
            .flat_map(|(dir, files)| {
                files
                    .iter()
                    .map(move |(n, o)| (dir.join(&**n), o.size, o.etag.text(), o.mtime_ns))
            })
            .collect();
        got.sort();
        let t_ns = t.timestamp_nanos_opt().unwrap();
        assert_eq!(
            got,
            [
                (
                    PathBuf::from("a/x 1%.bin"),
                    5,
                    Some("\"abc\"".to_string()),
                    t_ns
                ),
                (PathBuf::from("b"), 0, Some("\"abc\"".to_string()), t_ns)
            ]
        );
        std::fs::write(&file, "# header\ndata/a\t12\t\"e\"\ndata/b\tlots\t\"e\"\n").unwrap();
        let e = read(&file, &url).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "manifest {} line 3: size \"lots\" is no number: KEY<TAB>SIZE<TAB>ETAG[<TAB>LAST_MODIFIED] expected",
                file.display()
            )
        );
    }
}
