//! The elastic cache budget (`--cache-size auto`, the default) in real memory cgroups: it
//! starts from what the cgroup has free, shrinks (dropping its newest blocks, giving the
//! memory back) when a job in the same cgroup allocates, so that nothing is OOM-killed, grows
//! again when the job frees it, small pods mount and read, and shards bigger than the cache
//! are read once an epoch. A fixed budget that cannot fit is refused with what fits. Each
//! test skips, saying why, where no v1 memory cgroup can be made.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A test's cgroup, or None (the test skips) where none can be made.
fn cgroup(name: &str, limit: u64) -> Option<TestCgroup> {
    match TestCgroup::new(name, limit) {
        Ok(cg) => Some(cg),
        Err(why) => {
            println!("SKIP: {why}: only the pure parts ran (cargo test --lib elastic)");
            None
        }
    }
}

fn dir_755(parent: &Path, name: &str) -> PathBuf {
    let p = parent.join(name);
    std::fs::create_dir(&p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Files of sizes from 20 KiB to 2 MiB (so both of the cache's stores are used: the arena
/// for files up to 64 KiB, files the kernel reads for larger ones), `total` bytes or a
/// little more.
fn mixed_dataset(root: &Path, total: u64) {
    let sizes = [20 << 10, 48 << 10, 150 << 10, 400 << 10, 900 << 10, 2 << 20];
    let (mut i, mut written) = (0u64, 0u64);
    while written < total {
        let size = sizes[i as usize % sizes.len()];
        std::fs::write(root.join(format!("f{i:05}.bin")), bytes(i, size)).unwrap();
        written += size as u64;
        i += 1;
    }
}

/// Unmounts at the end of a test, passed or not.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = coorfs([OsStr::new("umount"), self.0.as_os_str()]);
        }
        if is_mounted(&self.0) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
}

/// "12.0 MiB" and the like, as coorfs prints sizes, in bytes.
fn parse_printed_size(text: &str) -> u64 {
    let (number, unit) = text.split_once(' ').unwrap();
    let n: f64 = number.parse().unwrap();
    let shift = match unit {
        "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        other => panic!("unit {other}"),
    };
    (n * (1u64 << shift) as f64) as u64
}

#[test]
fn the_default_budget_is_elastic_and_a_fixed_one_must_fit() {
    let Some(cg) = cgroup("budget", GIB) else {
        return;
    };
    let dir = open_tempdir();
    let src = dir_755(dir.path(), "src");
    std::fs::write(src.join("hello"), b"hello").unwrap();
    let mnt = dir_755(dir.path(), "mnt");
    let _unmount = Unmount(mnt.clone());
    let log = dir.path().join("coorfs.log");
    let mount = |extra: &[&str]| {
        let mut args: Vec<&OsStr> = vec![OsStr::new("mount")];
        args.extend(extra.iter().map(OsStr::new));
        args.extend([
            OsStr::new("--log-file"),
            log.as_os_str(),
            src.as_os_str(),
            mnt.as_os_str(),
        ]);
        cg.coorfs(&args)
    };
    let umount = || {
        let out = coorfs([OsStr::new("umount"), mnt.as_os_str()]);
        assert!(out.status.success(), "{}", stderr(&out));
    };

    // Default options: what the 1 GiB leaves beyond the staging area and the reserve kept for
    // the job (a sixteenth of the limit each), less what coorfs itself uses.
    for extra in [&[][..], &["--cache-size", "auto"][..]] {
        let out = mount(extra);
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        let s = stats(&mnt);
        assert_eq!(s["cache_budget"], "auto", "{s}");
        assert_eq!(num(&s, "prefetch_memory"), 64 * MIB);
        let cache = num(&s, "cache_capacity");
        let most = GIB - 64 * MIB - 64 * MIB;
        assert!(
            cache <= most && cache + 48 * MIB >= most,
            "{cache} vs {most}"
        );
        assert_eq!(cache % MIB, 0);
        umount();
        let text = std::fs::read_to_string(&log).unwrap();
        let want = format!(
            "cache: {size} (auto: {size} now; grows while memory cgroup {} has more than \
             64.0 MiB free, shrinks when it has less (limit 1.0 GiB, ",
            cg.path,
            size = coorfs::units::format_size(cache)
        );
        assert!(text.contains(&want), "want {want:?} in {text}");
    }

    // A fixed budget that cannot fit is refused with one line that names what was passed and
    // what would fit, and nothing is mounted.
    for (extra, head, tail) in [
        (
            &["--cache-size", "2G"][..],
            "coorfs: --cache-size 2.0 GiB and --prefetch-memory 64.0 MiB do not fit",
            " of cache fits beside that prefetch memory; leave --cache-size out (or pass auto) \
             for a cache that grows and shrinks with what is free",
        ),
        (
            &["--cache-size", "2G", "--no-prefetch"][..],
            "coorfs: --cache-size 2.0 GiB does not fit",
            " fits; leave --cache-size out (or pass auto) for a cache that grows and shrinks \
             with what is free",
        ),
        (
            &["--cache-size", "900M", "--prefetch-memory", "256M"][..],
            "coorfs: --cache-size 900 MiB and --prefetch-memory 256 MiB do not fit",
            " of cache fits beside that prefetch memory; leave --cache-size out (or pass auto) \
             for a cache that grows and shrinks with what is free",
        ),
    ] {
        let out = mount(extra);
        let line = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {line}");
        assert_eq!(line.lines().count(), 1, "{line}");
        let prefix = format!("{head} the memory cgroup {} (limit 1.0 GiB, ", cg.path);
        let rest = line
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(tail))
            .unwrap_or_else(|| panic!("{extra:?}: want {prefix:?}...{tail:?} in {line:?}"));
        let (in_use, fits) = rest.split_once(" in use): at most ").unwrap();
        let (in_use, fits) = (parse_printed_size(in_use), parse_printed_size(fits));
        let staging = if extra.contains(&"--no-prefetch") {
            0
        } else if extra.contains(&"256M") {
            256 * MIB
        } else {
            64 * MIB
        };
        // What fits is what is free beside the staging area, in whole MiB.
        let free = GIB - in_use;
        assert!(
            fits <= free - staging && fits + 2 * MIB >= free - staging,
            "{line}"
        );
        assert!(!is_mounted(&mnt));
    }

    // One that fits is taken as given, and stays put.
    let out = mount(&["--cache-size", "512M"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = stats(&mnt);
    assert_eq!(
        (num(&s, "cache_capacity"), &s["cache_budget"]),
        (512 * MIB, &"fixed".into())
    );
    umount();
}

/// The job: reads the mount in epochs, checking every file against the digests computed
/// from the source, and allocates (and touches) ALLOC MiB before epoch 3, freeing it after.
/// Prints one JSON line of the mount's budget after each phase.
const JOB: &str = r#"
import hashlib, json, os, random, sys, time
mnt, digests, alloc_mib, memstat = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3]), sys.argv[4]
def x(name):
    return int(os.getxattr(mnt, "user.coorfs." + name))
