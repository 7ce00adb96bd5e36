//! FUSE over io_uring (Linux 6.14 and later, `--io-uring auto|on`; off by default): a mount
//! that asks for it turns the fuse module's
//! `enable_uring` on, its reads return the source's bytes over one ring thread per CPU, and
//! stat `transport` says `io_uring`; `--io-uring off`, or a kernel switch that cannot be
//! turned on, keeps `/dev/fuse`. Why `--io-uring auto` keeps `/dev/fuse` under a keeper (a
//! daemon that goes strands the reads its ring entries hold) is in `keeper.rs`.
//!
//! The tests change a machine-wide switch: they run one at a time and put it back as they
//! found it ([`EnableUring`], which `keeper.rs` holds too).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

/// False (and says so) on a kernel without FUSE over io_uring.
fn kernel_has_io_uring() -> bool {
    let has = Path::new(ENABLE_URING).exists();
    if !has {
        eprintln!("skipped: this kernel has no FUSE over io_uring");
    }
    has
}

/// The names of the daemon's threads.
fn threads(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}

/// Threads that serve a ring queue (`fuser-ring-QID`).
fn ring_threads(pid: u32) -> usize {
    threads(pid)
        .iter()
        .filter(|t| t.starts_with("fuser-ring-"))
        .count()
}

fn read_all(m: &Mount, src: &Path, rels: &[PathBuf]) {
    for rel in rels {
        assert_eq!(
            std::fs::read(m.path(rel)).unwrap(),
            std::fs::read(src.join(rel)).unwrap(),
            "{}",
            rel.display()
        );
    }
}

fn transport(m: &Mount) -> String {
    stats(&m.mnt)["transport"].as_str().unwrap().to_string()
}

fn set_enable_uring(on: bool) {
    std::fs::write(ENABLE_URING, if on { "Y" } else { "N" }).unwrap();
}

#[test]
fn without_a_keeper_requests_come_over_io_uring() {
    let _alone = EnableUring::keep();
    if !kernel_has_io_uring() {
        return;
    }
    set_enable_uring(false);
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 120, 40 << 10, 4);
    let log = dir.path().join("log");
    let m = Mount::new(
        &src,
        &[
            "--no-keeper",
            "--io-uring",
            "auto",
            "--no-passthrough",
            "--log-file",
            log.to_str().unwrap(),
        ],
    );
    // The mount turned the kernel's switch on, and said so.
    assert_eq!(std::fs::read_to_string(ENABLE_URING).unwrap().trim(), "Y");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("turned the fuse module's enable_uring on"),
        "{said}"
    );
    assert_eq!(transport(&m), "io_uring");
    let before = num(&stats(&m.mnt), "reads");
    read_all(&m, &src, &rels);
    // One ring thread per possible CPU, and the attribute says the same as the document.
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let possible = cpus.trim().rsplit(['-', ',']).next().unwrap();
    let possible: usize = possible.parse::<usize>().unwrap() + 1;
    assert_eq!(ring_threads(m.pid()), possible, "{:?}", threads(m.pid()));
    let attr = xattr::get(&m.mnt, "user.coorfs.transport")
        .unwrap()
        .unwrap();
    assert_eq!(attr, b"io_uring");
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "reads") - before, rels.len() as u64, "{s}");
    m.unmount();

    // The default (--io-uring off): /dev/fuse, the same bytes, no ring thread.
    let off = Mount::new(&src, &["--no-keeper"]);
    assert_eq!(transport(&off), "dev_fuse");
    read_all(&off, &src, &rels);
    assert_eq!(ring_threads(off.pid()), 0, "{:?}", threads(off.pid()));
    off.unmount();
}

/// The kernel's switch is off and cannot be turned on (here: a read-only file over it, in a
/// mount namespace of the test's own, where the whole mount lives): the mount says why in
/// its log and serves over /dev/fuse, the same bytes.
#[test]
fn a_kernel_switch_that_cannot_be_turned_on_leaves_dev_fuse() {
    let _alone = EnableUring::keep();
    if !kernel_has_io_uring() {
        return;
    }
    set_enable_uring(false);
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 20, 30 << 10, 2);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let off = dir.path().join("enable_uring");
    std::fs::write(&off, "N\n").unwrap();
    let log = dir.path().join("log");
    let script = r#"
set -e
src=$1 mnt=$2 off=$3 log=$4 bin=$5; shift 5
trap 'umount -l "$mnt" 2>/dev/null || true' EXIT
mount --bind -o ro "$off" /sys/module/fuse/parameters/enable_uring
"$bin" mount --no-keeper --io-uring auto --no-passthrough --log-file "$log" "$src" "$mnt"
echo "transport $(getfattr --only-values -n user.coorfs.transport "$mnt")"
for rel in "$@"; do cmp "$src/$rel" "$mnt/$rel"; done
echo read
"$bin" umount "$mnt"
"#;
    let out = output_within(
        Command::new("unshare")
            .args(["--mount", "sh", "-c", script, "sh"])
            .arg(&src)
            .arg(&mnt)
            .arg(&off)
            .arg(&log)
            .arg(bin())
            .args(&rels)
            .stdin(Stdio::null()),
        Duration::from_secs(60),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said} {}", stderr(&out));
    assert!(said.contains("transport dev_fuse\nread\n"), "{said}");
    // The kernel's own switch is as it was: off.
    assert_eq!(std::fs::read_to_string(ENABLE_URING).unwrap().trim(), "N");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("cannot turn /sys/module/fuse/parameters/enable_uring on"),
        "{log}"
    );
}

/// Under a keeper `--io-uring auto` keeps `/dev/fuse`: the kernel never sends
/// again a request it put in a ring entry, so a daemon that goes would strand the reads its
/// entries hold (`keeper.rs`), while requests read from `/dev/fuse` are resent to its
/// successor. Two handovers mid-epoch fail no read.
#[test]
fn under_a_keeper_auto_keeps_dev_fuse_and_handovers_fail_no_read() {
    let _alone = EnableUring::keep();
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 200, 128 << 10, 4);
    let m = Mount::new(
        &src,
        &[
            "--cache-size",
            "8M",
            "--read-delay",
            "3ms",
            "--no-passthrough",
        ],
    );
    wait_for_scan(&m.mnt);
    assert_eq!(transport(&m), "dev_fuse");
    let children = readers(&src, &m.mnt, &rels, 2, 3);
    let mut pid = m.pid();
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(300));
        let out = coorfs([OsStr::new("restart"), m.mnt.as_os_str()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let next = m.pid();
        assert_ne!(next, pid);
        assert_eq!(transport(&m), "dev_fuse");
        pid = next;
    }
    assert_read_everything(children, "2 handovers under a keeper, --io-uring auto");
    let keeper = num(&stats(&m.mnt), "keeper_pid") as u32;
    m.unmount();
    assert!(!process_alive(keeper), "keeper {keeper} still running");
}
