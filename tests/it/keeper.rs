//! A mount outlives its daemon: killed with SIGKILL three times in an epoch, OOM-killed in its
//! memory cgroup, or handed over on purpose (`coorfs restart`, `coorfs mount` again), the
//! daemon is replaced by the keeper and the readers of a job never see an error, and every
//! byte they read is the source's. The control socket answers root and the owner only.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// The daemon pid the mount reports once it differs from `old` (a successor serves).
fn next_daemon(m: &Mount, old: u32) -> u32 {
    let mut new = old;
    assert!(
        wait_for(Duration::from_secs(10), || {
            new = m.pid();
            new != old
        }),
        "no daemon replaced {old}"
    );
    new
}

fn kill(pid: u32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "kill {pid}");
}

fn keeper_of(m: &Mount) -> u32 {
    num(&stats(&m.mnt), "keeper_pid") as u32
}

/// Unmounts and checks that the keeper went with the daemon.
fn unmount_all(m: Mount) {
    let keeper = keeper_of(&m);
    m.unmount();
    assert!(!process_alive(keeper), "keeper {keeper} still running");
}

#[test]
fn a_daemon_killed_three_times_in_an_epoch_fails_no_read() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 240, 192 << 10, 6);
    // A cache of a third of the dataset, and a source slow enough that reads are waiting for
    // it when the daemon dies: every read goes through the daemon (no passthrough).
    let m = Mount::new(
        &src,
        &[
            "--cache-size",
            "15M",
            "--read-delay",
            "4ms",
            "--no-passthrough",
        ],
    );
    wait_for_scan(&m.mnt);
    let keeper = keeper_of(&m);
    assert!(keeper > 0 && process_alive(keeper));
    // The hit rate of an epoch once the cache is full, before the kills: epoch 1 fills it.
    let epoch_hit_rate = || {
        let before = num(&stats(&m.mnt), "hits");
        for rel in &rels {
            assert_eq!(
                std::fs::read(m.path(rel)).unwrap(),
                std::fs::read(src.join(rel)).unwrap()
            );
        }
        (num(&stats(&m.mnt), "hits") - before) as f64 / rels.len() as f64
    };
    epoch_hit_rate();
    let warm = epoch_hit_rate();
    assert!(warm > 0.2, "epoch 2 hit {warm}");
    let children = readers(&src, &m.mnt, &rels, 3, 3);
    let mut pid = m.pid();
    for _ in 0..3 {
        // Mid-epoch: some reads done, more waiting on the slow source.
        let before = num(&stats(&m.mnt), "reads");
        assert!(wait_for(Duration::from_secs(20), || {
            num(&stats(&m.mnt), "reads") >= before + 40
        }));
        kill(pid, libc::SIGKILL);
        pid = next_daemon(&m, pid);
    }
    assert_read_everything(children, "3 kills");
    // The cache outlives the daemons (the keeper holds its memory): killed once more, the
    // daemon's successor hits in its first epoch as the daemon before the kills did (a cold
    // cache would hit nothing in it).
    kill(pid, libc::SIGKILL);
    next_daemon(&m, pid);
    let after = epoch_hit_rate();
    assert!(
        after >= 0.9 * warm,
        "hit rate {after} after the kills, {warm} before"
    );
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "daemon_restarts"), 4, "{s}");
    assert_eq!(s["daemon_last_end"], "killed by SIGKILL", "{s}");
    assert_eq!(num(&s, "keeper_pid"), keeper as u64, "{s}");
    assert_eq!(num(&s, "resends"), 1, "this kernel (6.9+) resends: {s}");
    let pause = s["daemon_longest_pause_seconds"].as_f64().unwrap();
    assert!(pause > 0.0 && pause < 1.0, "longest pause {pause} s: {s}");
    assert_eq!(num(&s, "source_errors"), 0, "{s}");
    unmount_all(m);
}

