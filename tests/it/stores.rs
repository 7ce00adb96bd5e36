//! gs:// and az:// beside s3://: the same cases against each cloud's emulator, started here
//! (fake-gcs-server, Azurite, moto: tests/it/common/stores.rs), each mounted with the
//! environment its cloud's own tools read. Bytes equal to the store's (small files, a 64 MiB
//! object, odd keys, folder markers), an object changed while read is never two versions,
//! faults retried and counted, lazy listing (the mount returns once the first level is
//! listed, each folder is listed once; a listing gives the kernel attributes for its first
//! request only), a manifest that lists nothing, the disk tier, the keeper, and bad input as
//! one line.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::proxy::{Fault, FaultProxy};
use crate::common::stores::{Kind, StoreBucket, StoreServer};
use crate::common::{Mount, bytes, files_under, num, requests, stats};

/// Mounts `url` of `server`, reached at `endpoint` (the server's own, or a proxy's).
fn mount_at(server: &StoreServer, endpoint: &str, url: &str, extra: &[&str]) -> Mount {
    let env = server.env_at(endpoint);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Mount::with_env(Path::new(url), extra, &env)
}

fn mount(server: &StoreServer, url: &str, extra: &[&str]) -> Mount {
    mount_at(server, &server.endpoint(), url, extra)
}

/// `n` objects of mixed sizes (empty, tiny, a block and a bit, several blocks) in three
/// folders beneath `prefix`: their paths beneath it and their bytes.
fn put_dataset(bucket: &StoreBucket, prefix: &str, n: usize) -> Vec<(String, Vec<u8>)> {
    let sizes = [0, 1, 4095, 70_000, (1 << 20) + 3, 3 << 20];
    (0..n)
        .map(|i| {
            let rel = format!("c{}/img{i:03}.jpg", i % 3);
            let data = bytes(i as u64, sizes[i % sizes.len()]);
            bucket.put(&format!("{prefix}/{rel}"), &data);
            (rel, data)
        })
        .collect()
}

/// Runs `coorfs ARGS` with `server`'s environment.
fn coorfs_with(server: &StoreServer, args: &[&OsStr]) -> std::process::Output {
    let mut cmd = Command::new(crate::common::bin());
    cmd.args(args)
        .envs(server.env().iter().map(|(k, v)| (*k, v.as_str())));
    crate::common::output_within(&mut cmd, Duration::from_secs(120))
}

fn bytes_equal_the_store_and_a_second_epoch_hits(kind: Kind) {
    let server = StoreServer::start(kind);
    let bucket = server.create_bucket("datasets");
    let mut want = put_dataset(&bucket, "train", 12);
    let big = bytes(99, 64 << 20);
    bucket.put("train/big/shard-0.tar", &big);
    want.push(("big/shard-0.tar".into(), big));
    // Beside the prefix: not in the mount.
    bucket.put("trainee/x", b"no");
    bucket.put("val/c0/y.jpg", b"no");
    let url = server.url("datasets", "train");
    let m = mount(&server, &url, &["--no-prefetch"]);
    let mut names: Vec<PathBuf> = want.iter().map(|(k, _)| PathBuf::from(k)).collect();
    names.sort();
    assert_eq!(files_under(&m.mnt), names);
    for epoch in 0..2 {
        for (rel, data) in &want {
            let got = std::fs::read(m.path(rel)).unwrap();
            assert!(got == *data, "{rel}, epoch {epoch}: the bytes differ");
        }
    }
    let md = std::fs::metadata(m.path("c1/img001.jpg")).unwrap();
    assert_eq!(md.len(), 1);
    let s = stats(&m.mnt);
    assert_eq!(s["source"], url.as_str());
    assert_eq!(num(&s, "dataset_files"), want.len() as u64);
    let empty = want.iter().filter(|(_, d)| d.is_empty()).count() as u64;
    assert_eq!(num(&s, "misses"), want.len() as u64 - empty, "{s}");
    assert_eq!(num(&s, "hits"), want.len() as u64 + empty, "{s}");
    let total: u64 = want.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(num(&s, "bytes_from_source"), total, "{s}");
    // A listing a folder (four), and a GET an object or more, up to one per 8 MiB part: nothing
    // was read twice. (Where one stream of the store is fast, as here, a GET spans several
    // parts of the 64 MiB shard.)
    let parts: u64 = (want.iter())
        .map(|(_, d)| (d.len() as u64).div_ceil(8 << 20))
        .sum();
    let objects = want.iter().filter(|(_, d)| !d.is_empty()).count() as u64;
    assert!(num(&s, "source_requests") >= objects + 4, "{s}");
    assert!(num(&s, "source_requests") <= parts + 8, "{s}");
    assert_eq!(num(&s, "source_retried"), 0, "{s}");
    assert_eq!(num(&s, "source_errors"), 0, "{s}");
    m.unmount();
}

