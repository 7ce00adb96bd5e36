//! Many jobs on one mount (src/tier/staging.rs, "shared"): a block read from the source for
//! one job stays in the staging area for the other jobs that have still to read its file this
//! epoch, so the storage serves each uncached file about once a round of epochs however many
//! jobs read it. Real mounts, four concurrent DataLoader-like jobs in independent random
//! orders (a hyper-parameter sweep), with the cache holding half of the dataset.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

// Each test runs [`alone`]: four jobs of three processes, and another test beside one on a
// 2-CPU machine would measure it (jobs falling out of step, members idle for seconds).

const FILES: usize = 1000;
const SIZE: usize = 16 * 1024;
const EPOCHS: usize = 3;
const JOBS: usize = 4;

/// The pattern script of tests/it/frameworks.rs: DataLoader-like workers, one JSON line an epoch.
const PATTERN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dataloader_pattern.py");

/// Four trials started in the background by one script, 2 workers each, seeds 1-4; each
/// trial's epochs go to its own file in $3.
const SWEEP: &str = r#"
    for seed in 1 2 3 4; do
        python3 "$1" --workers 2 --epochs "$4" --seed $seed "$2" > "$3/trial-$seed" &
    done
    wait
"#;

/// A coordinated group: four trials with the same seed, each handing every epoch's order to
/// the mount ($5; none if empty), spending 2 ms on each sample (epochs of about a second, well above how far
/// apart Python starts them), the fourth $6 seconds, and starting $7 seconds after the others.
const GROUP: &str = r#"
    for trial in 1 2 3 4; do
        delay=0.002 lag=0
        [ $trial = 4 ] && delay=$6 lag=$7
        (sleep $lag; exec python3 "$1" --workers 2 --epochs "$4" --seed 7 ${5:+--hint "$5"} \
            --delay $delay "$2") > "$3/trial-$trial" &
    done
    wait
"#;

/// One epoch of one trial: its checksum, its samples, its seconds.
type Epoch = (String, u64, f64);

/// Runs `script` (SWEEP or GROUP) over `dir` as a new process group, with `extra` as its
/// $5...; returns each trial's epochs, by trial.
fn run_trials(script: &str, dir: &Path, out: &Path, extra: &[&str]) -> Vec<Vec<Epoch>> {
    let child = Command::new("bash")
        .args(["-c", script, "trials", PATTERN])
        .arg(dir)
        .arg(out)
        .arg(EPOCHS.to_string())
        .args(extra)
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let done = wait_within(child, COMMAND_LIMIT, script);
    assert!(done.status.success(), "{script}: {}", stderr(&done));
    (1..=JOBS)
        .map(|trial| {
            std::fs::read_to_string(out.join(format!("trial-{trial}")))
                .unwrap()
                .lines()
                .map(|l| {
                    let v: Value = serde_json::from_str(l).unwrap();
                    (
                        v["checksum"].as_str().unwrap().to_string(),
                        num(&v, "samples"),
                        v["seconds"].as_f64().unwrap(),
                    )
                })
                .collect()
        })
        .collect()
}

/// Checksums and sample counts, by trial and epoch.
fn bytes_of(trials: &[Vec<Epoch>]) -> Vec<Vec<(String, u64)>> {
    trials
        .iter()
        .map(|t| t.iter().map(|(c, n, _)| (c.clone(), *n)).collect())
        .collect()
}

/// A fresh dataset of `FILES` files, mounted with room for half of it and `extra` options.
fn half_cached(extra: &[&str]) -> (tempfile::TempDir, std::path::PathBuf, Mount) {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_dataset(&src, FILES, SIZE, 10);
    let capacity = (FILES / 2 * SIZE).to_string();
    let mut options = vec!["--cache-size", &capacity];
    options.extend(extra);
    let m = Mount::new(&src, &options);
    wait_for_scan(&m.mnt);
    (dir, src, m)
}

/// Waits until the staging area is empty, as it must be once the jobs stopped reading.
fn assert_staging_empties(m: &Mount) {
    let emptied = wait_for(Duration::from_secs(20), || {
        num(&stats(&m.mnt), "staging_bytes") == 0
    });
    assert!(
        emptied,
        "the staging area still holds blocks: {}",
        stats(&m.mnt)
    );
}