#[test]
fn a_handover_asked_for_mid_epoch_fails_no_read() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 200, 128 << 10, 4);
    let m = Mount::new(&src, &["--cache-size", "8M", "--read-delay", "3ms"]);
    wait_for_scan(&m.mnt);
    let children = readers(&src, &m.mnt, &rels, 2, 3);
    std::thread::sleep(Duration::from_millis(300));
    let first = m.pid();
    // `coorfs mount` again over the live mount of the same source, from the same binary:
    // refused as before.
    let out = coorfs([OsStr::new("mount"), src.as_os_str(), m.mnt.as_os_str()]);
    fails_with_line(&out, 2, "is already a coorfs mount", "mount again");
    assert_eq!(m.pid(), first);
    // From another binary (an upgraded coorfs): an upgrade in place, and the keeper runs the
    // new binary from then on.
    let upgraded = dir.path().join("coorfs-upgraded");
    std::fs::copy(bin(), &upgraded).unwrap();
    let out = output_within(
        Command::new(&upgraded).arg("mount").arg(&src).arg(&m.mnt),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("handed to a new daemon"),
        "{}",
        stderr(&out)
    );
    let second = m.pid();
    assert_ne!(second, first);
    assert!(!process_alive(first), "the old daemon {first} still runs");
    assert_eq!(
        std::fs::read_link(format!("/proc/{second}/exe")).unwrap(),
        upgraded
    );
    std::thread::sleep(Duration::from_millis(300));
    // `coorfs restart` does the same, and says which daemon serves now.
    let out = coorfs([OsStr::new("restart"), m.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let third = m.pid();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{}: served by a new daemon (pid {third})", m.mnt.display())
    );
    assert_read_everything(children, "2 handovers");
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "daemon_restarts"), 2, "{s}");
    assert_eq!(s["daemon_last_end"], "handed over", "{s}");
    // Over a live mount of another source: refused, as before.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let out = coorfs([OsStr::new("mount"), other.as_os_str(), m.mnt.as_os_str()]);
    fails_with_line(
        &out,
        2,
        "is already a coorfs mount",
        "mount over another source",
    );
    unmount_all(m);
}

#[test]
fn only_root_and_the_owner_may_ask_for_a_handover() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_dataset(&src, 4, 1000, 1);
    let m = Mount::new(&src, &["--allow-other"]);
    let pid = m.pid();
    let out = as_nobody(bin(), &[OsStr::new("restart"), m.mnt.as_os_str()]);
    fails_with_line(&out, 1, "permission denied", "restart as nobody");
    assert_eq!(m.pid(), pid, "nobody's restart replaced the daemon");
    assert_eq!(num(&stats(&m.mnt), "daemon_restarts"), 0);
    // A mount without a keeper says so.
    let plain = Mount::new(&src, &["--no-keeper"]);
    let out = coorfs([OsStr::new("restart"), plain.mnt.as_os_str()]);
    fails_with_line(
        &out,
        2,
        "has no keeper to hand it over",
        "restart --no-keeper",
    );
    assert_eq!(num(&stats(&plain.mnt), "keeper_pid"), 0);
    assert_eq!(num(&stats(&plain.mnt), "resends"), 0);
    plain.unmount();
    unmount_all(m);
}

#[test]
fn without_a_keeper_a_killed_daemon_ends_the_mount() {
    // What --no-keeper gives up: the readers' next request fails with ENOTCONN.
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 4, 1000, 1);
    let m = Mount::new(&src, &["--no-keeper"]);
    kill(m.pid(), libc::SIGKILL);
    let start = Instant::now();
    let err = loop {
        match std::fs::read(m.path(&rels[0])) {
            Err(e) => break e,
            Ok(_) if start.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Ok(_) => panic!("the mount still serves without its daemon"),
        }
    };
    // The first request after the death is aborted, the later ones find no connection.
    assert!(
        [libc::ECONNABORTED, libc::ENOTCONN].contains(&err.raw_os_error().unwrap()),
        "{err}"
    );
}