fn odd_keys_and_folder_markers_read_as_stored(kind: Kind) {
    let server = StoreServer::start(kind);
    let bucket = server.create_bucket("odd-keys");
    let mut names = vec![
        "q?x.bin",
        "h#x.bin",
        "p%41x.bin",
        "s p a c e.bin",
        "plus+amp&eq=.bin",
        "\u{e9}t\u{e9}.bin",
        "\u{65e5}\u{672c}\u{8a9e}.bin",
        "d?i#r%/in \u{fc}ber.bin",
    ];
    // Azure turns a `\` of a blob's name into `/`.
    if kind != Kind::Azure {
        names.push("b\\x.bin");
    }
    let mut want: Vec<(String, Vec<u8>)> = (names.iter().enumerate())
        .map(|(i, n)| (n.to_string(), bytes(60 + i as u64, 1000 + i * 70_001)))
        .collect();
    for (name, data) in &want {
        bucket.put(&format!("ds/{name}"), data);
    }
    // A console's folder marker beside an object of its name: the object is the file. One
    // with something beneath it: the directory. One alone: an empty directory.
    let a = bytes(70, 300_000);
    bucket.put("ds/a.bin", &a);
    bucket.put("ds/a.bin/", b"");
    bucket.put("ds/c/", b"");
    bucket.put("ds/c/inside", b"inside");
    bucket.put("ds/lone/", b"");
    want.push(("a.bin".into(), a));
    want.push(("c/inside".into(), b"inside".to_vec()));
    let m = mount(
        &server,
        &server.url("odd-keys", "ds"),
        &["--no-prefetch", "--metadata-ttl", "1s"],
    );
    let mut expected: Vec<PathBuf> = want.iter().map(|(n, _)| PathBuf::from(n)).collect();
    expected.sort();
    for when in ["at mount", "after the TTL"] {
        assert_eq!(files_under(&m.mnt), expected, "{when}");
        for (name, data) in &want {
            let got = std::fs::read(m.path(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(got == *data, "{name}, {when}: the bytes differ");
        }
        assert!(m.path("lone").is_dir(), "{when}");
        assert_eq!(std::fs::read_dir(m.path("lone")).unwrap().count(), 0);
        std::thread::sleep(Duration::from_millis(1200));
    }
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "source_errors"), 0, "{s}");
    m.unmount();
}

fn a_changed_object_is_never_mixed_and_is_seen_after_the_ttl(kind: Kind) {
    let server = StoreServer::start(kind);
    let bucket = server.create_bucket("changing");
    // 3 MiB read block by block (`--part-size 1M`), as in tests/it/s3.rs.
    let old = bytes(1, 3 << 20);
    bucket.put("d/big", &old);
    bucket.put("d/small", b"version 1");
    let m = mount(
        &server,
        &server.url("changing", "d"),
        &["--no-prefetch", "--metadata-ttl", "2s", "--part-size", "1M"],
    );
    assert_eq!(std::fs::read(m.path("small")).unwrap(), b"version 1");
    let mut f = std::fs::File::open(m.path("big")).unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact(&mut head).unwrap();
    assert_eq!(head, old[..4096]);
    let new = bytes(2, 3 << 20);
    bucket.put("d/big", &new);
    bucket.put("d/small", b"version 2");
    // A block of the old version never read cannot be served: the reader learns of the
    // change (the store refused If-Match, or answered with another ETag).
    let mut tail = vec![0u8; 4096];
    let e = std::os::unix::fs::FileExt::read_exact_at(&f, &mut tail, 2 << 20).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    drop(f);
    assert_eq!(std::fs::read(m.path("small")).unwrap(), b"version 1");
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(std::fs::read(m.path("small")).unwrap(), b"version 2");
    assert!(
        std::fs::read(m.path("big")).unwrap() == new,
        "the new version, whole"
    );
    m.unmount();
}

