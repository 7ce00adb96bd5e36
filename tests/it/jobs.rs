//! Which processes make a job (`--job-key auto`, src/jobs/tree.rs), on a real mount, in the
//! three shapes that share one process group: the trials of a sweep script (a job each, with
//! their workers), the ranks of a distributed run (one job, each rank reading its shard), and
//! a DataLoader's workers under a script (one job). `--job-key pgid` still makes a sweep one
//! job.
//!
//! Each test runs alone (`common::alone`): which job an open counts in is read from the
//! machine's processes. (A told open of a worker that exited with its parent before the open
//! was counted once made a job of its own, named after the worker; src/jobs/found.rs.)

use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::common::*;
use serde_json::Value;

const FILES: usize = 400;
const SIZE: usize = 4096;
const EPOCHS: usize = 2;

/// The pattern script of tests/it/frameworks.rs: DataLoader-like workers, one JSON line an epoch.
const PATTERN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dataloader_pattern.py");

/// Runs `script` under `bash -c` as the leader of a new process group (a script started by a
/// scheduler or by another script, without job control), with `args` as $1...; returns its
/// pid (= the group) and its standard output.
fn run_script(script: &str, args: &[&str]) -> (u32, String) {
    let mut bash = Command::new("bash");
    bash.args(["-c", script, "script"]).args(args);
    run_as_group_leader(&mut bash, script)
}

/// Runs `cmd` as the leader of a new process group; returns its pid (= the group) and its
/// standard output, once it succeeded.
fn run_as_group_leader(cmd: &mut Command, what: &str) -> (u32, String) {
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0);
    // A script written moments ago can be "busy": a test on another thread that forked
    // while the file was open for writing holds a copy of that descriptor until its exec.
    let mut tries = 0;
    let child = loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            spawned => break spawned.unwrap(),
        }
    };
    let pid = child.id();
    let out = wait_within(child, COMMAND_LIMIT, what);
    assert!(out.status.success(), "{what}: {}", stderr(&out));
    (pid, String::from_utf8(out.stdout).unwrap())
}

/// The live jobs of a stats document, by name.
fn jobs(s: &Value) -> Vec<&Value> {
    let jobs: Vec<&Value> = s["jobs"].as_array().unwrap().iter().collect();
    assert!(jobs.iter().all(|j| j["active"] == true), "{s}");
    jobs
}

/// A mount of a fresh dataset that caches all of it, and the dataset's directory.
fn mounted(extra: &[&str]) -> (tempfile::TempDir, Mount) {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_dataset(&src, FILES, SIZE, 4);
    let m = Mount::new(&src, extra);
    wait_for_scan(&m.mnt);
    (dir, m)
}

/// Checks that `job` read `EPOCHS` whole epochs of the dataset.
fn read_every_epoch(job: &Value) {
    let epochs = job["epochs"].as_array().unwrap();
    assert!(epochs.len() >= EPOCHS, "{job}");
    for e in &epochs[..EPOCHS] {
        assert_eq!(e["complete"], true, "{job}");
        assert_eq!(num(e, "files"), FILES as u64, "{job}");
    }
}

/// Checks that `job` (of stats `s`) is a trial of the sweep in process group `group`: named by
/// the group and the trial.
fn assert_trial_of(job: &Value, group: u32, s: &Value) {
    let name = job["job"].as_str().unwrap();
    assert!(
        name.starts_with(&format!("pgid {group} pid ")),
        "a trial's job is named by the group and the trial: {s}"
    );
}

/// Three trials started in the background by one script, each with 2 worker processes.
const SWEEP: &str = r#"
    for seed in 1 2 3; do
        python3 "$1" --workers 2 --epochs "$3" --seed $seed "$2" > /dev/null &
    done
    wait
"#;

#[test]
fn the_trials_of_a_sweep_script_are_a_job_each() {
    let _alone = crate::common::alone();
    let (_dir, m) = mounted(&[]);
    let mnt = m.mnt.to_str().unwrap();
    let (group, _) = run_script(SWEEP, &[PATTERN, mnt, &EPOCHS.to_string()]);
    let s = stats(&m.mnt);
    let jobs = jobs(&s);
    assert_eq!(jobs.len(), 3, "{s}");
    assert_eq!(num(&s, "active_jobs"), 3, "{s}");
    for job in jobs {
        assert_trial_of(job, group, &s);
        read_every_epoch(job);
    }
    m.unmount();
}

#[test]
fn a_sweep_script_run_by_its_shebang_line_is_a_sweep_too() {
    let _alone = crate::common::alone();
    // `./sweep.sh`: the shell runs under the script's name (comm "sweep.sh"); its executable
    // still says it is a shell. It once made the whole sweep one job.
    let (dir, m) = mounted(&[]);
    let script = dir.path().join("sweep.sh");
    std::fs::write(&script, format!("#!/bin/bash\n{SWEEP}")).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mnt = m.mnt.to_str().unwrap();
    let mut sweep = Command::new(&script);
    sweep.args([PATTERN, mnt, &EPOCHS.to_string()]);
    let (group, _) = run_as_group_leader(&mut sweep, "sweep.sh");
    let s = stats(&m.mnt);
    let jobs = jobs(&s);
    assert_eq!(jobs.len(), 3, "{s}");
    for job in jobs {
        assert_trial_of(job, group, &s);
        read_every_epoch(job);
    }
    m.unmount();
}

#[test]
fn with_job_key_pgid_a_sweep_is_one_job() {
    let _alone = crate::common::alone();
    let (_dir, m) = mounted(&["--job-key", "pgid"]);
    let mnt = m.mnt.to_str().unwrap();
    let (group, _) = run_script(SWEEP, &[PATTERN, mnt, &EPOCHS.to_string()]);
    let s = stats(&m.mnt);
    let jobs = jobs(&s);
    assert_eq!(jobs.len(), 1, "{s}");
    assert_eq!(jobs[0]["job"], format!("pgid {group}"), "{s}");
    m.unmount();
}

