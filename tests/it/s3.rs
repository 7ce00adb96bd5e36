//! s3:// sources against a real S3 server on this machine: moto in server mode (PyPI
//! `moto[server]`; scripts/test.sh installs it into target/moto). Objects are written with
//! the object_store crate, the mount reads them back; faults are injected by a small proxy in
//! front of the server that answers chosen requests itself (503 SlowDown, 500, 403) or resets
//! their connection.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::proxy::{Fault, FaultProxy, Served, most_at_once};
use crate::common::stores::{self, KEY_ID, Kind, SECRET, StoreServer};
use crate::common::{Mount, TestCgroup, bytes, files_under, free_ports, num, stats};
use object_store::ObjectStoreExt;

/// The S3 server of these tests: moto.
type S3Server = StoreServer;

/// The environment a mount of the S3 store at `endpoint` gets.
fn aws_env(endpoint: &str) -> Vec<(&'static str, String)> {
    stores::env_of(Kind::S3, endpoint)
}

/// Mounts `url` from the store at `endpoint`.
fn mount(endpoint: &str, url: &str, extra: &[&str]) -> Mount {
    mount_with_env(endpoint, url, extra, &[])
}

/// [`mount`], with `more` variables in the daemon's environment.
fn mount_with_env(endpoint: &str, url: &str, extra: &[&str], more: &[(&str, &str)]) -> Mount {
    let env = aws_env(endpoint);
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend_from_slice(more);
    Mount::with_env(Path::new(url), extra, &env)
}

/// A bucket of the test server, written with object_store.
struct Bucket {
    name: String,
    store: object_store::aws::AmazonS3,
    rt: tokio::runtime::Runtime,
}