#[test]
fn an_oom_killed_daemon_is_replaced_and_its_readers_read_on() {
    let Some(pod) = TestCgroup::new("keeper-oom", 400 << 20)
        .map_err(|why| {
            println!("SKIP: {why}");
        })
        .ok()
    else {
        return;
    };
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 300, 512 << 10, 6);
    let mnt_dir = open_tempdir();
    let mnt = mnt_dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // The mount in a pod of 400 MiB with a cache of 120 MiB; a process of the pod then takes
    // 320 MiB, more than the pod has beside the daemon: the OOM killer takes the daemon
    // (oom_score_adj 500), and the 320 MiB fit beside its successor.
    let out = pod.coorfs(&[
        OsStr::new("mount"),
        OsStr::new("--cache-size"),
        OsStr::new("120M"),
        OsStr::new("--no-passthrough"),
        src.as_os_str(),
        mnt.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let guard = UnmountOnDrop(mnt.clone());
    wait_for_scan(&mnt);
    // Fill the cache.
    for rel in &rels {
        std::fs::read(mnt.join(rel)).unwrap();
    }
    let daemon = coorfs::daemon::daemon_pid(&mnt).unwrap();
    let children = readers(&src, &mnt, &rels, 2, 2);
    let hog = pod
        .command("python3")
        .arg("-c")
        .arg(
            "import time\nb=[]\nfor i in range(80):\n    b.append(bytearray(4<<20))\n    time.sleep(0.02)\n\
             time.sleep(1)\n",
        )
        .output()
        .unwrap();
    // The OOM killer takes the daemon first (checked below). It may take the hog as well a
    // few milliseconds later: the dead daemon's memory is uncharged from the pod only as its
    // pages are freed, and the hog's next page may come before (seen in 2 runs of 5).
    let _ = hog;
    assert_read_everything(children, "an OOM kill");
    let s = stats(&mnt);
    assert!(pod.oom_kills() >= 1, "no OOM kill: {s}");
    assert_ne!(num(&s, "pid"), daemon as u64, "{s}");
    assert!(num(&s, "daemon_restarts") >= 1, "{s}");
    assert_eq!(s["daemon_last_end"], "killed by the OOM killer", "{s}");
    let out = coorfs([OsStr::new("umount"), mnt.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    drop(guard);
}

#[test]
fn the_log_says_what_each_daemon_did_and_how_it_ended() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 3, 300_000, 1);
    let log = dir.path().join("log");
    let log_arg = log.display().to_string();
    let m = Mount::new(
        &src,
        &[
            "--log-level",
            "debug",
            "--log-file",
            &log_arg,
            "--no-passthrough",
        ],
    );
    assert_eq!(
        std::fs::read(m.path(&rels[0])).unwrap(),
        std::fs::read(src.join(&rels[0])).unwrap()
    );
    let dead = m.pid();
    kill(dead, libc::SIGKILL);
    assert_eq!(
        std::fs::read(m.path(&rels[1])).unwrap(),
        std::fs::read(src.join(&rels[1])).unwrap()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    // Each FUSE operation and each fetch ends with a line: what, and how long it took.
    let name = rels[0].file_name().unwrap().to_str().unwrap();
    assert!(
        text.lines().any(|l| l.contains("fuse{")
            && l.contains("op=\"read\"")
            && l.contains("close time.busy")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.contains("fetch{file=")
            && l.contains(name)
            && l.contains("tier=Source bytes=300000")
            && l.contains("close time.busy")),
        "{text}"
    );
    // The keeper says how the daemon ended, and the successor what it took over.
    assert!(
        text.contains(&format!("daemon (pid {dead}) killed by SIGKILL")),
        "{text}"
    );
    assert!(text.contains("took the mount over"), "{text}");
    unmount_all(m);
}

/// Starts a reader of `rel` in the mount (a child: a read the kernel strands cannot be
/// interrupted, and the test must go on).
fn cat(m: &Mount, rel: &Path) -> Child {
    Command::new("cat")
        .arg(m.path(rel))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Why `--io-uring auto` takes /dev/fuse under a keeper: a read the daemon holds when it is
/// killed. The source takes 3 s a read, and the daemon is killed 1 s into one. With
/// /dev/fuse (the default under a keeper) the successor gets the read again
/// (FUSE_NOTIFY_RESEND) and answers it. With io_uring (`--io-uring on`) the successor
/// serves the ring (it registers entries of its own, and a request made in between gets
/// through), but the read the dead daemon held in its ring entry is never sent again: on
/// Linux 6.18 the kernel resends only requests read from /dev/fuse, and waits for the dead
/// entry's commit for ever (unless the read was still queued on its CPU, which the test
/// accepts and says). Should a kernel resend entries' requests, `--io-uring auto` may take
/// io_uring under a keeper.
#[test]
fn a_read_held_by_a_killed_daemon_is_resent_over_dev_fuse_and_may_be_stranded_over_io_uring() {
    let _restore = EnableUring::keep();
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 8, 64 << 10, 1);
    let slow = [
        "--policy",
        "none",
        "--read-delay",
        "3000ms",
        "--no-passthrough",
        "--no-prefetch",
    ];

    let m = Mount::new(&src, &slow);
    assert_eq!(stats(&m.mnt)["transport"], "dev_fuse");
    let held = cat(&m, &rels[0]);
    std::thread::sleep(Duration::from_millis(1000));
    let pid = m.pid();
    kill(pid, libc::SIGKILL);
    next_daemon(&m, pid);
    let out = wait_within(held, Duration::from_secs(20), "the held read");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, std::fs::read(src.join(&rels[0])).unwrap());
    unmount_all(m);

    if !Path::new(ENABLE_URING).exists() {
        eprintln!("no FUSE over io_uring on this kernel: the rest is skipped");
        return;
    }
    let mut args = slow.to_vec();
    args.extend(["--io-uring", "on"]);
    let m = Mount::new(&src, &args);
    assert_eq!(stats(&m.mnt)["transport"], "io_uring");
    let conn = fuse_connection(&m.mnt);
    let held = cat(&m, &rels[1]);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(waiting(&conn), 1);
    let pid = m.pid();
    kill(pid, libc::SIGKILL);
    // A request made while no daemon has entries waits in its CPU's queue until the
    // successor drains the queues (before, it waited for ever on an idle mount). Not at once:
    // the dead daemon's free entries go only when the kernel tears its ring down, after the
    // process is gone, and a request put in one meanwhile is lost like the held read.
    while process_alive(pid) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    let successor = m.pid();
    assert_ne!(successor, pid);
    assert!(asked.elapsed() < Duration::from_secs(5));
    let keeper = keeper_of(&m);
    assert_eq!(stats(&m.mnt)["transport"], "io_uring");
    // The successor serves reads over its ring...
    let fresh = cat(&m, &rels[2]);
    let out = wait_within(fresh, Duration::from_secs(20), "a read after the kill");
    assert!(out.status.success());
    assert_eq!(out.stdout, std::fs::read(src.join(&rels[2])).unwrap());
    // ...but a read the dead daemon held in a ring entry is never answered (3 s of source
    // delay is long past). Whether it was in an entry, or still queued on its CPU (both
    // entries busy, then the successor takes it), is the kernel's choice: a queued one must
    // come back right, an entry's stays until the connection is aborted.
    std::thread::sleep(Duration::from_secs(5));
    let mut held = held;
    if held.try_wait().unwrap().is_some() {
        let out = held.wait_with_output().unwrap();
        eprintln!("the held read was queued, not in an entry: the successor answered it");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, std::fs::read(src.join(&rels[1])).unwrap());
        m.unmount();
        assert!(wait_for(Duration::from_secs(10), || !process_alive(keeper)));
        return;
    }
    assert_eq!(waiting(&conn), 1, "the stranded read");
    // Only ending the connection frees it.
    std::fs::write(conn.join("abort"), "1").unwrap();
    let out = wait_within(held, Duration::from_secs(10), "the stranded read");
    assert!(!out.status.success());
    // The mount is dead (its attributes with it): the keeper and the daemon go as for an
    // unmount, and the mount point is detached when `m` is dropped.
    assert!(
        wait_for(Duration::from_secs(10), || {
            !process_alive(keeper) && !process_alive(successor)
        }),
        "keeper {keeper} or daemon {successor} outlived the aborted connection"
    );
}
