//! `coorfs stats`: reads the `user.coorfs.stats` document of a mount and prints it for
//! people: every stat by its own name (the same name as its attribute and JSON key), then
//! the epochs as a table.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::stats::{DataWait, STATS_XATTR, Stat, Unit};
use crate::units::format_size;

/// Why the stats could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("{0} is not a coorfs mount")]
    NotMounted(PathBuf),
    #[error("{0}: {1}")]
    Read(PathBuf, io::Error),
    #[error("{0}: the daemon's statistics are not valid JSON: {1}")]
    Garbled(PathBuf, serde_json::Error),
}

/// The stats document of the mount at `mnt`.
pub fn fetch(mnt: &Path) -> Result<Json, StatsError> {
    let abs = std::path::absolute(mnt).unwrap_or_else(|_| mnt.to_path_buf());
    if !crate::mountinfo::is_coorfs_mount(&abs) {
        return Err(StatsError::NotMounted(abs));
    }
    let raw = xattr::get(&abs, STATS_XATTR)
        .map_err(|e| StatsError::Read(abs.clone(), e))?
        .ok_or_else(|| StatsError::NotMounted(abs.clone()))?;
    serde_json::from_slice(&raw).map_err(|e| StatsError::Garbled(abs, e))
}

/// Field `key` of a JSON record, as a number (0 if missing).
pub fn number(doc: &Json, key: &str) -> f64 {
    doc.get(key).and_then(Json::as_f64).unwrap_or(0.0)
}

fn show(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Count => format!("{}", v as u64),
        Unit::Bytes => format!("{} ({})", v as u64, format_size(v as u64)),
        Unit::Ratio => format!("{v:.4} ({:.1}%)", v * 100.0),
        Unit::Seconds => format!("{v:.2}s"),
        Unit::Text => String::new(),
    }
}

/// The epochs of `records` (a JSON array of epoch records) as a table; in a cluster, with
/// what came from peers and how often a peer failed (the read went to the source).
pub fn epoch_table(records: &[Json], out: &mut String) {
    let cluster = records
        .iter()
        .any(|r| number(r, "bytes_from_peers") > 0.0 || number(r, "peer_fallbacks") > 0.0);
    let _ = write!(
        out,
        "{:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>12} {:>12} {:>9} {:>9} {:>9}",
        "epoch",
        "files",
        "reads",
        "hit rate",
        "byte hit",
        "staged",
        "from cache",
        "from source",
        "stall s",
        "data wait",
        "seconds"
    );
    if cluster {
        let _ = write!(out, " {:>12} {:>10}", "from peers", "peer fails");
    }
    out.push_str("  state\n");
    for r in records {
        let state = if r.get("complete").and_then(Json::as_bool) == Some(true) {
            "complete"
        } else {
            "running"
        };
        let _ = write!(
            out,
            "{:>6} {:>9} {:>9} {:>8.1}% {:>8.1}% {:>8} {:>12} {:>12} {:>9.2} {:>9} {:>9.2}",
            number(r, "epoch") as u64,
            number(r, "files") as u64,
            number(r, "reads") as u64,
            number(r, "hit_rate") * 100.0,
            number(r, "byte_hit_rate") * 100.0,
            number(r, "staging_hits") as u64,
            format_size(number(r, "bytes_from_cache") as u64),
            format_size(number(r, "bytes_from_source") as u64),
            number(r, "fetch_stall_seconds"),
            DataWait::of_record(r).map_or("-".into(), |w| format!("{:.0}%", w.share * 100.0)),
            number(r, "seconds"),
        );
        if cluster {
            let _ = write!(
                out,
                " {:>12} {:>10}",
                format_size(number(r, "bytes_from_peers") as u64),
                number(r, "peer_fallbacks") as u64
            );
        }
        let _ = writeln!(out, "  {state}");
    }
}