impl Bucket {
    fn create(server: &S3Server, name: &str) -> Bucket {
        // moto creates a bucket on a PUT of the bucket's URL.
        let out = Command::new("python3")
            .args([
                "-c",
                "import sys, urllib.request as u; u.urlopen(u.Request(sys.argv[1], method='PUT'))",
                &format!("{}/{name}", server.endpoint()),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let store = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(server.endpoint())
            .with_allow_http(true)
            .with_bucket_name(name)
            .with_region("us-east-1")
            .with_access_key_id(KEY_ID)
            .with_secret_access_key(SECRET)
            .build()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Bucket {
            name: name.to_string(),
            store,
            rt,
        }
    }

    /// Puts `data` as object `key`, the key as written (`Path::from` would percent-encode
    /// `?`, `#`, `%`, `\` and non-ASCII characters into the key itself).
    fn put(&self, key: &str, data: &[u8]) {
        let path = object_store::path::Path::parse(key).unwrap();
        let payload = object_store::PutPayload::from(data.to_vec());
        self.rt.block_on(self.store.put(&path, payload)).unwrap();
    }

    /// Puts `data` as object `key` with a plain PUT of the store's URL (moto checks no
    /// signature): for keys object_store refuses to write, such as a folder marker (`a/`)
    /// or one with a control character.
    fn put_raw(&self, server: &S3Server, key: &str, data: &[u8]) {
        let script = "import sys, urllib.parse as p, urllib.request as u; \
            u.urlopen(u.Request(sys.argv[1] + '/' + p.quote(sys.argv[2], safe='/'), \
            data=sys.stdin.buffer.read(), method='PUT'))";
        let mut child = Command::new("python3")
            .args([
                "-c",
                script,
                &format!("{}/{}", server.endpoint(), self.name),
            ])
            .arg(key)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(data).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn delete(&self, key: &str) {
        let path = object_store::path::Path::parse(key).unwrap();
        self.rt.block_on(self.store.delete(&path)).unwrap();
    }
}

/// A dataset of `n` objects of mixed sizes (empty, tiny, one block and a bit, several
/// blocks) in three class directories beneath `prefix`; returns (key below prefix, bytes).
fn put_dataset(bucket: &Bucket, prefix: &str, n: usize) -> Vec<(String, Vec<u8>)> {
    let sizes = [0, 1, 4095, 70_000, (1 << 20) + 3, 3 << 20];
    let mut out = Vec::new();
    for i in 0..n {
        let rel = format!("c{}/img{i:03}.jpg", i % 3);
        let data = bytes(i as u64, sizes[i % sizes.len()]);
        bucket.put(&format!("{prefix}/{rel}"), &data);
        out.push((rel, data));
    }
    out
}

/// `n` objects of `size` bytes each under `prefix` in `dirs` directories, `c0/f000`...: their
/// paths beneath the prefix and their bytes.
fn put_files(
    bucket: &Bucket,
    prefix: &str,
    n: usize,
    size: usize,
    dirs: usize,
) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..n {
        let rel = format!("c{}/f{i:03}", i % dirs);
        let data = bytes(i as u64 + 7, size);
        bucket.put(&format!("{prefix}/{rel}"), &data);
        out.push((rel, data));
    }
    out
}

/// One epoch of `m`'s files, by `coorfs read --procs 2`.
fn read_epoch(m: &Mount) {
    let out = crate::common::coorfs([
        OsStr::new("read"),
        OsStr::new("--procs"),
        OsStr::new("2"),
        m.mnt.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
}

#[test]
fn at_debug_a_read_s_fetch_and_get_log_inside_its_request_s_span() {
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "spans");
    let data = bytes(3, 300_000);
    bucket.put("ds/x.bin", &data);
    let dir = crate::common::open_tempdir();
    let log = dir.path().join("coorfs.log");
    let log_arg = log.to_str().unwrap();
    let extra = [
        "--no-prefetch",
        "--log-level",
        "debug",
        "--log-file",
        log_arg,
    ];
    let m = mount(&server.endpoint(), "s3://spans/ds", &extra);
    assert!(std::fs::read(m.path("x.bin")).unwrap() == data);
    m.unmount();
    let text = std::fs::read_to_string(&log).unwrap();
    // The GET, in the fetch, in the READ that waited for it, with the bytes each moved; the
    // body read from the socket (an http:// endpoint).
    let nested = text.lines().find(|l| {
        l.contains(r#"op="read""#)
            && l.contains("}:fetch{file=x.bin block=0 why=Read}:get{key=ds/x.bin range=0..300000 bytes=300000 direct=true}")
            && l.contains("close time.busy=")
    });
    assert!(nested.is_some(), "{text}");
    let fetch = text.lines().find(|l| {
        l.contains(r#"op="read""#)
            && l.contains("}:fetch{file=x.bin block=0 why=Read tier=Source bytes=300000}:")
    });
    assert!(fetch.is_some(), "{text}");
}

#[test]
fn listing_and_bytes_equal_the_bucket_and_a_second_epoch_hits() {
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "datasets");
    let mut want = put_dataset(&bucket, "train", 24);
    bucket.put("train/README", b"read me\n");
    want.push(("README".into(), b"read me\n".to_vec()));
    // Beside the prefix: not in the mount.
    bucket.put("trainee/x", b"no");
    bucket.put("val/c0/y.jpg", b"no");
    let log = tempfile::NamedTempFile::new().unwrap();
    let log_path = log.path().to_str().unwrap();
    let m = mount(
        &server.endpoint(),
        "s3://datasets/train",
        &[
            "--no-prefetch",
            "--log-file",
            log_path,
            "--log-level",
            "debug",
        ],
    );

    let mut names: Vec<PathBuf> = want.iter().map(|(k, _)| PathBuf::from(k)).collect();
    names.sort();
    assert_eq!(files_under(&m.mnt), names);
    for epoch in 0..2 {
        for (rel, data) in &want {
            assert_eq!(
                &std::fs::read(m.path(rel)).unwrap(),
                data,
                "{rel}, epoch {epoch}"
            );
        }
    }
    let md = std::fs::metadata(m.path("c1/img001.jpg")).unwrap();
    assert_eq!(md.len(), 1);
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o7777,
        0o444
    );
    let s = stats(&m.mnt);
    assert_eq!(s["source"], "s3://datasets/train");
    assert_eq!(num(&s, "dataset_files"), want.len() as u64);
    // Every file with bytes was a miss once and then wholly cached; an empty file has every
    // one of its (no) bytes cached, a hit each time, as in a directory's mount.
    let empty = want.iter().filter(|(_, d)| d.is_empty()).count() as u64;
    assert_eq!(num(&s, "misses"), want.len() as u64 - empty, "{s}");
    assert_eq!(num(&s, "hits"), want.len() as u64 + empty, "{s}");
    let total: u64 = want.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(num(&s, "bytes_from_source"), total);
    // A listing or two, one GET per 8 MiB part read: nothing was read twice.
    let blocks: u64 = want
        .iter()
        .map(|(_, d)| (d.len() as u64).div_ceil(8 << 20))
        .sum();
    assert!(num(&s, "source_requests") >= blocks, "{s}");
    assert!(num(&s, "source_requests") <= blocks + 8, "{s}");
    assert_eq!(num(&s, "source_retried"), 0);
    // The listing's memory is counted beside the node table's: some 250 bytes an object.
    assert!(num(&s, "metadata_bytes") > 250 * want.len() as u64, "{s}");
    // Secrets are never shown, nor logged (every crate at debug).
    let all = s.to_string();
    assert!(!all.contains(SECRET) && !all.contains(KEY_ID), "{all}");
    m.unmount();
    let logged = std::fs::read_to_string(log.path()).unwrap();
    assert!(logged.contains("s3://datasets/train"), "{logged}");
    assert!(!logged.contains(SECRET), "the secret key is in the log");
}

#[test]
fn a_changed_object_is_never_mixed_and_is_seen_after_the_ttl() {
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "changing");
    // 3 MiB, read block by block (`--part-size 1M`): a part read at the head would hold
    // the whole object, and a file of 4 MiB or more is read through the kernel's page
    // cache, which turns a failed read into EIO.
    let old = bytes(1, 3 << 20);
    bucket.put("d/big", &old);
    bucket.put("d/small", b"version 1");
    let m = mount(
        &server.endpoint(),
        "s3://changing/d",
        &["--no-prefetch", "--metadata-ttl", "2s", "--part-size", "1M"],
    );
    assert_eq!(std::fs::read(m.path("small")).unwrap(), b"version 1");

    // An open file of the old version, partly read, then the object is replaced: the rest of
    // it is never the new version's bytes.
    let mut f = std::fs::File::open(m.path("big")).unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact(&mut head).unwrap();
    assert_eq!(head, old[..4096]);
    let new = bytes(2, 3 << 20);
    bucket.put("d/big", &new);
    bucket.put("d/small", b"version 2");
    let mut tail = vec![0u8; 4096];
    let at: usize = 2 << 20;
    // The old version's block there was never read, so it cannot be served: the reader
    // learns that the object changed.
    let e = std::os::unix::fs::FileExt::read_exact_at(&f, &mut tail, at as u64).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    drop(f);

    // Within the TTL a cached file is still the old version, whole; after it, the new one.
    assert_eq!(std::fs::read(m.path("small")).unwrap(), b"version 1");
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(std::fs::read(m.path("small")).unwrap(), b"version 2");
    assert_eq!(std::fs::read(m.path("big")).unwrap(), new);

    // New objects appear and deleted ones go once their directory's listing is older than
    // the TTL.
    bucket.put("d/added", b"new object");
    bucket.delete("d/small");
    std::thread::sleep(Duration::from_millis(2500));
    let mut names: Vec<String> = std::fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["added", "big"]);
    assert_eq!(std::fs::read(m.path("added")).unwrap(), b"new object");
    m.unmount();
}

#[test]
fn keys_with_characters_urls_escape_read_as_the_bytes_stored() {
    // `?`, `#`, `%`, `\`, spaces and non-ASCII characters in keys, of files and of a
    // directory: listed, read (each GET names the key once encoded: it asked for
    // `q%253Fx.bin`, encoded twice, and the reader got ENOENT), and listed again once the
    // listing is older than --metadata-ttl.
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "odd-keys");
    let names = [
        "q?x.bin",
        "h#x.bin",
        "p%41x.bin",
        "p%x.bin",
        "b\\x.bin",
        "s p a c e.bin",
        "plus+amp&eq=.bin",
        "\u{e9}t\u{e9}.bin",
        "\u{65e5}\u{672c}\u{8a9e}.bin",
        "d?i#r%/in \u{fc}ber.bin",
    ];
    let want: Vec<(&str, Vec<u8>)> = (names.iter().enumerate())
        .map(|(i, n)| (*n, bytes(60 + i as u64, 1000 + i * 70_001)))
        .collect();
    for (name, data) in &want {
        bucket.put(&format!("ds/{name}"), data);
    }
    let m = mount(
        &server.endpoint(),
        "s3://odd-keys/ds",
        &["--no-prefetch", "--metadata-ttl", "1s"],
    );
    let mut listed: Vec<PathBuf> = files_under(&m.mnt);
    let mut expected: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
    expected.sort();
    listed.sort();
    assert_eq!(listed, expected);
    for (name, data) in &want {
        let got = std::fs::read(m.path(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == *data, "{name}: the bytes differ");
    }
    // Past the TTL: the directories are listed again by their own prefixes, and each object
    // is asked for again (HEAD) at its open.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(files_under(&m.mnt), expected);
    for (name, data) in &want {
        let got = std::fs::read(m.path(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == *data, "{name}: the bytes differ after the TTL");
    }
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "source_errors"), 0, "{s}");
    m.unmount();
}