fn faults_are_retried_and_counted_and_a_403_reaches_the_reader(kind: Kind) {
    let server = StoreServer::start(kind);
    let bucket = server.create_bucket("faulty");
    // Names the request lines hold as they are (GCS's client encodes a `.` and a `/`).
    bucket.put("d/alpha", &bytes(5, 100_000));
    bucket.put("d/beta", &bytes(6, 100_000));
    let proxy = FaultProxy::start(server.port);
    let m = mount_at(
        &server,
        &proxy.endpoint(),
        &server.url("faulty", "d"),
        &["--no-prefetch"],
    );
    // Two 503s on alpha's GET: retried, read whole.
    proxy.inject("alpha", Fault::Status(503, "SlowDown"), 2);
    assert!(std::fs::read(m.path("alpha")).unwrap() == bytes(5, 100_000));
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "source_throttled"), 2, "{s} {:?}", proxy.served(""));
    assert_eq!(num(&s, "source_retried"), 2, "{s}");
    // A 403 is not retried: EACCES at once.
    proxy.inject("beta", Fault::Status(403, "AccessDenied"), u32::MAX);
    let started = Instant::now();
    let e = std::fs::read(m.path("beta")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(num(&stats(&m.mnt), "source_errors"), 1);
    m.unmount();
}

fn the_mount_returns_once_the_first_level_is_listed_and_each_folder_is_listed_once(kind: Kind) {
    let server = StoreServer::start(kind);
    let bucket = server.create_bucket("lazy");
    let folders = 24;
    for f in 0..folders {
        for i in 0..2 {
            bucket.put(&format!("ds/f{f:02}/x{i}"), &bytes(f * 2 + i, 100));
        }
    }
    // A store 300 ms away: listing all of it takes two rounds of 16 folders after the first
    // level.
    let proxy = FaultProxy::delayed(server.port, Duration::from_millis(300));
    let url = server.url("lazy", "ds");
    let m = mount_at(&server, &proxy.endpoint(), &url, &["--no-prefetch"]);
    let listings = |folder: &str| {
        let (encoded, plain) = (format!("ds%2F{folder}%2F"), format!("ds/{folder}/"));
        (proxy.served("prefix="))
            .iter()
            .filter(|s| s.line.contains(&encoded) || s.line.contains(&plain))
            .count()
    };
    // When `coorfs mount` returned, the store had answered the first level's listing only.
    let answered = proxy.served("");
    assert!(
        answered
            .iter()
            .all(|s| !s.line.contains("%2Ff") && !s.line.contains("ds/f")),
        "{answered:?}"
    );
    // The first `ls` of a folder lists it (or waits for the scan's listing of it).
    let names: Vec<_> = std::fs::read_dir(m.path("f17"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2);
    crate::common::wait_for_scan(&m.mnt);
    assert_eq!(num(&stats(&m.mnt), "dataset_files"), folders * 2);
    // Every folder listed once, however many asked for it at once.
    for f in 0..folders {
        assert_eq!(listings(&format!("f{f:02}")), 1, "f{f:02}");
    }
    m.unmount();
}

fn a_manifest_mounts_with_no_listing(kind: Kind) {
    let server = StoreServer::start(kind);
    let bucket = server.create_bucket("manifest");
    let want = put_dataset(&bucket, "train", 9);
    let url = server.url("manifest", "train");
    let out = coorfs_with(&server, &[OsStr::new("manifest"), OsStr::new(&url)]);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    assert_eq!(crate::common::stderr(&out), format!("{url}: 9 objects"));
    let dir = crate::common::open_tempdir();
    let file = dir.path().join("train.manifest");
    std::fs::write(&file, &out.stdout).unwrap();
    let m = mount(
        &server,
        &url,
        &["--no-prefetch", "--manifest", file.to_str().unwrap()],
    );
    let mut names: Vec<PathBuf> = want.iter().map(|(k, _)| PathBuf::from(k)).collect();
    names.sort();
    assert_eq!(files_under(&m.mnt), names);
    for (rel, data) in &want {
        assert!(std::fs::read(m.path(rel)).unwrap() == *data, "{rel}");
    }
    // Nothing listed: one GET for each object with bytes, no more.
    let with_bytes = want.iter().filter(|(_, d)| !d.is_empty()).count() as u64;
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "source_requests"), with_bytes, "{s}");
    m.unmount();
    // A manifest line that is no line of a manifest: the mount is refused, saying where.
    std::fs::write(&file, "train/a\t12\n").unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let manifest = format!("--manifest={}", file.display());
    let out = coorfs_with(
        &server,
        &[
            OsStr::new("mount"),
            OsStr::new(&manifest),
            OsStr::new(&url),
            mnt.as_os_str(),
        ],
    );
    crate::common::fails_with_line(
        &out,
        1,
        &format!(
            "coorfs: mounting {}: source {url}: manifest {} line 1: 2 fields: KEY<TAB>SIZE<TAB>ETAG[<TAB>LAST_MODIFIED] expected",
            mnt.display(),
            file.display()
        ),
        "a bad manifest",
    );
}