/// The readable form of a stats document.
pub fn render(doc: &Json) -> String {
    let mut out = String::new();
    let text = |k: &str| doc.get(k).and_then(Json::as_str).unwrap_or("?").to_string();
    let _ = writeln!(
        out,
        "coorfs {}  (source {}, policy {})",
        text("mountpoint"),
        text("source"),
        text("policy")
    );
    if let Some(cluster) = doc.get("cluster").and_then(Json::as_str) {
        let _ = writeln!(out, "  cluster: {cluster}");
        for member in doc
            .get("members")
            .and_then(Json::as_str)
            .into_iter()
            .flat_map(|m| m.split("; "))
        {
            let _ = writeln!(out, "    {member}");
        }
    }
    let width = Stat::ALL.iter().map(|s| s.name().len()).max().unwrap_or(0);
    for stat in Stat::ALL {
        let _ = writeln!(
            out,
            "  {:<width$}  {}",
            stat.name(),
            match stat.unit() {
                Unit::Text => doc
                    .get(stat.name())
                    .and_then(Json::as_str)
                    .unwrap_or("-")
                    .to_string(),
                unit => show(unit, number(doc, stat.name())),
            }
        );
    }
    if let Some(requests) = doc.get("requests").and_then(Json::as_object)
        && !requests.is_empty()
    {
        out.push_str("\nFUSE requests answered (count, and the daemon's time on each)\n");
        for (op, r) in requests {
            let (n, secs) = (number(r, "count"), number(r, "seconds"));
            let each = if n > 0.0 { secs / n * 1e6 } else { 0.0 };
            let _ = writeln!(out, "  {op:<12} {:>12} {each:>9.1} us", n as u64);
        }
    }
    let records = doc
        .get("epochs")
        .and_then(Json::as_array)
        .cloned()
        .unwrap_or_default();
    if !records.is_empty() {
        out.push_str("\ndataset epochs (an epoch ends when every file has been read once more)\n");
        epoch_table(&records, &mut out);
    }
    for job in doc
        .get("jobs")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
    {
        let active = job.get("active").and_then(Json::as_bool) == Some(true);
        let _ = writeln!(
            out,
            "\njob {} ({}, epoch {}, order hint of {} files, idle {:.1}s)",
            job.get("job").and_then(Json::as_str).unwrap_or("?"),
            if active { "active" } else { "forgotten" },
            number(job, "epoch") as u64,
            number(job, "hint_files") as u64,
            number(job, "idle_seconds"),
        );
        let records = job
            .get("epochs")
            .and_then(Json::as_array)
            .cloned()
            .unwrap_or_default();
        epoch_table(&records, &mut out);
        if let Some(verdict) = verdict(&records) {
            let _ = writeln!(out, "  {verdict}");
        }
    }
    out
}

/// What held the job back in its last epoch long enough to tell (the last complete one, or
/// the running one if none is), as a line: "epoch N: data-bound 62%: ...".
pub fn verdict(records: &[Json]) -> Option<String> {
    let complete = |r: &&Json| r.get("complete").and_then(Json::as_bool) == Some(true);
    let last = records
        .iter()
        .rev()
        .filter(complete)
        .find_map(|r| Some((r, DataWait::of_record(r)?)))
        .or_else(|| {
            records
                .iter()
                .rev()
                .find_map(|r| Some((r, DataWait::of_record(r)?)))
        })?;
    Some(format!(
        "epoch {}: {}",
        number(last.0, "epoch") as u64,
        last.1.verdict()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_stat_by_name() {
        let doc: Json = serde_json::json!({
            "mountpoint": "/mnt", "source": "/data", "policy": "minio",
            "hits": 3, "hit_rate": 0.75, "cached_bytes": 2048,
            "epochs": [{"epoch": 1, "files": 4, "reads": 4, "hit_rate": 0.5, "byte_hit_rate": 0.5, "bytes_from_cache": 1024,
                        "bytes_from_source": 1024, "seconds": 1.5, "complete": true}]
        });
        let text = render(&doc);
        assert!(
            text.starts_with("coorfs /mnt  (source /data, policy minio)\n"),
            "{text}"
        );
        for stat in Stat::ALL {
            assert!(text.contains(stat.name()), "{}", stat.name());
        }
        let line = |name: &str| {
            text.lines()
                .find(|l| l.split_whitespace().next() == Some(name))
                .unwrap_or("")
                .to_string()
        };
        assert!(line("hit_rate").ends_with(" 0.7500 (75.0%)"), "{text}");
        assert!(line("cached_bytes").ends_with(" 2048 (2.0 KiB)"), "{text}");
        assert!(
            text.contains(
                "     1         4         4     50.0%     50.0%        0      1.0 KiB      1.0 KiB      0.00         -      1.50  complete"
            ),
            "{text}"
        );
    }
}