#[test]
fn an_object_beside_a_folder_marker_of_its_name_is_the_file_with_its_bytes() {
    // `a.bin` and the console's folder marker `a.bin/` (zero bytes) both list as `a.bin`:
    // the marker, listed second, made the file empty. The object is the file, and the log
    // says the marker was left out; with something beneath the marker the directory wins
    // (as for any key that is also a directory), and the log says that too. The same after
    // the TTL, when the directories are listed again.
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "markers");
    let a = bytes(70, 300_000);
    let b = bytes(71, 5000);
    let c = bytes(72, 40);
    bucket.put("ds/a.bin", &a);
    bucket.put_raw(&server, "ds/a.bin/", b"");
    bucket.put("ds/sub/b.bin", &b);
    bucket.put_raw(&server, "ds/sub/b.bin/", b"");
    bucket.put("ds/c", b"shadowed");
    bucket.put_raw(&server, "ds/c/", b"");
    bucket.put("ds/c/inside", &c);
    let log = tempfile::NamedTempFile::new().unwrap();
    let m = mount(
        &server.endpoint(),
        "s3://markers/ds",
        &[
            "--no-prefetch",
            "--metadata-ttl",
            "1s",
            "--log-file",
            log.path().to_str().unwrap(),
        ],
    );
    let check = |when: &str| {
        assert_eq!(
            files_under(&m.mnt),
            ["a.bin", "c/inside", "sub/b.bin"].map(PathBuf::from),
            "{when}"
        );
        assert!(std::fs::read(m.path("a.bin")).unwrap() == a, "{when}");
        assert!(std::fs::read(m.path("sub/b.bin")).unwrap() == b, "{when}");
        assert!(std::fs::read(m.path("c/inside")).unwrap() == c, "{when}");
        assert_eq!(
            std::fs::metadata(m.path("a.bin")).unwrap().len(),
            a.len() as u64
        );
    };
    check("at mount");
    std::thread::sleep(Duration::from_millis(1200));
    check("after the TTL");
    m.unmount();
    let logged = std::fs::read_to_string(log.path()).unwrap();
    let warned = |what: &str| {
        logged
            .lines()
            .any(|l| l.contains("WARN") && l.contains(what))
    };
    for marker in ["a.bin", "sub/b.bin"] {
        assert!(
            warned(&format!(
                "left out the folder marker {marker}/ (an empty key ending in '/') beside the object {marker}, which is the file"
            )),
            "{logged}"
        );
    }
    assert!(
        warned("left out the object c whose name is also a directory's (the directory wins)"),
        "{logged}"
    );
}

#[test]
fn a_big_object_read_in_sequence_is_fetched_in_parts_several_at_once() {
    // A shard read as a tar reader reads it (16 KiB at a time, in order) from a store 30 ms
    // away whose streams bring 20 MB/s each (a product under 1 MB, under a part): one ranged
    // GET per 8 MiB part, several in flight while the reader reads on. Block by block, one at
    // a time, it was 48 GETs in a row. (At 40 MB/s, with two busy CPUs beside the test, the
    // emulator behind the proxy took 80 ms more to answer a part, a product of 4.4 MB: GETs
    // of two parts, as they should be for such a store.)
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "shards");
    let shard = bytes(40, 48 << 20);
    bucket.put("wds/shard-000.tar", &shard);
    let proxy = FaultProxy::paced(server.port, Duration::from_millis(30), 20_000_000);
    let m = mount(&proxy.endpoint(), "s3://shards/wds", &["--no-prefetch"]);
    let gets = read_in_sequence(&m, &proxy, "shard-000.tar", &shard);
    // A GET that timed out under load is sent again (and counted as retried).
    let s = stats(&m.mnt);
    let retried = num(&s, "source_retried") as usize;
    // One GET per 8 MiB part, but for a part split when the readers' part slots were all
    // taken (the next part read ahead holds one): a block then is read alone, and the rest
    // of its part in a second GET. Every byte is read once either way (below).
    assert!(
        (6 + retried..=8 + retried).contains(&gets.len()),
        "one GET per 8 MiB part: {gets:#?} {s}"
    );
    // The part read and the two after it, read ahead.
    assert!(
        most_at_once(&gets) >= 3,
        "fewer than 3 parts at once: {gets:#?}"
    );
    assert_eq!(num(&s, "bytes_from_source"), shard.len() as u64, "{s}");
    assert!(num(&s, "source_requests_per_gib") <= 256, "{s}");
    // The stream's product as the GETs measured it: under half a part, so a GET a part.
    let bdp = num(&s, "source_stream_bdp_bytes");
    assert!(bdp > 0 && bdp < 4 << 20, "{bdp}: {s}");
    m.unmount();
}

#[test]
fn a_store_whose_one_stream_is_fast_is_read_in_runs_of_several_parts() {
    // 30 ms before each answer, then the body as fast as the host copies it (about 1 GB/s, a
    // product of 30 MB): after the first parts, a GET reads as many parts as the readahead
    // buffer holds (4, the cache having room to keep them), so a 96 MiB shard is read in
    // fewer GETs than its 12 parts, each byte once.
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "fast");
    let shard = bytes(41, 96 << 20);
    bucket.put("wds/shard-000.tar", &shard);
    let proxy = FaultProxy::delayed(server.port, Duration::from_millis(30));
    let m = mount(&proxy.endpoint(), "s3://fast/wds", &["--no-prefetch"]);
    let gets = read_in_sequence(&m, &proxy, "shard-000.tar", &shard);
    let s = stats(&m.mnt);
    let retried = num(&s, "source_retried") as usize;
    assert!(gets.len() <= 8 + retried, "12 parts in runs: {gets:#?} {s}");
    assert_eq!(num(&s, "bytes_from_source"), shard.len() as u64, "{s}");
    // The stream's product as the GETs measured it, over half a part: runs of 2 parts or more.
    let bdp = num(&s, "source_stream_bdp_bytes");
    assert!(bdp > 4 << 20, "{bdp}: {s}");
    m.unmount();
}

/// Reads `name` at `m` as a tar reader does (16 KiB at a time, in order), checks its bytes
/// against `want`, and returns the GETs `proxy` forwarded for it.
fn read_in_sequence(m: &Mount, proxy: &FaultProxy, name: &str, want: &[u8]) -> Vec<Served> {
    let mut f = std::fs::File::open(m.mnt.join(name)).unwrap();
    let mut got = Vec::with_capacity(want.len());
    let mut buf = vec![0; 16 << 10];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got == want, "the bytes differ");
    drop(f);
    proxy
        .served(name)
        .into_iter()
        .filter(|s| s.line.starts_with("GET "))
        .collect()
}

/// Reads `name` of `m` whole in reads of `read` bytes, checks its bytes against `want`, and
/// returns the pages of it the kernel's page cache held while it was still open.
fn read_in_pieces(m: &Mount, name: &str, read: usize, want: &[u8]) -> usize {
    let f = std::fs::File::open(m.mnt.join(name)).unwrap();
    let (mut got, mut buf) = (Vec::with_capacity(want.len()), vec![0; read]);
    loop {
        let n = (&f).read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got == want, "{name}: the bytes differ");
    // SAFETY: a private read-only mapping, only its residency is asked.
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    let mut pages = vec![0u8; map.len().div_ceil(4096)];
    // SAFETY: `map` is live for `map.len()` bytes; `pages` has a byte per page.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), pages.as_mut_ptr()) };
    assert_eq!(rc, 0);
    pages.iter().filter(|&&b| b & 1 == 1).count()
}