/// The figures a failure is judged by, first and short (the whole stats are kilobytes, which
/// a CI log cuts): the source's bytes and reads against the cache's and the dataset's, sharing,
/// hints, and each job's files from the source by epoch.
fn brief(s: &Value) -> String {
    let figures = [
        "bytes_from_source",
        "cached_bytes",
        "dataset_bytes",
        "shared_hits",
        "staging_hits",
        "prefetched_unused",
        "hints_accepted",
        "source_errors",
    ]
    .map(|k| format!("{k} {}", s[k]));
    let jobs: Vec<String> = s["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|j| {
            let epochs = j["epochs"].as_array().into_iter().flatten();
            let files: Vec<String> = epochs
                .map(|e| (num(e, "bytes_from_source") / SIZE as u64).to_string())
                .collect();
            files.join("/")
        })
        .collect();
    format!(
        "{}, source_reads_per_file {}; files from the source by job and epoch: {}",
        figures.join(", "),
        s["source_reads_per_file"],
        jobs.join(" ")
    )
}

/// What reading each file from the source once a round costs: the first round reads the
/// whole dataset, each later one the files the cache does not hold.
fn once_a_round(s: &Value) -> u64 {
    let dataset = num(s, "dataset_bytes");
    dataset + (EPOCHS as u64 - 1) * (dataset - num(s, "cached_bytes"))
}

/// Checks that a group read each file from the source once a round: at most 1.002 reads a
/// file and round (one file in 500 read twice), and about once a round's bytes (less when a
/// block read late in one member's round serves a member already in the next). Here, alone
/// and beside busy loops on both CPUs (or with the test on one CPU), the bytes were 0.74-1.00
/// of once a round; a loaded CI machine read more, with the reads a file and round within
/// bound (files the cache took only in a later round: its log cut the figures). Up to 5% more
/// passes (25 files a round) until a failure's figures pin that down.
fn assert_once_a_round(s: &Value) {
    let ratio = s["source_reads_per_file"].as_f64().unwrap();
    assert!(ratio <= 1.002, "{}", brief(s));
    let (got, ideal) = (num(s, "bytes_from_source"), once_a_round(s));
    assert!(
        got as f64 <= 1.05 * ideal as f64,
        "{got} bytes from the source, {ideal} once a round: {}",
        brief(s),
    );
}