def in_use():
    stat = dict(l.split() for l in open(os.path.join(memstat, "memory.stat")))
    usage = int(open(os.path.join(memstat, "memory.usage_in_bytes")).read())
    return usage - (int(stat["total_cache"]) - int(stat["total_shmem"]))
def epoch():
    names = list(digests)
    random.shuffle(names)
    for n in names:
        with open(os.path.join(mnt, n), "rb") as f:
            if hashlib.blake2b(f.read()).hexdigest() != digests[n]:
                sys.exit("wrong bytes in " + n)
def report(phase):
    print(json.dumps({"phase": phase, "capacity": x("cache_capacity"), "used": x("cache_used"),
                      "staging": x("prefetch_memory"), "in_use": in_use()}), flush=True)
epoch(); epoch()
report("before")
held = bytearray(alloc_mib << 20)
held[::4096] = b"\x01" * len(held[::4096])
time.sleep(0.5)
report("allocated")
epoch()
report("during")
during = x("cache_capacity")
del held
# The cache grows back once the job's peak is SETTLE (10 s) old.
deadline = time.time() + 25
while time.time() < deadline and x("cache_capacity") < during + (alloc_mib << 20) // 2:
    time.sleep(0.1)
epoch()
report("after")
"#;

#[test]
fn a_job_that_allocates_mid_run_is_not_oom_killed_and_the_cache_shrinks_and_regrows() {
    const ALLOC: u64 = 600 * MIB;
    let Some(cg) = cgroup("alloc", GIB) else {
        return;
    };
    let dir = open_tempdir();
    let src = dir_755(dir.path(), "src");
    mixed_dataset(&src, 1200 * MIB);
    let mnt = dir_755(dir.path(), "mnt");
    let _unmount = Unmount(mnt.clone());
    // The digests, outside the cgroup.
    let digests = dir.path().join("digests.json");
    let out = output_within(
        std::process::Command::new("python3").args([
            "-c",
            "import hashlib, json, os, sys\n\
             d = {n: hashlib.blake2b(open(os.path.join(sys.argv[1], n), 'rb').read()).hexdigest() \
                  for n in os.listdir(sys.argv[1])}\n\
             json.dump(d, open(sys.argv[2], 'w'))\n",
            src.to_str().unwrap(),
            digests.to_str().unwrap(),
        ]),
        COMMAND_LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));

    let log = dir.path().join("coorfs.log");
    let args = [
        OsStr::new("mount"),
        OsStr::new("--log-file"),
        log.as_os_str(),
        src.as_os_str(),
        mnt.as_os_str(),
    ];
    let out = cg.coorfs(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let alloc_mib = (ALLOC / MIB).to_string();
    let job = output_within(
        cg.command("python3").args([
            OsStr::new("-c"),
            OsStr::new(JOB),
            mnt.as_os_str(),
            digests.as_os_str(),
            OsStr::new(&alloc_mib),
            cg.dir.as_os_str(),
        ]),
        COMMAND_LIMIT,
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        cg.oom_kills(),
        0,
        "OOM kill in the cgroup; daemon log:\n{text}"
    );
    assert!(
        job.status.success(),
        "job: {:?} {}\n{}\ndaemon log:\n{text}",
        job.status,
        stderr(&job),
        String::from_utf8_lossy(&job.stdout)
    );
    let phases: Vec<serde_json::Value> = String::from_utf8_lossy(&job.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at = |phase: &str, key: &str| {
        let p = phases.iter().find(|p| p["phase"] == phase).unwrap();
        num(p, key)
    };
    println!("{phases:?}");
    let s = stats(&mnt);
    // It had grown into the cgroup, and the 600 MiB did not fit beside it.
    assert!(at("before", "used") > 500 * MIB, "{phases:?}");
    assert!(at("before", "used") + ALLOC > GIB - 64 * MIB, "{phases:?}");
    // It shrank: files were dropped and their memory given back, which the cgroup's usage
    // shows: beside the job's 600 MiB, what is in use is the cache and at most 160 MiB more
    // (the staging area, the daemon, Python).
    assert!(
        at("during", "capacity") + 300 * MIB < at("before", "capacity"),
        "{phases:?}"
    );
    assert!(
        num(&s, "cache_budget_shrinks") >= 1 && num(&s, "cache_dropped_files") > 0,
        "{s}"
    );
    assert!(num(&s, "cache_freed_bytes") >= 300 * MIB, "{s}");
    let beside = at("during", "in_use") - ALLOC;
    assert!(beside <= at("during", "used") + 160 * MIB, "{phases:?}");
    // The staging area followed the cache down (to an eighth of it, under 64 MiB while the
    // cache is under 512 MiB), and back up.
    assert_eq!(at("before", "staging"), 64 * MIB);
    assert!(at("during", "capacity") < 512 * MIB, "{phases:?}");
    let during = at("during", "staging");
    assert!((8 * MIB..64 * MIB).contains(&during), "{phases:?}");
    // Freed, the memory went back to the cache.
    assert!(
        at("after", "capacity") > at("during", "capacity") + 300 * MIB,
        "{phases:?}\ndaemon log:\n{text}"
    );
    assert!(num(&s, "cache_budget_grows") >= 1, "{s}");
    if at("after", "capacity") >= 512 * MIB {
        assert_eq!(at("after", "staging"), 64 * MIB, "{phases:?}");
    }
    assert!(text.contains("cache budget shrank"), "{text}");
    assert!(
        s["cache_budget_why"]
            .as_str()
            .unwrap()
            .contains("memory cgroup"),
        "{s}"
    );
    let out = coorfs([OsStr::new("umount"), mnt.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn small_pods_mount_and_read_with_a_small_cache() {
    let dir = open_tempdir();
    let src = dir_755(dir.path(), "src");
    let rels = make_dataset(&src, 300, 100_000, 3);
    for (limit, staging) in [(128 * MIB, 8 * MIB), (192 * MIB, 12 * MIB)] {
        let Some(cg) = cgroup(&format!("pod{}", limit / MIB), limit) else {
            return;
        };
        let mnt = dir_755(dir.path(), &format!("mnt{}", limit / MIB));
        let _unmount = Unmount(mnt.clone());
        let out = cg.coorfs(&[OsStr::new("mount"), src.as_os_str(), mnt.as_os_str()]);
        assert!(out.status.success(), "{limit}: {}", stderr(&out));
        // Two epochs, read by a process in the pod; bytes equal to the source.
        let read = output_within(
            cg.command("sh").args([
                OsStr::new("-c"),
                OsStr::new("for e in 1 2; do cat \"$0\"/c*/*.bin | md5sum; cat \"$1\"/c*/*.bin | md5sum; done"),
                src.as_os_str(),
                mnt.as_os_str(),
            ]),
            COMMAND_LIMIT,
        );
        assert!(read.status.success(), "{}", stderr(&read));
        let sums: Vec<String> = String::from_utf8_lossy(&read.stdout)
            .lines()
            .map(String::from)
            .collect();
        assert_eq!(sums.len(), 4);
        assert!(sums.iter().all(|s| *s == sums[0]), "{sums:?}");
        let s = stats(&mnt);
        let cache = num(&s, "cache_capacity");
        assert_eq!(num(&s, "prefetch_memory"), staging);
        assert!(cache > 8 * MIB && cache < limit, "{limit}: {s}");
        assert!(num(&s, "cache_used") <= cache, "{s}");
        assert_eq!(num(&s, "reads"), 2 * rels.len() as u64);
        assert!(num(&s, "hits") > 0, "a small cache still hits: {s}");
        assert_eq!(cg.oom_kills(), 0);
        // A fixed budget the pod cannot hold is refused, naming what fits.
        let refused = dir_755(dir.path(), &format!("refused{}", limit / MIB));
        let out = cg.coorfs(&[
            OsStr::new("mount"),
            OsStr::new("--cache-size"),
            OsStr::new("1G"),
            src.as_os_str(),
            refused.as_os_str(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(" of cache fits beside that prefetch memory"),
            "{}",
            stderr(&out)
        );
        let out = coorfs([OsStr::new("umount"), mnt.as_os_str()]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

/// Shards bigger than the pod's cache, read by two readers in the pod under the default
/// budget. The readers stream them through the kernel's page cache, which keeps the pod at its
/// limit and makes the kernel report memory pressure: the budget leaves room for the kernel's
/// readahead windows (taken back, they would be read again), and a shrink takes back a
/// shard's newest blocks, not every block the cache held of it. So epoch 1 reads the dataset
/// once, and epoch 2 reads from the source what the cache lacked after epoch 1, no more.
#[test]
fn big_shards_in_a_pod_are_read_once_and_later_epochs_read_only_what_the_cache_lacks() {
    let Some(cg) = cgroup("shards", 320 * MIB) else {
        return;
    };
    let dir = open_tempdir();
    let src = dir_755(dir.path(), "src");
    let sizes = [384 << 20, 384 << 20, 24 << 20];
    for (i, size) in sizes.iter().enumerate() {
        std::fs::write(src.join(format!("shard-{i}.tar")), bytes(i as u64, *size)).unwrap();
    }
    evict_pages(&src);
    let dataset: u64 = sizes.iter().map(|s| *s as u64).sum();
    let mnt = dir_755(dir.path(), "mnt");
    let _unmount = Unmount(mnt.clone());
    let log = dir.path().join("coorfs.log");
    let out = cg.coorfs(&[
        OsStr::new("mount"),
        OsStr::new("--log-file"),
        log.as_os_str(),
        src.as_os_str(),
        mnt.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    two_epochs_in(&cg, &mnt, dataset).assert_within(dataset, 101, 105);
    assert_eq!(cg.oom_kills(), 0);
    // Every byte as the source's.
    for (i, size) in sizes.iter().enumerate() {
        let got = std::fs::read(mnt.join(format!("shard-{i}.tar"))).unwrap();
        assert!(got == bytes(i as u64, *size), "shard {i} differs");
    }
    // Nothing went wrong, and the daemon said nothing did (a small pod's reserve once made
    // the node table's check say the daemon might be killed, at every mount).
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("ERROR") && !text.contains("WARN"), "{text}");
}