#[test]
fn a_job_that_reads_big_objects_in_large_pieces_gets_them_straight_into_its_buffer() {
    // A job's first big object goes through the page cache, and its first READ, the kernel's
    // first readahead window, says how the job reads: 1 MiB for a read of 1 MiB (a read of
    // more than 128 KiB). Its later ones are read with direct I/O: no page of the kernel's
    // is filled (none resident while the file is open), and the bytes are the store's. Reads
    // that turn small send the job's next object back through the page cache, where they
    // cost no round trip each. (The job is the test's process group: under --job-key auto the
    // other tests' processes beside this one could make each open a job of its own.) The
    // store answers after 30 ms, and a stream then brings more than a part (4 MiB) in that
    // wait, as the first object's runs measure it: the daemon's runs keep a reader with one
    // read in flight going (from a store whose streams are slow, the kernel's readahead has
    // more parts read at once).
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "big");
    let objects = put_files(&bucket, "ds", 5, 6 << 20, 1);
    let proxy = FaultProxy::delayed(server.port, Duration::from_millis(30));
    let m = mount(
        &proxy.endpoint(),
        "s3://big/ds",
        &[
            "--no-prefetch",
            "--cache-size",
            "1M",
            "--job-key",
            "pgid",
            "--part-size",
            "4M",
        ],
    );
    let whole = (6 << 20) / 4096;
    let read = |i: usize, size: usize| read_in_pieces(&m, &objects[i].0, size, &objects[i].1);
    let direct = || num(&stats(&m.mnt), "stream_direct_opens");
    assert!(read(0, 1 << 20) > whole / 2);
    assert_eq!(direct(), 0, "{}", stats(&m.mnt));
    assert_eq!(read(1, 1 << 20), 0);
    assert_eq!(direct(), 1, "{}", stats(&m.mnt));
    // Still direct: its 16 KiB reads are each a READ, and tell the mount.
    let reads = num(&stats(&m.mnt), "read_requests");
    assert_eq!(read(2, 16 << 10), 0);
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "stream_direct_opens"), 2, "{s}");
    assert!(num(&s, "read_requests") - reads >= 384, "{s}");
    // Back through the page cache: the kernel's readahead asks for about a MiB a READ.
    let reads = num(&s, "read_requests");
    assert!(read(3, 16 << 10) > whole / 2);
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "stream_direct_opens"), 2, "{s}");
    assert!(num(&s, "read_requests") - reads <= 12, "{s}");
    // Reading small, it stays there.
    assert!(read(4, 16 << 10) > whole / 2);
    assert_eq!(direct(), 2, "{}", stats(&m.mnt));
    assert_eq!(num(&stats(&m.mnt), "bytes_from_source"), 5 * (6 << 20));
    m.unmount();
}

#[test]
fn with_an_order_hint_the_gets_of_the_next_big_objects_are_sent_before_their_opens() {
    // Objects of 6 MiB in parts of 2 MiB, beside a staging area too small for the
    // prefetcher's parts (8 MiB, under 8 parts): the prefetcher leaves them to their reader,
    // which streams them in parts. With the job's order hint, the mount sends the first run's
    // GET of the next objects of the order before they are opened, and each open's first
    // READ takes its own: every GET sent ahead is read, and the bytes are the store's.
    const N: usize = 8;
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "ahead");
    let objects = put_files(&bucket, "ds", N, 6 << 20, 1);
    let proxy = FaultProxy::delayed(server.port, Duration::from_millis(20));
    let m = mount(
        &proxy.endpoint(),
        "s3://ahead/ds",
        &[
            "--part-size",
            "2M",
            "--prefetch-memory",
            "8M",
            "--cache-size",
            "1M",
            "--job-key",
            "pgid",
        ],
    );
    crate::common::wait_for_scan(&m.mnt);
    let read = |hint: &str, seed: &str| {
        let mut cmd = Command::new(crate::common::bin());
        cmd.args(["read", "--json", "--procs", "1", "--seed", seed, hint])
            .arg(&m.mnt);
        let out = crate::common::output_within(&mut cmd, Duration::from_secs(60));
        assert!(out.status.success(), "{}", crate::common::stderr(&out));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["bytes"], (N * (6 << 20)) as u64, "{r}");
    };
    // Without a hint, nothing is sent ahead: the next object is anyone's guess.
    read("--sorted", "1");
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "source_gets_ahead"), 0, "{s}");
    let gets = num(&s, "source_requests");
    // A new epoch, in an order the job hands over first: its first object's open may come
    // before the mount has sent anything, the next ones' after their GET was sent.
    read("--hint", "2");
    let s = stats(&m.mnt);
    let (ahead, unused) = (
        num(&s, "source_gets_ahead"),
        num(&s, "source_gets_ahead_unused"),
    );
    assert!(ahead >= N as u64 - 1, "{s}");
    assert_eq!(unused, 0, "{s}");
    // Each sent ahead stands for a GET its reader would have sent: no more requests.
    assert!(num(&s, "source_requests") - gets <= gets, "{s}");
    for (rel, data) in &objects {
        assert_eq!(&std::fs::read(m.mnt.join(rel)).unwrap(), data, "{rel}");
    }
    m.unmount();
}

/// Shards bigger than a pod, read from S3 by two processes in it, as the elastic cache takes
/// what the pod leaves: each part of epoch 1 is read once, and epoch 2 reads from the store
/// what the cache lacked after epoch 1, no more. A full readahead buffer once dropped the
/// blocks a reader was about to take, an open kept too few of the blocks its straddling READs
/// shared, and a part's run reached back over blocks read already: each read parts again.
#[test]
fn big_s3_shards_in_a_pod_are_read_once_and_later_epochs_read_only_what_the_cache_lacks() {
    // It measures what the readers' timing decides (a part read twice is 1.5% of the
    // dataset): another test's mounts beside it once made that 2.7%.
    let _alone = crate::common::alone();
    let cg = match TestCgroup::new("s3shards", 320 << 20) {
        Ok(cg) => cg,
        Err(why) => return println!("SKIP: {why}"),
    };
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "pod");
    let sizes = [256 << 20, 256 << 20, 16 << 20];
    for (i, size) in sizes.iter().enumerate() {
        bucket.put(&format!("ds/shard-{i}.tar"), &bytes(i as u64 + 7, *size));
    }
    let dataset: u64 = sizes.iter().map(|s| *s as u64).sum();
    let env = aws_env(&server.endpoint());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let dir = crate::common::open_tempdir();
    let log = dir.path().join("coorfs.log");
    let m = Mount::in_cgroup(
        &cg,
        Path::new("s3://pod/ds"),
        &["--log-file", log.to_str().unwrap()],
        &env,
    );
    // A part's blocks the kernel asks for again may be read again with a part: one part of
    // 8 MiB is 1.5% of the dataset. Under the full suite's load (other tests' CPUs, never their
    // mounts) one run in several read a part or two more: epoch 1 103.4% once, epoch 2 107.4%
    // of what the cache lacked once (2026-12-06; alone, 5 of 5 and 3 of 3 within 102 and 105).
    // The faults it was written for read up to 106.2% and 108.0%, and up to 109.5% and 103.1%
    // (docs/BENCHMARKS.md, "Shards"): each still past a bound here. Bytes the kernel asks for
    // again (`kernel_reasked_bytes`) are read again by right: in one run in four on
    // 2026-12-06 the kernel dropped pages it had read ahead 10-20 ms after they came, the
    // daemon's memory having grown by 40 MiB in epoch 2, and asked again for 20-67 MB
    // (109-177% of what the cache lacked without them, 100-103% with them).
    crate::common::two_epochs_in(&cg, &m.mnt, dataset).assert_within(dataset, 104, 108);
    assert_eq!(cg.oom_kills(), 0);
    for (i, size) in sizes.iter().enumerate() {
        let got = std::fs::read(m.mnt.join(format!("shard-{i}.tar"))).unwrap();
        assert!(got == bytes(i as u64 + 7, *size), "shard {i} differs");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("ERROR") && !text.contains("WARN"), "{text}");
    m.unmount();
}

