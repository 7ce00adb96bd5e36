//! Many jobs on one mount (src/tier/staging.rs, "shared"): a block read from the source for
//! one job stays in the staging area for the other jobs that have still to read its file this
//! epoch, so the storage serves each uncached file about once a round of epochs however many
//! jobs read it. Real mounts, four concurrent DataLoader-like jobs in independent random
//! orders (a hyper-parameter sweep), with the cache holding half of the dataset.

mod common;

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

const FILES: usize = 1000;
const SIZE: usize = 16 * 1024;
const EPOCHS: usize = 3;
const JOBS: usize = 4;

/// The pattern script of tests/frameworks.rs: DataLoader-like workers, one JSON line an epoch.
const PATTERN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dataloader_pattern.py");

/// Four trials started in the background by one script, 2 workers each, seeds 1-4; each
/// trial's epochs go to its own file in $3.
const SWEEP: &str = r#"
    for seed in 1 2 3 4; do
        python3 "$1" --workers 2 --epochs "$4" --seed $seed "$2" > "$3/trial-$seed" &
    done
    wait
"#;

/// Runs the sweep over `dir` as a new process group; returns each trial's epochs (checksum
/// and sample count), by seed.
fn sweep(dir: &std::path::Path, out: &std::path::Path) -> Vec<Vec<(String, u64)>> {
    let child = Command::new("bash")
        .args(["-c", SWEEP, "sweep", PATTERN])
        .arg(dir)
        .arg(out)
        .arg(EPOCHS.to_string())
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let done = wait_within(child, COMMAND_LIMIT, "sweep");
    assert!(done.status.success(), "sweep: {}", stderr(&done));
    (1..=JOBS)
        .map(|seed| {
            std::fs::read_to_string(out.join(format!("trial-{seed}")))
                .unwrap()
                .lines()
                .map(|l| {
                    let v: Value = serde_json::from_str(l).unwrap();
                    (
                        v["checksum"].as_str().unwrap().to_string(),
                        num(&v, "samples"),
                    )
                })
                .collect()
        })
        .collect()
}

/// Mounts a fresh dataset with room for half of it, runs the sweep through the mount and on
/// the source, checks every epoch's bytes, and returns the mount's stats once the jobs
/// stopped (after waiting for the staging area to empty, which it must).
fn sweep_through_a_mount(extra: &[&str]) -> Value {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_dataset(&src, FILES, SIZE, 10);
    let capacity = (FILES / 2 * SIZE).to_string();
    let mut options = vec!["--cache-size", &capacity];
    options.extend(extra);
    let m = Mount::new(&src, &options);
    wait_for_scan(&m.mnt);
    let (mine, theirs) = (dir.path().join("mine"), dir.path().join("theirs"));
    std::fs::create_dir(&mine).unwrap();
    std::fs::create_dir(&theirs).unwrap();
    let through_mount = sweep(&m.mnt, &mine);
    let s = stats(&m.mnt);
    // Jobs that stopped reading give their share back: nobody is left to need a block.
    let emptied = wait_for(Duration::from_secs(20), || {
        num(&stats(&m.mnt), "staging_bytes") == 0
    });
    assert!(
        emptied,
        "the staging area still holds blocks: {}",
        stats(&m.mnt)
    );
    m.unmount();
    let on_source = sweep(&src, &theirs);
    assert_eq!(
        through_mount, on_source,
        "checksums and samples, by trial and epoch"
    );
    for trial in &through_mount {
        assert_eq!(trial.len(), EPOCHS);
        assert!(trial.iter().all(|(_, n)| *n == FILES as u64));
    }
    s
}

#[test]
fn four_jobs_read_each_uncached_file_from_the_source_about_once_a_round() {
    let shared = sweep_through_a_mount(&[]);
    let alone = sweep_through_a_mount(&["--no-share"]);
    let s = &shared;
    assert_eq!(num(s, "active_jobs"), JOBS as u64, "{s}");
    assert_eq!(num(s, "prefetched_unused"), 0, "{s}");
    assert_eq!(num(s, "source_errors"), 0, "{s}");
    // The first round reads the whole dataset, each later one the half the cache does not
    // hold: once each, ideally, however many jobs read it.
    let dataset = (FILES * SIZE) as u64;
    let ideal = dataset + (EPOCHS as u64 - 1) * dataset / 2;
    let (with, without) = (
        num(s, "bytes_from_source"),
        num(&alone, "bytes_from_source"),
    );
    let ratio = |v: &Value| v["source_reads_per_file"].as_f64().unwrap();
    assert!(
        with as f64 <= 1.25 * ideal as f64,
        "{with} bytes from the source, {ideal} once a round: {s}"
    );
    assert!(ratio(s) < 1.25, "{s}");
    assert!(num(s, "shared_hits") > 0, "{s}");
    let per_job: u64 = s["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|j| j["epochs"].as_array().unwrap())
        .map(|e| num(e, "shared_hits"))
        .sum();
    assert_eq!(per_job, num(s, "shared_hits"), "{s}");
    // Without sharing every job reads what it misses itself.
    assert!(
        without >= 2 * with,
        "--no-share read {without} bytes, sharing {with}: {alone}"
    );
    assert!(ratio(&alone) > 2.0 * ratio(s), "{alone}");
}
