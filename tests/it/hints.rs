//! The `coorfs` Python package (python/) against a real mount, with Python's standard library
//! only (its tests without a mount run from tests/it/python.rs; the torch parts are checked by
//! scripts/check-frameworks.sh).

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::common::*;

#[test]
fn the_python_package_hands_orders_to_the_mount_and_reads_its_stats() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_dataset(&src, 120, 2000, 4);
    // A budget no file fits in (MinIO's slots are 64 bytes): nothing is cached, and every
    // byte comes through the daemon, staged or from the source. (--cache-size 0 is refused.)
    let m = Mount::new(&src, &["--cache-size", "1"]);
    wait_for_scan(&m.mnt);
    let package = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
    let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/hint_client.py");
    let out = output_within(
        Command::new("python3")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .arg(client)
            .arg(package)
            .arg(&m.mnt)
            // A job of its own, named by its group, whatever runs the tests.
            .process_group(0),
        COMMAND_LIMIT,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["files"], 120, "{got}");
    assert_eq!(got["unknown"], "ENOENT");
    assert_eq!(got["directory"], "EINVAL");
    assert_eq!(got["outside"], "ValueError");
    assert_eq!(got["lenient"], serde_json::json!([false, 1]));
    // coorfs.read_stats and coorfs.cached_bytes, read through os.getxattr: the dataset as the
    // scan found it, and nothing cached (the budget holds no file).
    assert_eq!(
        (got["stats_files"].as_u64(), got["stats_bytes"].as_u64()),
        (Some(120), Some(120 * 2000)),
        "{got}"
    );
    assert_eq!(got["cached"], 0, "{got}");

    let s = stats(&m.mnt);
    assert_eq!(
        (s["hints_accepted"].as_u64(), s["hints_rejected"].as_u64()),
        (Some(2), Some(3)),
        "{s}"
    );
    let job = s["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == format!("pgid {}", got["pgid"]))
        .unwrap_or_else(|| panic!("no job for the client in {s}"));
    // The two epochs the client read. Once the second is complete the prefetcher may start
    // on the third (remaining-set prefetch: every file is left to read), which the client,
    // gone, never reads: at most an open epoch with no file read.
    let all = job["epochs"].as_array().unwrap();
    let (epochs, next): (Vec<_>, Vec<_>) = all.iter().partition(|e| e["files"] != 0);
    assert_eq!(epochs.len(), 2, "{job}");
    assert!(
        next.iter()
            .all(|e| e["complete"] == false && e["epoch"] == 3),
        "{job}"
    );
    for e in epochs {
        assert_eq!(
            (e["files"].as_u64(), e["complete"].as_bool()),
            (Some(120), Some(true)),
            "{e}"
        );
        // No cache: every file came through the staging area or from the source, once.
        assert_eq!(e["bytes_from_source"].as_u64(), Some(120 * 2000), "{e}");
        assert_eq!(e["prefetched_unused"].as_u64(), Some(0), "{e}");
    }
    m.unmount();
}