#[test]
fn pages_the_kernel_drops_and_asks_for_again_are_counted() {
    // The kernel drops a file's pages for want of memory (here: POSIX_FADV_DONTNEED, which
    // drops what no one maps) and asks for them again within the same open: the bytes it asked
    // for beyond the file's size are counted when the open ends, and the bytes are the same.
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "reask");
    let object = bytes(13, 4 << 20);
    bucket.put("ds/shard.tar", &object);
    let m = mount(&server.endpoint(), "s3://reask/ds", &["--no-prefetch"]);
    let mut f = std::fs::File::open(m.mnt.join("shard.tar")).unwrap();
    let mut whole = Vec::new();
    f.read_to_end(&mut whole).unwrap();
    assert!(whole == object);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    // SAFETY: a plain advice on a descriptor this test owns.
    let advised = unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(advised, 0);
    let mut again = vec![0; 1 << 20];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut again, 0).unwrap();
    assert!(again[..] == object[..1 << 20]);
    drop(f);
    // The release reaches the daemon after the close returns.
    let reasked = || num(&stats(&m.mnt), "kernel_reasked_bytes");
    assert!(
        crate::common::wait_for(Duration::from_secs(10), || reasked() > 0),
        "no bytes asked again counted"
    );
    let n = reasked();
    assert!((1 << 20..=4 << 20).contains(&n), "{n}");
    m.unmount();
}

#[test]
fn a_reader_that_seeks_in_a_big_object_reads_the_blocks_it_asks_for_not_their_parts() {
    // Random 4 KiB reads of a 64 MiB object (an index's records, a Parquet footer) with no
    // cache to keep the rest: one GET of one block each. Each read as the start of a stream,
    // it was 8 MiB a read, and two parts more read ahead.
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "seek");
    let object = bytes(11, 64 << 20);
    bucket.put("big/index.bin", &object);
    let m = mount(
        &server.endpoint(),
        "s3://seek/big",
        &["--no-prefetch", "--policy", "none"],
    );
    let f = std::fs::File::open(m.mnt.join("index.bin")).unwrap();
    // Blocks far apart: none within a readahead window of the one read before.
    let blocks = [40u64, 5, 60, 22, 50, 2];
    for b in blocks {
        let at = (b << 20) + 12_288;
        let mut got = vec![0; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, at).unwrap();
        assert!(
            got[..] == object[at as usize..at as usize + 4096],
            "block {b}"
        );
    }
    drop(f);
    let s = stats(&m.mnt);
    assert_eq!(
        num(&s, "bytes_from_source"),
        blocks.len() as u64 * (1 << 20),
        "{s}"
    );
    // One GET a read, and the listing.
    assert_eq!(num(&s, "source_requests"), blocks.len() as u64 + 1, "{s}");
    m.unmount();
}

#[test]
fn throttling_server_errors_and_resets_are_retried_and_counted_and_403_404_reach_the_reader() {
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "faulty");
    let want = put_dataset(&bucket, "p", 6);
    bucket.put("p/secret.bin", b"forbidden");
    bucket.put("p/gone.bin", b"deleted after the listing");
    let proxy = FaultProxy::start(server.port);
    let log = tempfile::NamedTempFile::new().unwrap();
    let m = mount_with_env(
        &proxy.endpoint(),
        "s3://faulty/p",
        &[
            "--no-prefetch",
            "--cache-size",
            "0",
            "--policy",
            "none",
            "--log-file",
            log.path().to_str().unwrap(),
        ],
        &[("COORFS_S3_TIMEOUT", "1s")],
    );

    // 503 SlowDown three times, a reset twice, a 500 twice, a request that gets no answer
    // (past the 1 s timeout) twice: every read still gets its bytes.
    proxy.inject("GET /faulty/p/c0/", Fault::Status(503, "SlowDown"), 3);
    proxy.inject("GET /faulty/p/c1/", Fault::Reset, 2);
    proxy.inject("GET /faulty/p/c2/", Fault::Status(500, "InternalError"), 2);
    let started = std::time::Instant::now();
    proxy.inject(
        "GET /faulty/p/c0/img003",
        Fault::Stall(Duration::from_secs(20)),
        2,
    );
    for (rel, data) in &want {
        assert_eq!(&std::fs::read(m.path(rel)).unwrap(), data, "{rel}");
    }
    // Each stalled GET is given up after its 1 s timeout and sent again: waited out, the two
    // stalls alone would take 40 s. The retries' jittered backoff (200 ms growing 3x, up to
    // 8 s) took 6-13 s here, 18.6 s once with the suite's other tests running beside it.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "source_throttled"), 3, "{s}");
    assert_eq!(num(&s, "source_retried"), 3 + 2 + 2 + 2, "{s}");
    assert_eq!(num(&s, "source_errors"), 0, "{s}");

    // A 403 is EACCES, a deleted object ENOENT: at once, not after retries.
    proxy.inject(
        "GET /faulty/p/secret.bin",
        Fault::Status(403, "AccessDenied"),
        u32::MAX,
    );
    let started = std::time::Instant::now();
    let e = std::fs::read(m.path("secret.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    // The read's one log line says why, in the store's words.
    let logged = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        logged.lines().any(|l| l.contains("WARN")
            && l.contains("reading secret.bin block 0: source: GET:")
            && l.contains("AccessDenied")),
        "{logged}"
    );
    assert_eq!(
        logged.lines().filter(|l| l.contains("secret.bin")).count(),
        logged
            .lines()
            .filter(|l| l.contains("reading secret.bin"))
            .count(),
        "one line a failed read: {logged}"
    );
    bucket.delete("p/gone.bin");
    let e = std::fs::read(m.path("gone.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Nothing of a failed read was kept: with the fault gone the bytes are right.
    proxy.clear();
    assert_eq!(std::fs::read(m.path("secret.bin")).unwrap(), b"forbidden");
    // Two failed reads, each asked for twice by the kernel (its read-ahead, then the read).
    let s = stats(&m.mnt);
    assert!((2..=4).contains(&num(&s, "source_errors")), "{s}");
    m.unmount();
}

/// GETs over plain HTTP are read from the socket (presigned: the signature is in the URL);
/// one whose connection breaks mid-body keeps what it read, and the rest, and only the rest,
/// is asked again through object_store's client (signed in its headers). With
/// `COORFS_S3_DIRECT=0` every GET is object_store's.
#[test]
fn a_get_cut_mid_body_asks_for_the_rest_only_and_direct_gets_can_be_turned_off() {
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "cut");
    let data = bytes(7, 1_000_000);
    bucket.put("p/a.bin", &data);
    let proxy = FaultProxy::start(server.port);
    let m = mount(&proxy.endpoint(), "s3://cut/p", &["--no-prefetch"]);
    proxy.inject("GET /cut/p/a.bin", Fault::Cut(300_000), 1);
    assert!(
        std::fs::read(m.path("a.bin")).unwrap() == data,
        "the bytes differ"
    );
    let served = proxy.served("/cut/p/a.bin");
    // One GET through object_store's client: the rest of a direct one, from its 300,000th
    // byte to its end.
    let (direct, client): (Vec<_>, Vec<_>) =
        (served.iter()).partition(|s| s.line.contains("X-Amz-Signature="));
    assert_eq!(client.len(), 1, "{served:?}");
    let rest_of = |s: &&Served| {
        let (a, b) = s.range.strip_prefix("bytes=")?.split_once('-')?;
        Some(format!("bytes={}-{b}", a.parse::<u64>().ok()? + 300_000))
    };
    assert!(
        (direct.iter()).any(|s| rest_of(s).as_deref() == Some(client[0].range.as_str())),
        "{served:?}"
    );
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "source_retried"), 1, "{s}");
    assert_eq!(num(&s, "source_errors"), 0, "{s}");
    m.unmount();

    let proxy = FaultProxy::start(server.port);
    let m = mount_with_env(
        &proxy.endpoint(),
        "s3://cut/p",
        &["--no-prefetch"],
        &[("COORFS_S3_DIRECT", "0")],
    );
    assert!(
        std::fs::read(m.path("a.bin")).unwrap() == data,
        "the bytes differ"
    );
    let served = proxy.served("GET /cut/p/a.bin");
    assert!(!served.is_empty());
    assert!(
        served.iter().all(|s| !s.line.contains("X-Amz-Signature=")),
        "{served:?}"
    );
    m.unmount();
}