fn the_disk_tier_serves_a_restarted_mount_without_the_store(kind: Kind) {
    let server = StoreServer::start(kind);
    let bucket = server.create_bucket("restart");
    let want = put_dataset(&bucket, "d", 6);
    let cache = crate::common::open_tempdir();
    let url = server.url("restart", "d");
    let args = [
        "--no-prefetch",
        "--cache-size",
        "0",
        "--cache-dir",
        cache.path().to_str().unwrap(),
    ];
    let total: u64 = want.iter().map(|(_, d)| d.len() as u64).sum();
    for round in 0..2 {
        let m = mount(&server, &url, &args);
        for (rel, data) in &want {
            assert!(
                std::fs::read(m.path(rel)).unwrap() == *data,
                "{rel}, mount {round}"
            );
        }
        let s = stats(&m.mnt);
        let (from_source, from_disk) = (num(&s, "bytes_from_source"), num(&s, "bytes_from_disk"));
        match round {
            0 => assert_eq!(from_source, total, "{s}"),
            _ => assert_eq!((from_source, from_disk), (0, total), "{s}"),
        }
        m.unmount();
    }
}

fn a_daemon_killed_mid_epoch_is_replaced_and_every_read_gets_the_stores_bytes(kind: Kind) {
    let server = StoreServer::start(kind);
    let bucket = server.create_bucket("kept");
    let mut want = put_dataset(&bucket, "d", 12);
    // Two levels down: the successor has listed only the first level when the kernel asks
    // for this path's node.
    let deep = bytes(77, 5000);
    bucket.put("d/deep/er/x.bin", &deep);
    want.insert(0, ("deep/er/x.bin".into(), deep));
    let m = mount(&server, &server.url("kept", "d"), &["--no-prefetch"]);
    // Half read, a file held open, then the daemon is killed: its successor takes over the
    // nodes and the open file, lists the store again as it is looked up, and serves the rest.
    for (rel, data) in &want[..6] {
        assert!(std::fs::read(m.path(rel)).unwrap() == *data, "{rel}");
    }
    let held = &want[4];
    let open = std::fs::File::open(m.path(&held.0)).unwrap();
    let old = m.pid();
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(old as i32, libc::SIGKILL) }, 0);
    for (rel, data) in &want {
        assert!(
            std::fs::read(m.path(rel)).unwrap() == *data,
            "{rel}, after the kill"
        );
    }
    let mut again = Vec::new();
    std::io::Read::read_to_end(&mut &open, &mut again).unwrap();
    assert!(again == held.1, "the file held open across the kill");
    drop(open);
    assert_ne!(m.pid(), old);
    assert_eq!(num(&stats(&m.mnt), "daemon_restarts"), 1);
    m.unmount();
}

/// Over an object store the kernel keeps its own choice of when a listing carries attributes:
/// a flat prefix listed by `ls` makes a kernel inode for the entries of the listing's first
/// request only, not one for each of its objects (where a directory source hands out every
/// entry's, so that a job that lists then opens sends no LOOKUP). Seen from the daemon: each
/// file looked at after the listing beyond that first request costs a LOOKUP.
#[test]
fn an_object_store_listing_gives_the_kernel_attributes_for_its_first_request_only() {
    const OBJECTS: usize = 800;
    let server = StoreServer::start(Kind::S3);
    let bucket = server.create_bucket("flat");
    let dir = tempfile::tempdir().unwrap();
    for i in 0..OBJECTS {
        std::fs::write(dir.path().join(format!("o{i:04}")), bytes(i as u64, 10)).unwrap();
    }
    bucket.put_dir("ds", dir.path());
    let m = mount(&server, &server.url("flat", "ds"), &["--no-prefetch"]);
    crate::common::wait_for_scan(&m.mnt);
    let names: Vec<_> = std::fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), OBJECTS);
    let before = requests(&m.mnt, "lookup");
    for name in &names {
        assert_eq!(std::fs::metadata(m.mnt.join(name)).unwrap().len(), 10);
    }
    // The first request of a listing holds a few hundred entries at most (the lister's
    // buffer, 32 KiB for glibc's readdir): most of the 800 are looked up.
    let looked_up = requests(&m.mnt, "lookup") - before;
    assert!(
        looked_up >= OBJECTS as u64 / 2,
        "{looked_up} LOOKUPs for {OBJECTS} objects listed"
    );
    m.unmount();
}

