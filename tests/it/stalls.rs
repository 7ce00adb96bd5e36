//! Stall attribution on real mounts: a job that only reads from slow storage is told it is
//! data-bound, one that spends most of its time computing on each sample is told it is
//! compute-bound, by `coorfs stats` and in the stats document.

use std::ffi::OsStr;

use crate::common::*;

/// Reads every file below `argv[1]` once, in a fixed shuffled order, in one process,
/// spending `argv[2]` milliseconds of CPU on each (a decode and augmentation).
const READER: &str = r#"
import os, random, sys, time
root, work = sys.argv[1], float(sys.argv[2]) / 1000
paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
random.Random(1).shuffle(paths)
for p in paths:
    with open(p, "rb") as f:
        f.read()
    end = time.process_time() + work
    while time.process_time() < end:
        pass
"#;

/// Mounts a dataset of 100 files of 16 KiB whose every read from the source takes 10 ms more,
/// runs the reader with `work_ms` of CPU per file, and returns `coorfs stats` and the job's
/// last epoch record.
fn run(work_ms: u32) -> (String, serde_json::Value) {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_dataset(&src, 100, 16 << 10, 3);
    let m = Mount::new(&src, &["--no-prefetch", "--read-delay", "10ms"]);
    wait_for_scan(&m.mnt);
    let out = std::process::Command::new("python3")
        .args(["-c", READER])
        .arg(&m.mnt)
        .arg(work_ms.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let view = coorfs([OsStr::new("stats"), m.mnt.as_os_str()]);
    assert!(view.status.success(), "{}", stderr(&view));
    let doc = stats(&m.mnt);
    let job = doc["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["active"] == true)
        .expect("an active job")
        .clone();
    let last = job["epochs"].as_array().unwrap().last().unwrap().clone();
    m.unmount();
    (String::from_utf8_lossy(&view.stdout).into_owned(), last)
}

/// The job's verdict line in `coorfs stats`.
fn verdict(view: &str) -> &str {
    let job = view.find("\njob ").expect("a job section");
    view[job..]
        .lines()
        .find(|l| l.trim_start().starts_with("epoch 1: "))
        .unwrap_or_else(|| panic!("no verdict: {view}"))
        .trim()
}

#[test]
fn a_job_that_only_reads_slow_storage_is_data_bound() {
    let (view, epoch) = run(0);
    assert_eq!(epoch["readers"], 1, "{epoch}");
    let share = epoch["data_wait_seconds"].as_f64().unwrap() / epoch["seconds"].as_f64().unwrap();
    // 100 reads of 10 ms and little else.
    assert!(share > 0.6, "{epoch}");
    let v = verdict(&view);
    assert!(v.starts_with("epoch 1: data-bound "), "{view}");
    assert!(v.ends_with("%: more cache or prefetch helps"), "{view}");
}

#[test]
fn a_job_that_computes_on_each_sample_is_compute_bound() {
    // 150 ms of CPU per sample against 10 ms of waiting: about a sixteenth of the time. A busy
    // machine stretches both, the waits more: one CI run saw 22 ms a read, which against 60 ms
    // of CPU crossed the data-bound line (0.25). Its CPU stretches the compute too: beside
    // three CPU burners and the other tests, 320 ms a sample, so that the waits' share fell
    // under any fixed floor; what does not move is that each of the 100 reads waited its 10 ms.
    let (view, epoch) = run(150);
    assert_eq!(epoch["readers"], 1, "{epoch}");
    let wait = epoch["data_wait_seconds"].as_f64().unwrap();
    assert!(wait >= 0.999, "{epoch}");
    assert!(wait / epoch["seconds"].as_f64().unwrap() < 0.25, "{epoch}");
    let v = verdict(&view);
    assert!(
        v.starts_with(
            "epoch 1: compute-bound: storage is not the bottleneck, add CPU workers or offload preprocessing (readers waited for data "
        ),
        "{view}"
    );
}
