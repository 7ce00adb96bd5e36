//! `coorfs analyze` through the real binary, on small generated datasets: the report, the
//! JSON, the plot, every kind of bad input (one line, a defined exit code), unreadable files,
//! and the live check against a real mount. Measurements get `--time 1s` to keep this fast.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const FILES: usize = 300;
const SIZE: usize = 8192;
const HALF: u64 = (FILES * SIZE / 2) as u64;

/// Runs `coorfs analyze DATASET ARGS...`.
fn analyze(dataset: &Path, args: &[&str]) -> Output {
    let mut all = vec![OsStr::new("analyze"), dataset.as_os_str()];
    all.extend(args.iter().map(OsStr::new));
    coorfs(all)
}

fn text(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "coorfs analyze failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn dataset() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_dataset(&src, FILES, SIZE, 5);
    (dir, src)
}

fn f64_at(v: &Value, ptr: &str) -> f64 {
    v.pointer(ptr)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{ptr} missing"))
}

#[test]
fn the_report_and_the_json_hold_measurement_prediction_and_verdict() {
    let (dir, src) = dataset();
    let json = dir.path().join("report.json");
    let half = HALF.to_string();
    let args = [
        "--cache-size",
        &half,
        "--rate",
        "1000",
        "--epochs",
        "3",
        "--time",
        "1s",
    ];
    let out = analyze(&src, &[&args[..], &["--json", text(&json)]].concat());
    let text = ok(&out);
    for want in [
        format!("dataset   {}: 300 files, 2.3 MiB", src.display()),
        "storage   random whole-file reads of 300 sampled files, page cache bypassed".into(),
        "<- best useful depth".into(),
        "hit rate  cache 1.2 MiB = 50.0% of the dataset; 3 epochs".into(),
        "GPUs 1000 samples/s = 0.30 s of compute per epoch".into(),
        "verdict   from epoch 2 on".into(),
        "recommend smallest coorfs cache with no fetch stall".into(),
    ] {
        assert!(text.contains(&want), "{want:?} not in:\n{text}");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    for phase in ["scan: 300 files", "storage: ", "simulate: 3 epochs"] {
        assert!(
            stderr.contains(&format!("coorfs analyze: {phase}")),
            "{stderr}"
        );
    }

    let r: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["dataset"]["files"], 300);
    assert_eq!(r["dataset"]["bytes"], FILES * SIZE);
    assert_eq!(r["dataset"]["sizes"]["median"], SIZE);
    let depths: Vec<u64> = r["storage"]["depths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["depth"].as_u64().unwrap())
        .collect();
    assert_eq!(depths, [1, 4, 16, 64]);
    for d in r["storage"]["depths"].as_array().unwrap() {
        assert!(d["files"].as_u64().unwrap() > 0, "{d}");
        assert_eq!(
            d["bytes"].as_u64().unwrap(),
            d["files"].as_u64().unwrap() * SIZE as u64
        );
    }
    assert!(f64_at(&r, "/storage/mib_per_sec") > 0.0);
    assert_eq!(r["storage"]["unreadable"], 0);
    assert_eq!(r["cache"]["cache_bytes"], HALF);
    assert_eq!(r["compute_seconds"], 0.3);
    let epochs = r["cache"]["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 3);
    assert_eq!(f64_at(&epochs[0], "/minio/hit_rate"), 0.0);
    for e in &epochs[1..] {
        // 8 KiB files fill 64-byte slots exactly: MinIO holds half of them.
        assert!((f64_at(e, "/minio/hit_rate") - 0.5).abs() < 1e-9, "{e}");
        assert!(f64_at(e, "/page_cache/hit_rate") < 0.4, "{e}");
        assert!(f64_at(e, "/prefetch/hit_rate") >= 0.5, "{e}");
        let fetch = f64_at(e, "/minio/fetch_seconds");
        let want = 0.5 * (FILES * SIZE) as f64 / (f64_at(&r, "/storage/mib_per_sec") * 1048576.0);
        assert!(
            (fetch - want).abs() < 1e-6 * want.max(1.0),
            "{fetch} vs {want}"
        );
    }
    assert!(
        r["recommendation"]["minio_cache_bytes"].is_u64(),
        "{}",
        r["recommendation"]
    );
    assert!(r["sweep"].as_array().unwrap().is_empty());
    assert!(r["live"].is_null());
}

#[test]
fn a_sweep_goes_to_stdout_as_json_and_to_an_svg_plot() {
    let (dir, src) = dataset();
    let plot = dir.path().join("stalls.svg");
    let args = ["--sweep", "--rate", "2500", "--time", "1s", "--json", "-"];
    let out = analyze(&src, &[&args[..], &["--plot", text(&plot)]].concat());
    let r: Value = serde_json::from_str(&ok(&out)).expect("stdout is the JSON report alone");
    let sweep = r["sweep"].as_array().unwrap();
    assert_eq!(sweep.len(), 21);
    assert_eq!(f64_at(&sweep[0], "/fraction"), 0.0);
    assert_eq!(f64_at(&sweep[20], "/fraction"), 1.0);
    assert_eq!(sweep[20]["cache_bytes"], FILES * SIZE);
    let minio: Vec<f64> = sweep.iter().map(|p| f64_at(p, "/minio/hit_rate")).collect();
    assert!(minio.windows(2).all(|w| w[0] <= w[1]), "{minio:?}");
    assert_eq!((minio[0], minio[20]), (0.0, 1.0));
    for p in sweep {
        assert!(f64_at(p, "/page_cache/hit_rate") <= f64_at(p, "/minio/hit_rate") + 1e-9);
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for label in [
        "byte hit rate",
        "predicted epoch time",
        "page cache (LRU)",
        "coorfs minio",
    ] {
        assert!(svg.contains(label), "{label} not in the plot");
    }
}

#[test]
fn bad_input_is_one_line_and_a_defined_exit_code() {
    let (dir, src) = dataset();
    let file = src.join("c000/f000000.bin");
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(empty.join("sub")).unwrap();
    let no_data = dir.path().join("no-data");
    std::fs::create_dir_all(no_data.join("sub")).unwrap();
    std::fs::write(no_data.join("a"), b"").unwrap();
    std::fs::write(no_data.join("sub/b"), b"").unwrap();
    let json = dir.path().join("left-behind.json");
    let missing = Path::new("/nonexistent/coorfs-data");
    let p = |p: &Path| p.display().to_string();
    let not_a_mount = text(dir.path());
    let cases: Vec<(&Path, Vec<&str>, String)> = vec![
        (
            missing,
            vec![],
            format!("coorfs: dataset {}: no such file or directory", p(missing)),
        ),
        (
            &file,
            vec![],
            format!("coorfs: dataset {}: not a directory", p(&file)),
        ),
        (
            &empty,
            vec![],
            format!(
                "coorfs: dataset {} has no regular files",
                p(&empty.canonicalize().unwrap())
            ),
        ),
        (
            &no_data,
            vec![],
            format!(
                "coorfs: dataset {} holds no data: its 2 regular files are all empty",
                p(&no_data.canonicalize().unwrap())
            ),
        ),
        (
            &src,
            vec!["--cache-size", "1G", "--json", text(&json)],
            "coorfs: cache size 1.0 GiB is larger than the dataset (2.3 MiB): it all fits, there \
             is nothing to predict (give at most 2.3 MiB, or --sweep)"
                .into(),
        ),
        (
            &src,
            vec!["--time", "0"],
            "coorfs: invalid value '0' for '--time <DURATION>': \"0\": must be more than 0, e.g. \
             10s (see coorfs --help)"
                .into(),
        ),
        (
            &src,
            vec!["--rate", "0"],
            "coorfs: invalid value '0' for '--rate <SAMPLES_PER_SEC>': \"0\": expected samples \
             per second, more than 0 (see coorfs --help)"
                .into(),
        ),
        (
            &src,
            vec!["--plot", "/nonexistent/stalls.svg"],
            "coorfs: --plot /nonexistent/stalls.svg: No such file or directory (os error 2)".into(),
        ),
        (
            &src,
            vec!["--mount", not_a_mount],
            format!("coorfs: --mount: {not_a_mount} is not a coorfs mount"),
        ),
    ];
    for (dataset, args, want) in cases {
        let out = analyze(dataset, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), want, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(!json.exists(), "a failed analysis leaves no output file");
}

#[test]
fn unreadable_files_and_directories_are_counted_and_skipped() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 40, SIZE, 2);
    let secret = src.join(&rels[7]);
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    let locked = src.join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::write(locked.join("hidden"), b"not for nobody").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Root reads anything: run as nobody, for whom the file is unreadable.
    let out = output_within(
        Command::new(bin())
            .args(["analyze", "--time", "1s", "--json", "-"])
            .arg(&src)
            .uid(65534)
            .gid(65534),
        COMMAND_LIMIT,
    );
    let r: Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(r["storage"]["unreadable"], 1);
    let first = r["storage"]["first_unreadable"].as_str().unwrap();
    assert!(
        first.contains(&rels[7].display().to_string()) && first.contains("Permission denied"),
        "{first}"
    );
    assert_eq!(r["dataset"]["files"], 40, "the scan still counts it");
    assert_eq!(r["dataset"]["scan_errors"], 1, "the locked directory");
    let not_scanned = r["dataset"]["first_scan_error"].as_str().unwrap();
    assert!(not_scanned.contains("locked"), "{not_scanned}");
    assert_eq!(r["warnings"].as_array().unwrap().len(), 2);
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "coorfs: warning: 1 of 40 sampled files could not be read and were skipped",
        "coorfs: warning: could not scan 1 of the dataset's entries; they are left out",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
}

#[test]
fn the_live_check_puts_the_mounts_epochs_beside_the_prediction() {
    let (dir, src) = dataset();
    let half = HALF.to_string();
    // Prefetch off: the prediction compared here is MinIO's alone.
    let m = Mount::new(&src, &["--no-prefetch", "--cache-size", &half]);
    assert!(
        wait_for(Duration::from_secs(30), || {
            xattr::get(&m.mnt, "user.coorfs.scan_complete")
                .ok()
                .flatten()
                == Some(b"1".to_vec())
        }),
        "the scan of {} not complete after 30 s",
        m.mnt.display()
    );
    let read = coorfs([
        OsStr::new("read"),
        OsStr::new("--epochs"),
        OsStr::new("3"),
        m.mnt.as_os_str(),
    ]);
    assert!(read.status.success(), "{}", stderr(&read));

    let mnt = text(&m.mnt);
    let out = analyze(&src, &["--mount", mnt, "--time", "1s", "--json", "-"]);
    let r: Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(
        r["cache"]["cache_bytes"], HALF,
        "the mount's cache size by default"
    );
    let hit = &r["hit_path"];
    assert!(hit["files"].as_u64().unwrap() > 0, "{hit}");
    assert!(f64_at(hit, "/files_per_sec") > 0.0);
    let live = &r["live"];
    assert_eq!(live["policy"], "minio");
    assert_eq!(live["cache_capacity"], HALF);
    let epochs = live["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 3, "{live}");
    let predicted = live["predicted"].as_array().unwrap();
    assert_eq!(predicted.len(), 5);
    assert_eq!(f64_at(&epochs[0], "/byte_hit_rate"), 0.0);
    for e in &epochs[1..] {
        let want = f64_at(&predicted[1], "/hit_rate");
        let got = f64_at(e, "/byte_hit_rate");
        assert!(
            (got - want).abs() < 0.02,
            "measured {got}, predicted {want}"
        );
    }

    let report = ok(&analyze(&src, &["--mount", mnt, "--time", "1s"]));
    let want = format!("live      {mnt} (policy minio, cache 1.2 MiB)");
    assert!(report.contains(&want), "{report}");
    assert!(
        report.contains("hit path  cached files through"),
        "{report}"
    );

    // Another dataset than the mount's is refused.
    let other = dir.path().join("other");
    make_dataset(&other, 3, 100, 1);
    let out = analyze(&other, &["--mount", mnt]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "coorfs: --mount {} serves {}, not {}",
            m.mnt.display(),
            src.display(),
            other.canonicalize().unwrap().display()
        )
    );
    m.unmount();
}

#[test]
fn a_dataset_on_a_pseudo_filesystem_is_refused_at_once() {
    let mut datasets = vec!["/proc/self", "/proc"];
    if Path::new("/sys/kernel").is_dir() {
        datasets.push("/sys/kernel");
    }
    for dataset in datasets {
        let fs = if dataset.starts_with("/sys") {
            "sysfs"
        } else {
            "proc"
        };
        // /proc/self/pagemap says 0 bytes and reads on without end: this used to hang.
        let started = std::time::Instant::now();
        let out = output_within(
            Command::new(bin()).args(["analyze", dataset, "--time", "2s"]),
            Duration::from_secs(30),
        );
        let took = started.elapsed();
        assert_eq!(out.status.code(), Some(2), "{dataset}: {}", stderr(&out));
        assert_eq!(
            stderr(&out),
            format!(
                "coorfs: dataset {dataset} is on {fs}, a pseudo filesystem whose files the kernel \
                 makes up as they are read: there is no storage to measure"
            )
        );
        assert!(out.stdout.is_empty(), "{dataset}");
        assert!(took < Duration::from_secs(5), "{dataset}: {took:?}");
    }
}

#[test]
fn fifos_and_symlinks_in_a_dataset_are_left_out() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("data.bin"), bytes(1, SIZE)).unwrap();
    let fifo = std::ffi::CString::new(src.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    std::os::unix::fs::symlink(src.join("data.bin"), src.join("link-to-data")).unwrap();
    std::os::unix::fs::symlink(src.join("fifo"), src.join("link-to-fifo")).unwrap();
    std::os::unix::fs::symlink("/proc/self", src.join("link-to-proc")).unwrap();
    // Opening the FIFO to read it would wait for a writer forever.
    let out = output_within(
        Command::new(bin())
            .args(["analyze", "--time", "1s", "--json", "-"])
            .arg(&src),
        Duration::from_secs(60),
    );
    let r: Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(r["dataset"]["files"], 1, "{}", r["dataset"]);
    assert_eq!(r["dataset"]["bytes"], SIZE);
    assert_eq!(r["dataset"]["scan_errors"], 0);
    assert_eq!(r["storage"]["files"], 1, "one file sampled");
    assert_eq!(r["storage"]["unreadable"], 0);
    for d in r["storage"]["depths"].as_array().unwrap() {
        assert!(d["files"].as_u64().unwrap() > 0, "{d}");
        assert_eq!(
            d["bytes"].as_u64().unwrap(),
            d["files"].as_u64().unwrap() * SIZE as u64
        );
    }
}