#[test]
fn a_read_outlasts_a_store_down_for_8_seconds_and_a_403_still_fails_at_once() {
    // Every connection reset for 8 s: the read's retries, backing off with jitter for up to
    // 45 s, reach the store once it is back (10 retries took 2.9 s, and the reader got EIO).
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "outage");
    let data = bytes(80, 200_000);
    bucket.put("p/a.bin", &data);
    bucket.put("p/denied.bin", b"no");
    let proxy = FaultProxy::start(server.port);
    let m = mount(&proxy.endpoint(), "s3://outage/p", &["--no-prefetch"]);
    let outage = Duration::from_secs(8);
    proxy.down_for(outage);
    let started = std::time::Instant::now();
    let got = std::fs::read(m.path("a.bin"));
    let took = started.elapsed();
    let got = got.unwrap_or_else(|e| panic!("the read failed after {took:?}: {e}"));
    assert!(got == data, "the bytes differ");
    assert!(took >= outage, "read in {took:?}, during the outage");
    // The last try before the store came back waited at most 8 s more.
    assert!(took < outage + Duration::from_secs(10), "{took:?}");
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "source_errors"), 0, "{s}");
    assert!(num(&s, "source_retried") >= 3, "{s}");
    // What retrying cannot change fails at once.
    proxy.inject(
        "GET /outage/p/denied.bin",
        Fault::Status(403, "AccessDenied"),
        u32::MAX,
    );
    let started = std::time::Instant::now();
    let e = std::fs::read(m.path("denied.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    m.unmount();
}

#[test]
fn the_disk_tier_serves_a_restarted_mount_without_reading_the_store_again() {
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "restart");
    let want = put_dataset(&bucket, "ds", 9);
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().to_str().unwrap();
    let opts = [
        "--no-prefetch",
        "--cache-dir",
        dir,
        "--disk-cache-size",
        "64M",
        "--cache-size",
        "8M",
    ];
    let m = mount(&server.endpoint(), "s3://restart/ds", &opts);
    for (rel, data) in &want {
        assert_eq!(&std::fs::read(m.path(rel)).unwrap(), data, "{rel}");
    }
    let total: u64 = want.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(num(&stats(&m.mnt), "bytes_from_source"), total);
    m.unmount();

    let m = mount(&server.endpoint(), "s3://restart/ds", &opts);
    for (rel, data) in &want {
        assert_eq!(&std::fs::read(m.path(rel)).unwrap(), data, "{rel}");
    }
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "bytes_from_source"), 0, "{s}");
    assert_eq!(num(&s, "bytes_from_disk"), total, "{s}");
    m.unmount();
}

#[test]
fn bad_urls_and_unreachable_or_unlistable_stores_get_one_clear_line() {
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "odd");
    bucket.put("x/fine", b"1");
    let env = aws_env(&server.endpoint());
    let mnt = tempfile::tempdir().unwrap();
    let run = |url: &str, env: &[(&str, String)]| {
        let mut cmd = Command::new(crate::common::bin());
        cmd.args([OsStr::new("mount"), OsStr::new(url), mnt.path().as_os_str()]);
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        crate::common::output_within(&mut cmd, Duration::from_secs(120))
    };
    let out = run("s3://Bad_Bucket/x", &env);
    crate::common::fails_with_line(
        &out,
        2,
        "coorfs: source s3://Bad_Bucket/x: \"Bad_Bucket\" is not a bucket name (3 to 63 of a-z, 0-9, '-', '.')",
        "a bad bucket name",
    );
    let out = run("s3://no-such-bucket/x", &env);
    crate::common::fails_with_line(
        &out,
        1,
        "404 Not Found: NoSuchBucket (The specified bucket does not exist)",
        "a missing bucket",
    );
    let err = crate::common::stderr(&out);
    assert!(err.contains("listing s3://no-such-bucket/x"), "{err}");
    assert!(!err.contains(SECRET), "{err}");
    let mut slow = env.clone();
    slow.push(("COORFS_S3_TIMEOUT", "soon".into()));
    let out = run("s3://odd/x", &slow);
    crate::common::fails_with_line(
        &out,
        1,
        "source s3://odd/x: COORFS_S3_TIMEOUT: \"soon\": expected a duration such as 500ms, 30s, 5m or 24h",
        "a bad request timeout",
    );
    let mut odd = env.clone();
    odd.push(("COORFS_S3_DIRECT", "yes".into()));
    let out = run("s3://odd/x", &odd);
    crate::common::fails_with_line(
        &out,
        1,
        "source s3://odd/x: COORFS_S3_DIRECT must be 0 or 1, not \"yes\"",
        "a bad switch of the direct GETs",
    );
    assert!(!crate::common::is_mounted(mnt.path()));
}

