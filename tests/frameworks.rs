//! A PyTorch DataLoader's access pattern through a real mount, with the standard library only:
//! `tests/dataloader_pattern.py` lists the dataset like ImageFolder, then every epoch forks
//! worker processes that read whole files of their share of a fresh random permutation and
//! send back a hash of each (path, bytes). The same run on the source must give the same
//! per-epoch checksums, and coorfs's stats must account for every read: one read per file per
//! epoch, epoch 1 all misses, later epochs hitting exactly what the cache holds (prefetch off,
//! since it turns an unpredictable share of misses into hits); with prefetch on (the default),
//! the totals that do not depend on timing.
//!
//! The real libraries (torch, torchvision, tensorflow) are too heavy for CI; they are checked
//! by `scripts/check-frameworks.sh`, which asserts the same through the same stats.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

const FILES: usize = 1000;
/// A multiple of the cache arena's 64-byte alignment, so that exactly half the files fit in
/// half the dataset's bytes.
const SIZE: usize = 16 * 1024;
const WORKERS: usize = 4;
const EPOCHS: usize = 3;

/// Runs the pattern over `dir`; returns its per-epoch reports.
fn dataloader_pattern(dir: &Path) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dataloader_pattern.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--workers", &WORKERS.to_string()])
        .args(["--epochs", &EPOCHS.to_string()])
        .args(["--seed", "7"])
        .arg(dir)
        .output()
        .expect("python3 is needed to run tests/dataloader_pattern.py");
    assert!(
        out.status.success(),
        "dataloader_pattern.py on {} failed: {}",
        dir.display(),
        stderr(&out)
    );
    let epochs: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(epochs.len(), EPOCHS);
    epochs
}

/// Mounts a fresh dataset with room for `cached` of its files (and `extra` mount options), runs
/// the pattern through the mount and on the source, checks the bytes, and returns the mount's
/// final stats.
fn through_a_mount(cached: usize, extra: &[&str]) -> Value {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_dataset(&src, FILES, SIZE, 10);
    let capacity = (cached * SIZE).to_string();
    let mut options = vec!["--cache-size", &capacity];
    options.extend(extra);
    let m = Mount::new(&src, &options);
    wait_for_scan(&m.mnt);
    let through_mount = dataloader_pattern(&m.mnt);
    let s = stats(&m.mnt);
    m.unmount();
    let on_source = dataloader_pattern(&src);

    for (got, want) in through_mount.iter().zip(&on_source) {
        let epoch = num(got, "epoch");
        assert_eq!(num(got, "samples"), FILES as u64, "epoch {epoch}");
        assert_eq!(num(got, "bytes"), (FILES * SIZE) as u64, "epoch {epoch}");
        assert_eq!(
            got["checksum"], want["checksum"],
            "epoch {epoch}: the mount served other bytes than the source holds"
        );
    }
    s
}

/// Checks that the stats account for `EPOCHS` epochs of reading every file once, with
/// `cached` files held by the cache from epoch 1 on.
fn assert_every_read_accounted(s: &Value, cached: usize) {
    let (files, dataset) = (FILES as u64, (FILES * SIZE) as u64);
    let cached_bytes = (cached * SIZE) as u64;
    assert_eq!(num(s, "cached_files"), cached as u64, "{s}");
    assert_eq!(num(s, "cached_bytes"), cached_bytes, "{s}");
    // Listing the dataset opened nothing: every open was a worker reading a sample.
    assert_eq!(num(s, "reads"), EPOCHS as u64 * files, "{s}");
    assert_eq!(num(s, "hits") + num(s, "misses"), num(s, "reads"), "{s}");
    assert_eq!(num(s, "source_errors"), 0, "{s}");

    let epochs = s["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), EPOCHS, "{s}");
    for (i, e) in epochs.iter().enumerate() {
        let (hits, from_cache) = match i {
            0 => (0, 0),
            _ => (cached as u64, cached_bytes),
        };
        let what = format!("epoch {}: {e}", i + 1);
        assert_eq!(num(e, "epoch"), i as u64 + 1, "{what}");
        assert_eq!(e["complete"], true, "{what}");
        assert_eq!(num(e, "files"), files, "{what}");
        assert_eq!(num(e, "reads"), files, "{what}");
        assert_eq!(num(e, "hits"), hits, "{what}");
        assert_eq!(num(e, "misses"), files - hits, "{what}");
        assert_eq!(e["hit_rate"].as_f64().unwrap(), hits as f64 / files as f64);
        assert_eq!(num(e, "bytes_from_cache"), from_cache, "{what}");
        assert_eq!(num(e, "bytes_from_source"), dataset - from_cache, "{what}");
    }
    let uncached = dataset - cached_bytes;
    assert_eq!(
        num(s, "bytes_from_source"),
        dataset + (EPOCHS as u64 - 1) * uncached
    );
    assert_eq!(
        num(s, "bytes_from_cache"),
        (EPOCHS as u64 - 1) * cached_bytes
    );
}

#[test]
fn forked_workers_read_the_source_bytes_and_later_epochs_all_hit() {
    let s = through_a_mount(FILES, &["--no-prefetch"]);
    assert_every_read_accounted(&s, FILES);
}

#[test]
fn with_half_the_dataset_cached_later_epochs_hit_exactly_that_half() {
    let s = through_a_mount(FILES / 2, &["--no-prefetch"]);
    assert_every_read_accounted(&s, FILES / 2);
}

#[test]
fn with_prefetch_every_file_is_read_from_the_source_once_an_epoch_at_most() {
    let cached = FILES / 2;
    let s = through_a_mount(cached, &[]);
    let (files, dataset) = (FILES as u64, (FILES * SIZE) as u64);
    let cached_bytes = (cached * SIZE) as u64;
    assert!(
        num(&s, "prefetch_memory") > 0,
        "prefetch is on by default: {s}"
    );
    // The prefetcher did work: it served many of the misses (about 1,450 of 2,000 here).
    assert!(num(&s, "staging_hits") > 0, "{s}");
    assert_eq!(num(&s, "cached_files"), cached as u64, "{s}");
    assert_eq!(num(&s, "reads"), EPOCHS as u64 * files, "{s}");
    assert_eq!(num(&s, "hits") + num(&s, "misses"), num(&s, "reads"), "{s}");
    // Every epoch completed, so nothing prefetched went unread, and every file not cached was
    // read from the source once an epoch, by the prefetcher or on demand, never twice.
    assert_eq!(num(&s, "prefetched_unused"), 0, "{s}");
    assert_eq!(
        num(&s, "bytes_from_source"),
        dataset + (EPOCHS as u64 - 1) * (dataset - cached_bytes),
        "{s}"
    );
    let epochs = s["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), EPOCHS, "{s}");
    for e in epochs {
        assert_eq!(e["complete"], true, "{e}");
        assert_eq!(num(e, "reads"), files, "{e}");
        assert_eq!(num(e, "hits") + num(e, "misses"), files, "{e}");
    }
    // MinIO's cached set is fixed once epoch 1 filled it (by the prefetcher, in inode order,
    // or by the readers): later epochs hit exactly those files.
    for e in &epochs[1..] {
        assert_eq!(num(e, "hits"), cached as u64, "{e}");
        assert_eq!(num(e, "bytes_from_cache"), cached_bytes, "{e}");
    }
}