macro_rules! for_each_store {
    ($($case:ident),* $(,)?) => {
        mod gcs {
            $( #[test] fn $case() { super::$case(super::Kind::Gcs) } )*
        }
        mod azure {
            $( #[test] fn $case() { super::$case(super::Kind::Azure) } )*
        }
        mod s3 {
            $( #[test] fn $case() { super::$case(super::Kind::S3) } )*
        }
    };
}

for_each_store!(
    bytes_equal_the_store_and_a_second_epoch_hits,
    odd_keys_and_folder_markers_read_as_stored,
    a_changed_object_is_never_mixed_and_is_seen_after_the_ttl,
    faults_are_retried_and_counted_and_a_403_reaches_the_reader,
    the_mount_returns_once_the_first_level_is_listed_and_each_folder_is_listed_once,
    a_manifest_mounts_with_no_listing,
    the_disk_tier_serves_a_restarted_mount_without_the_store,
    a_daemon_killed_mid_epoch_is_replaced_and_every_read_gets_the_stores_bytes,
);

/// `coorfs mount URL MNT` with `env` (and nothing of the machine's own cloud setup).
fn mount_fails(
    url: &str,
    env: &[(&str, &str)],
) -> (std::process::Output, PathBuf, tempfile::TempDir) {
    let dir = crate::common::open_tempdir();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mut cmd = Command::new(crate::common::bin());
    cmd.args([OsStr::new("mount"), OsStr::new(url), mnt.as_os_str()]);
    for var in [
        "AZURE_STORAGE_ACCOUNT",
        "AZURE_STORAGE_KEY",
        "AZURE_STORAGE_CONNECTION_STRING",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "STORAGE_EMULATOR_HOST",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = crate::common::output_within(&mut cmd, Duration::from_secs(90));
    assert!(!crate::common::is_mounted(&mnt));
    (out, mnt, dir)
}

#[test]
fn bad_urls_and_missing_credentials_get_one_clear_line() {
    let (out, mnt, _d) = mount_fails("az://my_container/x", &[]);
    crate::common::fails_with_line(
        &out,
        2,
        "coorfs: source az://my_container/x: \"my_container\" is not a container name (3 to 63 of a-z, 0-9, '-')",
        "a bad container",
    );
    let (out, _, _d) = mount_fails("gs://Bad/x", &[]);
    crate::common::fails_with_line(
        &out,
        2,
        "coorfs: source gs://Bad/x: \"Bad\" is not a bucket name (3 to 63 of a-z, 0-9, '-', '_', '.')",
        "a bad bucket",
    );
    let (out, _, _d) = mount_fails("https://example.com/c/x", &[]);
    crate::common::fails_with_line(
        &out,
        2,
        "coorfs: source https://example.com/c/x: an https:// source is an Azure storage account's blob service: https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX",
        "an https URL of no Azure account",
    );
    let (out, mnt2, _d) = mount_fails("az://data/train", &[]);
    crate::common::fails_with_line(
        &out,
        1,
        &format!(
            "coorfs: mounting {}: source az://data/train: no Azure storage account: set AZURE_STORAGE_ACCOUNT (and AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, else a managed identity signs), or AZURE_STORAGE_CONNECTION_STRING, or mount https://ACCOUNT.blob.core.windows.net/data/...",
            mnt2.display()
        ),
        "no Azure account",
    );
    let _ = mnt;
    let (out, _, _d) = mount_fails(
        "az://data/train",
        &[("AZURE_STORAGE_CONNECTION_STRING", "AccountName")],
    );
    assert!(
        crate::common::stderr(&out)
            .ends_with("AZURE_STORAGE_CONNECTION_STRING: \"AccountName\" is no NAME=VALUE field"),
        "{}",
        crate::common::stderr(&out)
    );
    assert_ne!(out.status.code(), Some(0));
}