#[test]
fn a_key_with_a_control_character_is_refused_saying_so_and_an_empty_prefix_mounts_with_a_warning() {
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "names");
    bucket.put("fine/a.bin", b"1");
    bucket.put("tabbed/ok.bin", b"2");
    bucket.put_raw(&server, "tabbed/sub/a\tb.bin", b"3");
    bucket.put_raw(&server, "tabtop/top\tb.bin", b"3");
    bucket.put("other/x", b"4");
    let env = aws_env(&server.endpoint());
    let dir = crate::common::open_tempdir();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // A mount this test leaves, failing, goes with it.
    let _gone = crate::common::UnmountOnDrop(mnt.clone());
    let log = dir.path().join("log");
    let run = |url: &str| {
        let mut cmd = Command::new(crate::common::bin());
        cmd.args([OsStr::new("mount"), OsStr::new(url), mnt.as_os_str()]);
        cmd.args([OsStr::new("--log-file"), log.as_os_str()]);
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        crate::common::output_within(&mut cmd, Duration::from_secs(120))
    };
    // The store's client refuses a listing that holds a key with a control character. In
    // the first level, which the mount lists, the mount is refused, and the line names the
    // key and the character (it blamed an empty, '.' or '..' component).
    let out = run("s3://names/tabtop");
    crate::common::fails_with_line(
        &out,
        1,
        "listing s3://names/tabtop: the key \"tabtop/top\\tb.bin\" holds a control character (U+0009, a tab), which no path may hold: mount a prefix beside that key",
        "a key with a tab",
    );
    assert!(!crate::common::is_mounted(&mnt));
    // Deeper, in a folder listed when looked up: listing that folder fails with EIO, and the
    // log's line names the key; the rest of the mount reads.
    let out = run("s3://names/tabbed/sub");
    crate::common::fails_with_line(
        &out,
        1,
        "listing s3://names/tabbed/sub: the key \"tabbed/sub/a\\tb.bin\" holds a control character (U+0009, a tab), which no path may hold: mount a prefix beside that key",
        "a key with a tab, one level down",
    );
    let out = run("s3://names/tabbed");
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    assert_eq!(std::fs::read(mnt.join("ok.bin")).unwrap(), b"2");
    let e = std::fs::read_dir(mnt.join("sub")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let out = crate::common::coorfs([OsStr::new("umount"), mnt.as_os_str()]);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.lines().any(|l| l.contains("WARN") && l.contains(
            "listing s3://names/tabbed/sub: the key \"tabbed/sub/a\\tb.bin\" holds a control character (U+0009, a tab)"
        )),
        "{logged}"
    );

    // A prefix with no object beneath it (a typo, most often: keys are case-sensitive) is
    // mounted, empty, with one warning line.
    let out = run("s3://names/Fine");
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    assert_eq!(
        crate::common::stderr(&out),
        "coorfs: warning: source s3://names/Fine: no object has this prefix (keys are case-sensitive): mounted empty; objects put there show once --metadata-ttl (24h) has passed"
    );
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    let out = crate::common::coorfs([OsStr::new("umount"), mnt.as_os_str()]);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    // Not for a prefix that has objects.
    let out = run("s3://names/fine");
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    assert_eq!(crate::common::stderr(&out), "");
    let out = crate::common::coorfs([OsStr::new("umount"), mnt.as_os_str()]);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
}

#[test]
fn an_fstab_line_mounts_a_bucket_with_credentials_from_roots_profile_files() {
    let _helper = crate::common::MountHelper::install();
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "fstab");
    let want = put_dataset(&bucket, "ds", 6);
    // mount(8) hands its helper no environment but PATH: the keys, region and endpoint come
    // from root's ~/.aws, profile default (the endpoint's http:// says plain HTTP). The test
    // puts its own over /root in a mount namespace of its own, where it mounts, reads and
    // unmounts.
    let home = tempfile::tempdir().unwrap();
    let aws = home.path().join(".aws");
    std::fs::create_dir(&aws).unwrap();
    std::fs::write(
        aws.join("credentials"),
        format!("[default]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n"),
    )
    .unwrap();
    std::fs::write(
        aws.join("config"),
        format!(
            "[default]\nregion = us-east-1\nendpoint_url = {}\n",
            server.endpoint()
        ),
    )
    .unwrap();
    let dir = crate::common::open_tempdir();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let fstab = dir.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "s3://fstab/ds {} fuse.coorfs defaults,no_prefetch,_netdev 0 0\n",
            mnt.display()
        ),
    )
    .unwrap();
    let files: Vec<&str> = want.iter().map(|(rel, _)| rel.as_str()).collect();
    let script = r#"set -e
home=$1 fstab=$2 mnt=$3; shift 3
mount --bind "$home" /root
mount --fstab "$fstab" "$mnt"
grep -q "^s3://fstab/ds $mnt fuse.coorfs " /proc/mounts
for f in "$@"; do cat "$mnt/$f"; done
umount "$mnt"
"#;
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
    ])
    .arg(home.path())
    .arg(&fstab)
    .arg(&mnt)
    .args(&files)
    .env_clear()
    .env("PATH", std::env::var_os("PATH").unwrap());
    let out = crate::common::output_within(&mut cmd, Duration::from_secs(60));
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    let all: Vec<u8> = want.iter().flat_map(|(_, d)| d.iter().copied()).collect();
    assert!(
        out.stdout == all,
        "the bytes read through the fstab mount differ"
    );
}

#[test]
fn a_first_epoch_from_a_remote_store_is_prefetched_while_the_cache_has_room() {
    // 50 ms a request: the pacer sees remote storage, and what it guesses for the job's first
    // epoch lands in a cache with room, so it reads ahead from the job's 32nd file on instead
    // of from the middle of the epoch; nothing is read twice, nothing staged is wasted. (With
    // 20 ms, moto's own time a request, which grows with the requests in flight on a loaded
    // machine, can pass for storage that serves one read at a time.)
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "remote");
    put_files(&bucket, "ds", REMOTE_FILES, 8192, 4);
    let proxy = FaultProxy::delayed(server.port, Duration::from_millis(50));
    let m = mount(&proxy.endpoint(), "s3://remote/ds", &[]);
    let s = first_epoch_prefetched_from_its_32nd_file(&m);
    assert_eq!(num(&s, "cached_files"), REMOTE_FILES as u64, "{s}");
    m.unmount();
}

/// Objects of 8 KiB in the first-epoch tests.
const REMOTE_FILES: usize = 300;

/// Reads `m`'s first epoch (`REMOTE_FILES` objects of 8 KiB from a store at 50 ms a request)
/// and checks that it was prefetched from its 32nd file, nothing read twice or left unused;
/// returns the stats.
fn first_epoch_prefetched_from_its_32nd_file(m: &Mount) -> serde_json::Value {
    crate::common::wait_for_scan(&m.mnt);
    read_epoch(m);
    let s = stats(&m.mnt);
    let epoch = &s["jobs"][0]["epochs"][0];
    assert_eq!(num(epoch, "files"), REMOTE_FILES as u64, "{s}");
    // Without the rule at most the files left after half the epoch and 64 more (85) could be
    // prefetched; the readers (2 at 50 ms a file) leave the prefetcher (16 at a time) far more.
    assert!(num(epoch, "prefetched_files") > 85, "{s}");
    assert_eq!(num(&s, "prefetched_unused"), 0, "{s}");
    assert_eq!(
        num(&s, "bytes_from_source"),
        (REMOTE_FILES * 8192) as u64,
        "{s}"
    );
    s
}