#[test]
fn the_ranks_of_a_distributed_run_are_one_job() {
    let _alone = crate::common::alone();
    // As torchrun starts them: a launcher program (not a shell) runs 2 ranks, each a new
    // program reading its half of every epoch with 2 workers of its own.
    let (_dir, m) = mounted(&[]);
    let launcher = r#"
import subprocess, sys
pattern, mnt, epochs = sys.argv[1:]
ranks = [subprocess.Popen([sys.executable, pattern, "--workers", "2", "--epochs", epochs,
                           "--seed", "5", "--shard", f"{r}/2", mnt], stdout=subprocess.DEVNULL)
         for r in range(2)]
sys.exit(max(r.wait() for r in ranks))
"#;
    let mnt = m.mnt.to_str().unwrap();
    let (group, _) = run_script(
        r#"exec python3 -c "$1" "$2" "$3" "$4""#,
        &[launcher, PATTERN, mnt, &EPOCHS.to_string()],
    );
    let s = stats(&m.mnt);
    let jobs = jobs(&s);
    assert_eq!(jobs.len(), 1, "{s}");
    assert_eq!(jobs[0]["job"], format!("pgid {group}"), "{s}");
    // Every read of both ranks counted in it. (Its epochs are only approximate here: these
    // ranks do not wait for each other at every step as training ranks do, so one may begin
    // its next epoch while the other still finishes this one.)
    let reads: u64 = jobs[0]["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| num(e, "reads"))
        .sum();
    assert_eq!(reads, (EPOCHS * FILES) as u64, "{s}");
    m.unmount();
}

#[test]
fn a_script_that_runs_one_training_job_is_one_job() {
    let _alone = crate::common::alone();
    // A script runs the training (4 workers), then reads one file with cat, one thing at a
    // time: the script's process group is the job.
    let (_dir, m) = mounted(&[]);
    let mnt = m.mnt.to_str().unwrap();
    let (group, _) = run_script(
        r#"python3 "$1" --workers 4 --epochs "$3" --seed 9 "$2" > /dev/null
           cat "$2"/c000/f000000.bin > /dev/null"#,
        &[PATTERN, mnt, &EPOCHS.to_string()],
    );
    let s = stats(&m.mnt);
    let jobs = jobs(&s);
    assert_eq!(jobs.len(), 1, "{s}");
    assert_eq!(jobs[0]["job"], format!("pgid {group}"), "{s}");
    read_every_epoch(jobs[0]);
    m.unmount();
}

#[test]
fn hints_of_trials_started_together_do_not_replace_each_other() {
    let _alone = crate::common::alone();
    // The sweep of the issue on jobs: `coorfs read --hint` trials in the background of one
    // script, half of the dataset cached. Each trial's hints are its own job's.
    let (_dir, m) = mounted(&["--cache-size", &(FILES / 2 * SIZE).to_string()]);
    let mnt = m.mnt.to_str().unwrap();
    let (group, _) = run_script(
        r#"for seed in 1 2 3; do
               "$1" read --procs 1 --epochs "$3" --seed $seed --hint "$2" > /dev/null &
           done
           wait"#,
        &[bin(), mnt, &EPOCHS.to_string()],
    );
    let s = stats(&m.mnt);
    let jobs = jobs(&s);
    assert_eq!(jobs.len(), 3, "{s}");
    assert_eq!(num(&s, "hints_accepted"), 3 * EPOCHS as u64, "{s}");
    assert_eq!(num(&s, "hints_rejected"), 0, "{s}");
    assert_eq!(num(&s, "prefetched_unused"), 0, "{s}");
    for job in jobs {
        assert_trial_of(job, group, &s);
        read_every_epoch(job);
    }
    m.unmount();
}

#[test]
fn a_user_cannot_grow_the_job_table_past_its_share() {
    let _alone = crate::common::alone();
    // Attack: nobody reads a file from 40 new sessions in turn, each a new job by any key.
    let (dir, m) = mounted(&["--allow-other"]);
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = sh_as_nobody(
        r#"for i in $(seq 40); do setsid cat "$1" > /dev/null || exit 1; done"#,
        &[&m.path("c000/f000000.bin")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "active_jobs"), 33, "{s}");
    let catch_all = jobs(&s)
        .into_iter()
        .filter(|j| j["job"] == "uid 65534")
        .count();
    assert_eq!(catch_all, 1, "past 32 jobs, the user's catch-all: {s}");
    m.unmount();
}

#[test]
fn a_trial_that_reads_from_threads_is_one_job() {
    let _alone = crate::common::alone();
    // FUSE names the thread that asks: 2 trials of one script, each reading every file from
    // 4 threads, are 2 jobs, not one a thread.
    let (_dir, m) = mounted(&[]);
    let trial = r#"
import concurrent.futures, os, sys
paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(sys.argv[1]) for f in fs)
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    list(pool.map(lambda p: open(p, "rb").read(), paths))
"#;
    let (group, _) = run_script(
        r#"python3 -c "$1" "$2" & python3 -c "$1" "$2" & wait"#,
        &[trial, m.mnt.to_str().unwrap()],
    );
    let s = stats(&m.mnt);
    let jobs = jobs(&s);
    assert_eq!(jobs.len(), 2, "{s}");
    for job in jobs {
        assert_trial_of(job, group, &s);
        assert_eq!(num(&job["epochs"][0], "files"), FILES as u64, "{s}");
    }
    m.unmount();
}