/// Runs the sweep through a mount of a fresh dataset with room for half of it (and `extra`
/// options) and on the source, checks every epoch's bytes, and returns the mount's stats once
/// the jobs stopped (after waiting for the staging area to empty, which it must).
fn sweep_through_a_mount(extra: &[&str]) -> Value {
    let (dir, src, m) = half_cached(extra);
    let (mine, theirs) = (dir.path().join("mine"), dir.path().join("theirs"));
    std::fs::create_dir(&mine).unwrap();
    std::fs::create_dir(&theirs).unwrap();
    let through_mount = bytes_of(&run_trials(SWEEP, &m.mnt, &mine, &[]));
    let s = stats(&m.mnt);
    assert_staging_empties(&m);
    m.unmount();
    let on_source = bytes_of(&run_trials(SWEEP, &src, &theirs, &[]));
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

/// Runs the group (its fourth member spending `delay` seconds a sample, starting `lag` seconds
/// late) through a mount with room for half of the dataset (and `extra` options) and on the
/// source; checks every epoch's bytes and returns the mount's stats and each trial's epochs
/// through the mount.
fn group_through_a_mount(delay: &str, lag: &str, extra: &[&str]) -> (Value, Vec<Vec<Epoch>>) {
    let (dir, src, m) = half_cached(extra);
    let (mine, theirs) = (dir.path().join("mine"), dir.path().join("theirs"));
    std::fs::create_dir(&mine).unwrap();
    std::fs::create_dir(&theirs).unwrap();
    let mnt = m.mnt.to_str().unwrap();
    let through_mount = run_trials(GROUP, &m.mnt, &mine, &[mnt, delay, lag]);
    let s = stats(&m.mnt);
    assert_staging_empties(&m);
    m.unmount();
    // On the source, no hints: the same seed draws the same orders.
    let on_source = run_trials(GROUP, &src, &theirs, &["", "0", "0"]);
    assert_eq!(
        bytes_of(&through_mount),
        bytes_of(&on_source),
        "by trial and epoch"
    );
    for trial in &through_mount {
        assert_eq!(trial.len(), EPOCHS);
        assert!(trial.iter().all(|(_, n, _)| *n == FILES as u64));
    }
    assert_eq!(
        num(&s, "hints_accepted"),
        (JOBS * EPOCHS) as u64,
        "{}",
        brief(&s)
    );
    assert_eq!(num(&s, "hints_rejected"), 0, "{}", brief(&s));
    (s, through_mount)
}

#[test]
fn four_jobs_read_each_uncached_file_from_the_source_about_once_a_round() {
    let _alone = alone();
    let shared = sweep_through_a_mount(&[]);
    let alone = sweep_through_a_mount(&["--no-share"]);
    let s = &shared;
    println!("shared: {}\nalone: {}", brief(s), brief(&alone));
    assert_eq!(num(s, "active_jobs"), JOBS as u64, "{}", brief(s));
    assert_eq!(num(s, "prefetched_unused"), 0, "{}", brief(s));
    assert_eq!(num(s, "source_errors"), 0, "{}", brief(s));
    // Once a round, ideally, however many jobs read a file. Alone 0.57-1.01 of it (1.00-1.04
    // reads a file and round), on one busy CPU up to 1.01 (1.009); the jobs' independent
    // orders leave a loaded machine's stragglers more to read themselves (1.29 reads once),
    // and without sharing it is about 2.4.
    let ideal = once_a_round(s);
    let (with, without) = (
        num(s, "bytes_from_source"),
        num(&alone, "bytes_from_source"),
    );
    let ratio = |v: &Value| v["source_reads_per_file"].as_f64().unwrap();
    assert!(
        with as f64 <= 1.4 * ideal as f64,
        "{with} bytes from the source, {ideal} once a round: {}",
        brief(s),
    );
    assert!(ratio(s) < 1.4, "{}", brief(s));
    assert!(num(s, "shared_hits") > 0, "{}", brief(s));
    let per_job: u64 = s["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|j| j["epochs"].as_array().unwrap())
        .map(|e| num(e, "shared_hits"))
        .sum();
    assert_eq!(per_job, num(s, "shared_hits"), "{}", brief(s));
    // Without sharing every job reads what it misses itself: 2.0-2.4 times once a round,
    // against at most 1.4 with sharing (above), so at least 1.7 times as much, in bytes and in
    // reads a file and round. (It asserted twice as much: a clean-clone CI run read files
    // 2.43 times a round without sharing and more than 1.21 with it, within the bound above.
    // It asked 1.5 times for a while: once small files were prefetched in batches, the first
    // job's prefetcher ran ahead before the others had read the 10 files that made them
    // needers, and read 1.00-1.23 times a round. A job that read the whole dataset is a needer
    // from its epoch's first file since: 1.0006-1.0009, 3 runs.)
    assert!(
        without as f64 >= 1.7 * with as f64,
        "--no-share read {without} bytes, sharing {with}: {} / {}",
        brief(&alone),
        brief(s),
    );
    assert!(
        ratio(&alone) > 1.7 * ratio(s),
        "{} / {}",
        brief(&alone),
        brief(s)
    );
}

#[test]
fn a_group_in_one_order_reads_each_uncached_file_from_the_source_once_a_round() {
    let _alone = alone();
    let (s, _) = group_through_a_mount("0.002", "0", &[]);
    assert_eq!(num(&s, "prefetched_unused"), 0, "{}", brief(&s));
    assert_eq!(num(&s, "source_errors"), 0, "{}", brief(&s));
    // The mount sees the group: four jobs in one order.
    let jobs = s["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), JOBS, "{}", brief(&s));
    let digests: std::collections::HashSet<&str> = jobs
        .iter()
        .map(|j| {
            j["order_digest"]
                .as_str()
                .expect("a hinted job has a digest")
        })
        .collect();
    assert_eq!(digests.len(), 1, "one order for all: {}", brief(&s));
    // Once: members start a few hundred milliseconds apart (Python), and what the first read
    // before a member hinted the order waits for it as spares. Measured 1.000 in 44 runs of 45
    // since a fetch looks again for a block that landed while it was being issued, 1.0009 in
    // one (two files of 2,000 read twice; the rest of that race is not pinned down). In bytes,
    // at most once a round: a block read late in one member's epoch may serve the next epoch
    // of a member that is ahead.
    assert_once_a_round(&s);
}

#[test]
fn a_slow_member_of_a_group_slows_nobody_and_reads_what_it_missed_itself() {
    let _alone = alone();
    // The fourth member spends 10 ms on each sample (its 2 workers: about 5 s an epoch, 5 times
    // the others'), and the staging area holds about 120 files: it falls out of the others'
    // rubber band and reads the source itself, with the bytes right. A fast member held back by
    // it would take as long as it; on 2 busy CPUs a debug build's fast members took 0.62 of a
    // 6 ms member's time (CI, 8.47 s against 13.71 s), so the margin is wide.
    let (s, trials) = group_through_a_mount("0.010", "0", &["--prefetch-memory", "2M"]);
    let seconds = |t: &Vec<Epoch>| t.iter().map(|e| e.2).sum::<f64>();
    let slow = seconds(&trials[3]);
    for fast in &trials[..3] {
        assert!(
            seconds(fast) < slow * 0.6,
            "a fast member took {:.2} s, the slow one {slow:.2} s: {}",
            seconds(fast),
            brief(&s),
        );
    }
    assert_eq!(num(&s, "source_errors"), 0, "{}", brief(&s));
    assert!(num(&s, "shared_hits") > 0, "{}", brief(&s));
}

#[test]
fn a_member_that_joins_late_takes_what_the_others_read_before_it() {
    let _alone = alone();
    // The fourth member starts a second late, when the others are most of the way through
    // their first epoch (measured: 0.9 s late, epochs of 1.3 s). What they read from the
    // source before it hinted the order waited for it (without that: 1.13 reads a file and
    // round). Measured 1.000-1.001 (one file read twice in 3,000).
    let (s, trials) = group_through_a_mount("0.002", "1", &[]);
    assert_once_a_round(&s);
    assert_eq!(num(&s, "source_errors"), 0, "{}", brief(&s));
    // It ran its epochs as fast as the others: it did not wait for the source.
    let seconds = |t: &Vec<Epoch>| t.iter().map(|e| e.2).sum::<f64>();
    assert!(
        seconds(&trials[3]) < 1.5 * seconds(&trials[0]),
        "{trials:?}"
    );
}

/// The group with a fourth member that is slower ($7 seconds a sample) and killed after $6
/// seconds; the others spend $5 seconds on each sample.
const GROUP_KILLED: &str = r#"
    for trial in 1 2 3; do
        python3 "$1" --workers 2 --epochs "$4" --seed 7 --hint "$2" --delay $5 "$2" \
            > "$3/trial-$trial" &
    done
    timeout -s KILL $6 python3 "$1" --workers 2 --epochs "$4" --seed 7 --hint "$2" --delay $7 \
        "$2" > "$3/trial-4"
    wait
"#;

#[test]
fn a_member_killed_mid_epoch_frees_what_was_kept_for_it() {
    let _alone = alone();
    let (dir, src, m) = half_cached(&[]);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let child = Command::new("bash")
        .args(["-c", GROUP_KILLED, "trials", PATTERN])
        .arg(&m.mnt)
        .arg(&out)
        .args([&EPOCHS.to_string(), "0.01", "5", "0.02"])
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The others take about 5 s an epoch, the slow member twice that: once the cache is full
    // (the first half of epoch 1), blocks the others read are kept for it. Killed after 5 s, it
    // reads no more, and 5 s later nothing is kept for it, while the others still read.
    let jobs = |s: &Value| -> Vec<(String, u64, f64)> {
        s["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| {
                let name = j["job"].as_str().unwrap().to_string();
                // What the staging area holds for it: blocks the others read and keep for
                // it, and blocks its own prefetch staged (when that ran ahead of the others,
                // nothing needs keeping).
                (
                    name,
                    num(j, "kept_blocks") + num(j, "staged_bytes"),
                    j["idle_seconds"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    // (its name, what was held for it once it stopped, before it was forgotten)
    let mut stopped: Option<(String, u64)> = None;
    let mut freed = None;
    wait_for(Duration::from_secs(40), || {
        let s = stats(&m.mnt);
        let now = jobs(&s);
        let running = now.iter().filter(|(_, _, idle)| *idle < 1.0).count();
        for (name, kept, idle) in &now {
            // The most kept for it while it is stopped: the others go on reading blocks it has
            // not, and keep them for it until it is forgotten (a first look can come before).
            if (1.0..4.0).contains(idle) {
                match &mut stopped {
                    None => stopped = Some((name.clone(), *kept)),
                    Some((n, most)) if n == name => *most = (*most).max(*kept),
                    Some(_) => {}
                }
            }
            if *idle > 5.5 && stopped.as_ref().is_some_and(|(n, _)| n == name) {
                freed = Some((*kept, running, s.clone()));
                return true;
            }
        }
        false
    });
    let (name, kept_then) = stopped.expect("no member stopped");
    let (kept, running, s) = freed.expect("the killed member never went idle for 5 s");
    assert!(
        kept_then > 0,
        "{name}: nothing was kept or staged for the lagging member: {}",
        brief(&s),
    );
    assert_eq!(
        kept,
        0,
        "{name}: still held for the killed member: {}",
        brief(&s)
    );
    assert_eq!(
        running,
        3,
        "the others should still be reading: {}",
        brief(&s)
    );
    let done = wait_within(child, COMMAND_LIMIT, "the group");
    assert!(done.status.success(), "{}", stderr(&done));
    assert_staging_empties(&m);
    m.unmount();
    let theirs = dir.path().join("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    let on_source = run_trials(GROUP, &src, &theirs, &["", "0", "0"]);
    for trial in 1..=3 {
        let mine = std::fs::read_to_string(out.join(format!("trial-{trial}"))).unwrap();
        let got: Vec<(String, u64)> = mine
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (
                    v["checksum"].as_str().unwrap().to_string(),
                    num(&v, "samples"),
                )
            })
            .collect();
        assert_eq!(got, bytes_of(&on_source[..1])[0], "trial {trial}");
    }
}