#[test]
fn past_a_full_memory_cache_a_remote_first_epoch_is_prefetched_into_the_disk_tier() {
    // As above, with memory for a sixth of the files and a disk tier: once memory is full,
    // what the prefetcher fetches waits on the disk for its reader (not in the staging area),
    // and the first epoch is still prefetched from its 32nd file. The next epoch, by another
    // process, reads nothing from the store.
    const FILES: usize = REMOTE_FILES;
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "remote");
    let want = put_files(&bucket, "ds", FILES, 8192, 4);
    let proxy = FaultProxy::delayed(server.port, Duration::from_millis(50));
    let dir = crate::common::open_tempdir();
    let cache = dir.path().join("cache");
    let memory = (FILES / 6 * 8192).to_string();
    let args = [
        "--cache-size",
        &memory,
        "--cache-dir",
        cache.to_str().unwrap(),
        "--disk-cache-size",
        "64M",
    ];
    let m = mount(&proxy.endpoint(), "s3://remote/ds", &args);
    let s = first_epoch_prefetched_from_its_32nd_file(&m);
    assert!(num(&s, "cached_files") <= FILES as u64 / 6, "{s}");
    read_epoch(&m);
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "bytes_from_source"), (FILES * 8192) as u64, "{s}");
    assert!(num(&s, "disk_hits") > 0, "{s}");
    for (rel, data) in &want {
        assert_eq!(&std::fs::read(m.path(rel)).unwrap(), data, "{rel}");
    }
    m.unmount();
}

#[test]
fn coorfs_run_hands_a_jobs_order_to_an_s3_mount_every_epoch() {
    // A shuffling job (python/tests/run_job.py over the stand-in torch) under `coorfs run`,
    // with nothing cached: each epoch's order is a hint the mount accepts, every object is
    // read from the store once an epoch and nothing prefetched goes unread, and the job sees
    // what it sees over a local copy of the bucket without coorfs.
    const FILES: usize = 120;
    const EPOCHS: u64 = 2;
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/python/tests");
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "hinted");
    let want = put_files(&bucket, "ds", FILES, 4096, 4);
    let dir = crate::common::open_tempdir();
    let local = dir.path().join("local");
    for (rel, data) in &want {
        let path = local.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }
    let proxy = FaultProxy::delayed(server.port, Duration::from_millis(20));
    let m = mount(&proxy.endpoint(), "s3://hinted/ds", &["--cache-size", "1"]);
    crate::common::wait_for_scan(&m.mnt);
    let job = |run: bool, data: &Path| {
        let mut cmd = Command::new(if run { crate::common::bin() } else { "python3" });
        if run {
            cmd.args(["run", "--", "python3"]);
        }
        cmd.arg(format!("{python}/run_job.py"))
            .args(["--epochs", &EPOCHS.to_string(), "--seed", "11"])
            .args(["--sampler", "shuffle", "--workers", "2"])
            .arg(data)
            .env("PYTHONPATH", format!("{python}/faketorch"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("COORFS_MOUNT");
        let out = crate::common::output_within(&mut cmd, Duration::from_secs(120));
        assert!(out.status.success(), "{}", crate::common::stderr(&out));
        let said = crate::common::stderr(&out);
        (String::from_utf8(out.stdout).unwrap(), said)
    };
    let (plain, _) = job(false, &local);
    let (hooked, said) = job(true, &m.mnt);
    assert_eq!(said, "");
    assert_eq!(
        hooked, plain,
        "the job saw other samples or bytes through the mount"
    );
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "hints_accepted"), EPOCHS, "{s}");
    assert_eq!(num(&s, "hints_rejected"), 0, "{s}");
    assert_eq!(num(&s, "prefetched_unused"), 0, "{s}");
    assert_eq!(
        num(&s, "bytes_from_source"),
        EPOCHS * (FILES * 4096) as u64,
        "{s}"
    );
    assert!(num(&s, "staging_hits") > 0, "{s}");
    m.unmount();
}

#[test]
fn two_members_over_one_bucket_read_each_object_from_the_store_once() {
    // A cluster (--peers) over an s3:// source: each object is read from the store by the
    // member that owns it, and served to the other over the peer protocol.
    const FILES: usize = 40;
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "shared");
    let want = put_files(&bucket, "ds", FILES, 20_000, 2);
    let dir = crate::common::open_tempdir();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "a-cluster-secret-of-32-bytes....\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let peers: Vec<String> = free_ports(2)
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let list = peers.join(",");
    let members: Vec<Mount> = (0..2)
        .map(|rank| {
            let rank = rank.to_string();
            let args = [
                "--no-prefetch",
                "--peers",
                &list,
                "--node-rank",
                &rank,
                "--cluster-secret-file",
                secret.to_str().unwrap(),
            ];
            mount(&server.endpoint(), "s3://shared/ds", &args)
        })
        .collect();
    for m in &members {
        crate::common::wait_for_scan(&m.mnt);
        for (rel, data) in &want {
            assert_eq!(&std::fs::read(m.path(rel)).unwrap(), data, "{rel}");
        }
    }
    let s: Vec<_> = members.iter().map(|m| stats(&m.mnt)).collect();
    let from_store: u64 = s.iter().map(|s| num(s, "bytes_from_source")).sum();
    assert_eq!(from_store, (FILES * 20_000) as u64, "{s:?}");
    for s in &s {
        assert!(num(s, "peer_hits") > 0, "{s}");
        assert_eq!(num(s, "peer_errors"), 0, "{s}");
    }
    for m in members {
        m.unmount();
    }
}

#[test]
fn webdataset_and_tfrecord_readers_read_an_s3_mount_as_the_directory_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    crate::common::shard_readers(&["make".as_ref(), dir.path().as_os_str()]);
    let want =
        crate::common::shard_readers(&["read".as_ref(), dir.path().as_os_str(), "1".as_ref()]);
    let server = S3Server::start(Kind::S3);
    let bucket = Bucket::create(&server, "wds");
    let mut dataset = 0;
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let e = e.unwrap();
        let data = std::fs::read(e.path()).unwrap();
        dataset += data.len() as u64;
        bucket.put(&format!("train/{}", e.file_name().to_str().unwrap()), &data);
    }
    let m = mount(&server.endpoint(), "s3://wds/train", &["--no-prefetch"]);
    for epoch in 1..=2u64 {
        let got = crate::common::shard_readers(&[
            "read".as_ref(),
            m.mnt.as_os_str(),
            epoch.to_string().as_ref(),
        ]);
        assert_eq!(got, want, "epoch {epoch}");
    }
    let s = stats(&m.mnt);
    // Every object read from the store once, in 8 MiB parts (a listing or two besides).
    assert_eq!(num(&s, "bytes_from_source"), dataset, "{s}");
    assert!(num(&s, "source_requests") <= 9 + 2, "{s}");
    assert_eq!(num(&s["epochs"][1], "bytes_from_source"), 0, "{s}");
    // Each object of 5-6 MiB (less than a part) was one GET, however many of its READs the
    // kernel sent at once: the first fetch to begin takes the others' blocks into its run.
    // (Two GETs an object, when a READ of its second half began before the first's GET
    // claimed it, failed this test under load.) One object in 9 may still be read in two
    // GETs of disjoint halves: 2 runs in 12 alone, at ca7b216 and after, a race left open;
    // its bytes are read once all the same (asserted above). Two such objects are a fault.
    let gets = num(&s["epochs"][0], "source_reads");
    assert!((9..=10).contains(&gets), "{gets} GETs for 9 objects: {s}");
    assert_eq!(num(&s["epochs"][1], "source_reads"), 0, "{s}");
    m.unmount();
}