#[test]
fn a_hint_applies_whole_at_its_commit_and_a_refused_one_changes_nothing() {
    use coorfs::fs::order::{CHUNK_BYTES, HINT_CHUNK, HINT_COMMIT, chunks};
    use std::os::fd::AsRawFd;
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 20, 100, 2);
    let m = Mount::new(&src, &[]);
    wait_for_scan(&m.mnt);
    let text: Vec<u8> = rels
        .iter()
        .flat_map(|r| format!("{}\n", r.display()).into_bytes())
        .collect();
    let (head, tail) = text.split_at(text.len() / 2 + 3); // mid-path
    let f = std::fs::File::open(m.path(".coorfs-order")).unwrap();
    let ioctl = |cmd: u32, arg: *mut u8| -> Result<(), i32> {
        // SAFETY: a chunk of the size HINT_CHUNK names, or no argument; the file is open.
        match unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, arg) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
        }
    };
    let send = |part: &[u8]| -> Result<(), i32> {
        chunks(part).try_for_each(|mut chunk| ioctl(HINT_CHUNK, chunk.as_mut_ptr()))
    };
    let accepted = || num(&stats(&m.mnt), "hints_accepted");
    // Half a hint, cut mid-path, applies nothing until the commit; then all of it.
    send(head).unwrap();
    assert!(Command::new("true").status().unwrap().success());
    assert_eq!(accepted(), 0);
    send(tail).unwrap();
    ioctl(HINT_COMMIT, std::ptr::null_mut()).unwrap();
    assert_eq!(accepted(), 1);
    // A chunk whose count runs past its buffer; a commit with nothing sent.
    let mut bad = vec![0u8; CHUNK_BYTES];
    bad[..4].copy_from_slice(&(CHUNK_BYTES as u32).to_le_bytes());
    assert_eq!(ioctl(HINT_CHUNK, bad.as_mut_ptr()), Err(libc::EINVAL));
    assert_eq!(ioctl(HINT_COMMIT, std::ptr::null_mut()), Err(libc::EINVAL));
    // A hint naming a missing file is refused at its commit and changes nothing; the same
    // descriptor then takes the next hint.
    send(b"no/such/file\n").unwrap();
    assert_eq!(ioctl(HINT_COMMIT, std::ptr::null_mut()), Err(libc::ENOENT));
    send(&text).unwrap();
    ioctl(HINT_COMMIT, std::ptr::null_mut()).unwrap();
    let s = stats(&m.mnt);
    assert_eq!(
        (num(&s, "hints_accepted"), num(&s, "hints_rejected")),
        (2, 2),
        "{s}"
    );
    drop(f);
    m.unmount();
}

#[test]
fn coorfs_hint_hands_over_an_order_from_a_file_or_stdin_and_says_why_it_was_refused() {
    use std::io::Write;
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 30, 100, 3);
    // One job for the user: the hint of the `coorfs hint` process steers the reader after it.
    let m = Mount::new(&src, &["--job-key", "uid"]);
    wait_for_scan(&m.mnt);
    let mut order: Vec<String> = rels.iter().map(|r| r.display().to_string()).collect();
    order.reverse();
    let file = dir.path().join("order.txt");
    std::fs::write(&file, order.join("\n") + "\n").unwrap();
    let out = coorfs([OsStr::new("hint"), m.mnt.as_os_str(), file.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // From standard input, with absolute paths below the mount point.
    let absolute: String = order
        .iter()
        .map(|r| format!("{}\n", m.path(r).display()))
        .collect();
    let mut child = Command::new(bin())
        .args([OsStr::new("hint"), m.mnt.as_os_str()])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(absolute.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Refused: a name that is no file of the mount; no mount at all; no order file to read.
    let refused = |args: &[&OsStr], want: &str| {
        let out = coorfs(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    std::fs::write(&file, "c000/no-such-file\n").unwrap();
    refused(
        &[OsStr::new("hint"), m.mnt.as_os_str(), file.as_os_str()],
        "No such file or directory",
    );
    refused(
        &[OsStr::new("hint"), src.as_os_str(), file.as_os_str()],
        "is not a coorfs mount",
    );
    refused(
        &[
            OsStr::new("hint"),
            m.mnt.as_os_str(),
            OsStr::new("/no/order"),
        ],
        "/no/order: No such file or directory",
    );
    let s = stats(&m.mnt);
    assert_eq!(
        (num(&s, "hints_accepted"), num(&s, "hints_rejected")),
        (2, 1),
        "{s}"
    );
    // The user's job holds the last accepted order.
    let jobs = s["jobs"].as_array().expect("jobs");
    assert!(
        jobs.iter().any(|j| j["hint_files"].as_u64() == Some(30)),
        "{s}"
    );
    m.unmount();
}
