//! The `coorfs` Python package (python/) against a real mount, with Python's standard library
//! only (its tests without a mount run from tests/python.rs; the torch parts are checked by
//! scripts/check-frameworks.sh).

mod common;

use std::os::unix::process::CommandExt;
use std::process::Command;

use common::*;

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
    let epochs = job["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 2, "{job}");
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
fn a_child_spawned_while_a_hint_is_written_does_not_apply_half_of_it() {
    use std::io::Write;
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
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path(".coorfs-order"))
        .unwrap();
    f.write_all(head).unwrap();
    // The child inherits the descriptor and exec closes it: a flush from another process.
    assert!(Command::new("true").status().unwrap().success());
    f.write_all(tail).unwrap();
    // SAFETY: closes the descriptor we own, once, to see the daemon's verdict.
    let rc = unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(f)) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let s = stats(&m.mnt);
    assert_eq!(
        (num(&s, "hints_accepted"), num(&s, "hints_rejected")),
        (1, 0),
        "{s}"
    );
    m.unmount();
}
