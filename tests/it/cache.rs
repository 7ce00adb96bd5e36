//! The cache through a real mount: MinIO keeps the cached fraction as every later epoch's hit
//! rate, LRU does worse, the counters add up to what happened, and bytes are always right.
//! Prefetch is off here (it turns misses into hits; tests/it/prefetch.rs covers it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde_json::Value;

const FILES: usize = 2000;
const SIZE: usize = 20 * 1024;

/// Reads every file once, whole, in a random order fixed by `seed`, with two threads, and
/// checks every byte against what `make_dataset` wrote.
fn read_epoch(mnt: &Path, rels: &[PathBuf], size: usize, seed: u64) {
    let mut order: Vec<(usize, PathBuf)> = rels.iter().cloned().enumerate().collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    std::thread::scope(|s| {
        for part in order.chunks(order.len().div_ceil(2)) {
            s.spawn(move || {
                for (_, rel) in part {
                    let got = std::fs::read(mnt.join(rel)).unwrap();
                    let i: usize = rel.file_stem().unwrap().to_str().unwrap()[1..]
                        .parse()
                        .unwrap();
                    assert!(got == bytes(i as u64, size), "{} differs", rel.display());
                }
            });
        }
    });
}

/// Runs four epochs under `policy` (and `extra` options) with a cache of half the dataset;
/// returns the final stats.
fn four_epochs(policy: &str, extra: &[&str]) -> (Value, Vec<u64>) {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, FILES, SIZE, 20);
    // 20 KiB is a multiple of the arena's 64-byte alignment, so exactly half the files fit.
    let capacity = (FILES / 2 * SIZE).to_string();
    // Opens asked of the daemon: the policies' arithmetic, with each miss read from the
    // source by the daemon (where the kernel opens files itself, one opened again right after
    // its last read may come from the pages it has not dropped yet: tests/it/fastopen.rs).
    let mut options = vec![
        "--no-prefetch",
        "--opens",
        "daemon",
        "--policy",
        policy,
        "--cache-size",
        &capacity,
    ];
    options.extend(extra);
    let m = Mount::new(&src, &options);
    wait_for_scan(&m.mnt);
    for epoch in 0..4 {
        read_epoch(&m.mnt, &rels, SIZE, epoch);
        let s = stats(&m.mnt);
        assert!(
            num(&s, "cached_bytes") <= FILES as u64 / 2 * SIZE as u64,
            "{s}"
        );
        assert!(num(&s, "cache_used") <= num(&s, "cache_capacity"), "{s}");
    }
    let cached_per_file: Vec<u64> = rels
        .iter()
        .map(|r| {
            let v = xattr::get(m.path(r), "user.coorfs.cached")
                .unwrap()
                .unwrap();
            String::from_utf8(v).unwrap().parse().unwrap()
        })
        .collect();
    let s = stats(&m.mnt);
    m.unmount();
    (s, cached_per_file)
}

#[test]
fn minio_hit_rate_equals_the_cached_fraction_in_every_later_epoch() {
    for passthrough in [true, false] {
        let extra: &[&str] = if passthrough {
            &[]
        } else {
            &["--no-passthrough"]
        };
        minio_epochs(extra, passthrough);
    }
}

fn minio_epochs(extra: &[&str], passthrough: bool) {
    let (s, cached_per_file) = four_epochs("minio", extra);
    let cached_files = num(&s, "cached_files");
    assert_eq!(cached_files, FILES as u64 / 2, "{s}");
    assert_eq!(
        cached_per_file
            .iter()
            .filter(|&&c| c == SIZE as u64)
            .count() as u64,
        cached_files
    );
    assert!(cached_per_file.iter().all(|&c| c == 0 || c == SIZE as u64));
    let fraction = cached_files as f64 / FILES as f64;

    assert_eq!(num(&s, "reads"), 4 * FILES as u64);
    assert_eq!(num(&s, "hits") + num(&s, "misses"), num(&s, "reads"));
    // Every read of an uncached file through the daemon offers it to the cache, which
    // refuses it; with passthrough, the kernel reads the files the cache will not keep from
    // the source (all but those opened while the cache still had room).
    let refused = num(&s, "admissions_refused");
    let from_source = num(&s, "passthrough_source_opens");
    assert_eq!(refused + from_source, 4 * (FILES as u64 / 2), "{s}");
    if passthrough {
        assert!(from_source >= 3 * (FILES as u64 / 2), "{s}");
    } else {
        assert_eq!(from_source, 0);
    }
    assert_eq!(num(&s, "evictions"), 0);
    assert_eq!(num(&s, "source_errors"), 0);

    let epochs = s["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 4, "{s}");
    let dataset = (FILES * SIZE) as u64;
    let uncached = (FILES as u64 - cached_files) * SIZE as u64;
    for (i, e) in epochs.iter().enumerate() {
        assert_eq!(num(e, "epoch"), i as u64 + 1);
        assert_eq!(num(e, "files"), FILES as u64);
        assert_eq!(num(e, "hits") + num(e, "misses"), num(e, "reads"));
        assert_eq!(e["complete"], true);
        let hit_rate = e["hit_rate"].as_f64().unwrap();
        if i == 0 {
            assert_eq!(hit_rate, 0.0);
            assert_eq!(num(e, "bytes_from_source"), dataset);
        } else {
            assert!(
                (hit_rate - fraction).abs() <= 0.01,
                "epoch {}: {hit_rate} vs {fraction}",
                i + 1
            );
            assert_eq!(num(e, "bytes_from_source"), uncached, "epoch {}", i + 1);
            assert_eq!(
                num(e, "bytes_from_cache"),
                dataset - uncached,
                "epoch {}",
                i + 1
            );
        }
    }
    assert_eq!(num(&s, "bytes_from_source"), dataset + 3 * uncached);
}

#[test]
fn lru_hits_less_than_minio_within_the_same_budget() {
    // The same dataset, budget and epoch orders (seeds 0-3) under each policy.
    let (s, _) = four_epochs("lru", &[]);
    let (minio, _) = four_epochs("minio", &[]);
    assert_eq!(num(&s, "hits") + num(&s, "misses"), num(&s, "reads"));
    assert!(num(&s, "evictions") > 0, "{s}");
    let epochs = s["epochs"].as_array().unwrap();
    let minio_epochs = minio["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), minio_epochs.len());
    for (e, m) in epochs.iter().zip(minio_epochs).skip(1) {
        let hit_rate = e["hit_rate"].as_f64().unwrap();
        let minio_rate = m["hit_rate"].as_f64().unwrap();
        assert!(
            hit_rate < 0.4,
            "LRU epoch {} hit rate {hit_rate}",
            num(e, "epoch")
        );
        // Every miss is read from the source, whole.
        assert_eq!(num(e, "bytes_from_source"), num(e, "misses") * SIZE as u64);
        // MinIO hits the cached half in every later epoch. LRU hits a file read at fraction
        // u of one epoch and v of the next only if the distinct files read in between,
        // (1 - u) + v - (1 - u)v = 1 - u(1 - v) of the dataset, fit in the half it holds:
        // with u and v uniform, P(u(1 - v) >= 1/2) = 1/2 - ln(2)/2 = 0.153 (0.15-0.18
        // measured, two readers perturbing the order).
        let lru_expected = 0.5 - std::f64::consts::LN_2 / 2.0;
        assert!(
            (minio_rate - 0.5).abs() <= 0.01,
            "MinIO epoch {} hit rate {minio_rate}",
            num(m, "epoch")
        );
        assert!(
            (hit_rate - lru_expected).abs() <= 0.05,
            "LRU epoch {} hit rate {hit_rate}, expected {lru_expected:.3}",
            num(e, "epoch")
        );
        assert!(
            minio_rate > hit_rate + 0.25,
            "epoch {}: MinIO {minio_rate} vs LRU {hit_rate}",
            num(e, "epoch")
        );
    }
}

#[test]
fn policy_none_caches_nothing_and_counts_every_open_a_miss() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 200, SIZE, 4);
    let m = Mount::new(&src, &["--no-prefetch", "--policy", "none"]);
    wait_for_scan(&m.mnt);
    read_epoch(&m.mnt, &rels, SIZE, 1);
    let s = stats(&m.mnt);
    assert_eq!(
        (num(&s, "hits"), num(&s, "misses"), num(&s, "cached_bytes")),
        (0, 200, 0)
    );
    assert_eq!(s["policy"], "none");
    m.unmount();
}

#[test]
fn large_files_are_cached_in_blocks_and_read_right_at_any_offset() {
    use std::os::unix::fs::FileExt;
    let dir = open_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let data = bytes(9, (5 << 20) + 12345);
    std::fs::write(src.join("shard.tfrecord"), &data).unwrap();
    evict_pages(&src);
    // Room for three 1 MiB blocks, each in the file the kernel may read by passthrough: whole
    // pages and the overhead of the file (src/cache/kernel_files.rs).
    let overhead = coorfs::cache::kernel_files::FILE_OVERHEAD;
    let capacity = (3 * ((1 << 20) + overhead)).to_string();
    let m = Mount::new(&src, &["--cache-size", &capacity, "--block-size", "1M"]);
    let f = std::fs::File::open(m.path("shard.tfrecord")).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..300 {
        use rand::Rng;
        let offset = rng.random_range(0..data.len() as u64 + 100);
        let len = rng.random_range(1..(3 << 20));
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let n = f.read_at(&mut buf[got..], offset + got as u64).unwrap();
            if n == 0 {
                break;
            }
            got += n;
        }
        let start = (offset as usize).min(data.len());
        let end = (offset as usize + len).min(data.len());
        assert!(buf[..got] == data[start..end], "at {offset}+{len}");
    }
    drop(f);
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "cached_blocks"), 3, "{s}");
    assert_eq!(num(&s, "cached_bytes"), 3 << 20);
    assert_eq!(num(&s, "cached_files"), 0);
    let cached = xattr::get(m.path("shard.tfrecord"), "user.coorfs.cached")
        .unwrap()
        .unwrap();
    assert_eq!(cached, (3u64 << 20).to_string().into_bytes());
    m.unmount();
}

#[test]
fn a_modified_source_file_is_served_with_its_new_content() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a"), b"first version").unwrap();
    std::fs::write(src.join("b"), b"unchanged").unwrap();
    let m = Mount::new(&src, &["--no-prefetch"]);
    assert_eq!(std::fs::read(m.path("a")).unwrap(), b"first version");
    assert_eq!(std::fs::read(m.path("b")).unwrap(), b"unchanged");
    assert_eq!(std::fs::read(m.path("a")).unwrap(), b"first version");
    let before = stats(&m.mnt);
    assert_eq!(num(&before, "hits"), 1, "{before}");

    // Same size, new bytes and mtime; then longer.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(src.join("a"), b"second versio").unwrap();
    assert_eq!(std::fs::read(m.path("a")).unwrap(), b"second versio");
    std::fs::write(src.join("a"), b"a third, longer version").unwrap();
    assert_eq!(
        std::fs::read(m.path("a")).unwrap(),
        b"a third, longer version"
    );
    assert_eq!(std::fs::metadata(m.path("a")).unwrap().len(), 23);
    // Shorter than the first.
    std::fs::write(src.join("a"), b"4th").unwrap();
    assert_eq!(std::fs::read(m.path("a")).unwrap(), b"4th");
    assert_eq!(std::fs::read(m.path("b")).unwrap(), b"unchanged");
    m.unmount();
}

#[test]
fn attributes_follow_the_xattr_protocol_and_agree_with_coorfs_stats() {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 50, 1000, 2);
    let m = Mount::new(&src, &["--no-prefetch"]);
    wait_for_scan(&m.mnt);
    read_epoch(&m.mnt, &rels, 1000, 3);
    let root = CString::new(m.mnt.as_os_str().as_bytes()).unwrap();
    let get = |name: &str, size: usize| -> Result<Vec<u8>, i32> {
        let name = CString::new(name).unwrap();
        let mut buf = vec![0u8; size];
        // SAFETY: valid C strings and a buffer of `size` bytes.
        let n =
            unsafe { libc::getxattr(root.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), size) };
        if n < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
        }
        buf.truncate(if size == 0 { 0 } else { n as usize });
        Ok(if size == 0 {
            n.to_string().into_bytes()
        } else {
            buf
        })
    };
    // A size-0 probe answers the length, with room for the value to grow before the read
    // (it is rebuilt at each request); a short buffer gets ERANGE; unknown names ENODATA.
    assert_eq!(get("user.coorfs.reads", 0).unwrap(), b"258");
    assert_eq!(get("user.coorfs.reads", 100).unwrap(), b"50");
    let probed: usize = String::from_utf8(get("user.coorfs.stats", 0).unwrap())
        .unwrap()
        .parse()
        .unwrap();
    let stats = get("user.coorfs.stats", probed).unwrap();
    assert!(probed >= stats.len() + 256, "{probed} for {}", stats.len());
    assert_eq!(get("user.coorfs.reads", 1), Err(libc::ERANGE));
    assert_eq!(get("user.coorfs.nonsense", 100), Err(libc::ENODATA));
    assert_eq!(get("user.other", 100), Err(libc::ENODATA));

    let names: Vec<String> = xattr::list(&m.mnt)
        .unwrap()
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    for stat in coorfs::stats::Stat::ALL {
        assert!(
            names.contains(&coorfs::stats::xattr_name(*stat)),
            "{names:?}"
        );
    }
    assert!(names.contains(&"user.coorfs.stats".to_string()));
    let file_names: Vec<_> = xattr::list(m.path(&rels[0])).unwrap().collect();
    assert_eq!(
        file_names,
        vec![std::ffi::OsString::from("user.coorfs.cached")]
    );

    // Every attribute (as `getfattr -d -m -` dumps them), coorfs stats and coorfs stats --json
    // all say the same.
    let dump: String = names
        .iter()
        .map(|name| {
            let value = xattr::get(&m.mnt, name).unwrap().unwrap();
            format!("{name}=\"{}\"\n", String::from_utf8_lossy(&value))
        })
        .collect();
    assert!(dump.contains("user.coorfs.hits=\"0\""), "{dump}");
    assert!(dump.contains("user.coorfs.misses=\"50\""), "{dump}");
    let table = coorfs([std::ffi::OsStr::new("stats"), m.mnt.as_os_str()]);
    assert!(table.status.success());
    let table = String::from_utf8_lossy(&table.stdout);
    let line = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    assert_eq!(line("misses").as_deref(), Some("misses 50"), "{table}");
    assert_eq!(
        line("cached_files").as_deref(),
        Some("cached_files 50"),
        "{table}"
    );
    let json = coorfs([
        std::ffi::OsStr::new("stats"),
        std::ffi::OsStr::new("--json"),
        m.mnt.as_os_str(),
    ]);
    let doc: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["misses"], 50);
    assert_eq!(doc["cached_files"], 50);
    assert_eq!(doc["epochs"][0]["complete"], true);

    let not_mounted = coorfs([std::ffi::OsStr::new("stats"), src.as_os_str()]);
    assert_eq!(not_mounted.status.code(), Some(2));
    assert_eq!(
        stderr(&not_mounted),
        format!("coorfs: {} is not a coorfs mount", src.display())
    );
    m.unmount();
}

/// Drops the kernel's pages of every file of the mount, as memory pressure would.
fn drop_kernel_pages(mnt: &Path, rels: &[PathBuf]) {
    use std::os::fd::AsRawFd;
    for rel in rels {
        let f = std::fs::File::open(mnt.join(rel)).unwrap();
        // SAFETY: advice about an open descriptor's page cache.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
    }
}

#[test]
fn hits_bypass_the_kernel_page_cache_while_it_does_not_keep_their_pages() {
    const FILES: usize = 1024; // 64 sentinels (one file in 16), two windows of 32
    const SIZE: usize = 4096;
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, FILES, SIZE, 8);
    // The gauge decides how the daemon answers opens.
    let m = Mount::new(
        &src,
        &["--no-prefetch", "--cache-size", "64M", "--opens", "daemon"],
    );
    wait_for_scan(&m.mnt);
    let kernel = |m: &Mount| {
        let s = stats(&m.mnt);
        (num(&s, "kernel_cache"), num(&s, "kernel_refills"))
    };
    // A kept sentinel may still be asked for again, its page taken by the machine's
    // background reclaim (`STRAY_READS`): counted like any refill, and too few to change the
    // gauge's choice (it needs half a window).
    // Epoch 1 caches every file; epoch 2 hands the sentinels' pages to the kernel, which
    // keeps them (memory to spare): epoch 3 asks for none again, or a stray few.
    for epoch in 0..3 {
        read_epoch(&m.mnt, &rels, SIZE, epoch);
    }
    let (keeps, stray) = kernel(&m);
    assert_eq!(keeps, 1);
    assert!(
        stray <= STRAY_READS,
        "{stray} sentinels read again though kept"
    );
    // The kernel dropped every page before epoch 4: all 64 sentinels are read again, each
    // once (one READ a reopen at most counts), and the other hits of files over 64 KiB would
    // go around the kernel's cache from then on, bytes still right.
    drop_kernel_pages(&m.mnt, &rels);
    read_epoch(&m.mnt, &rels, SIZE, 3);
    assert_eq!(kernel(&m), (0, stray + 64));
    drop_kernel_pages(&m.mnt, &rels);
    read_epoch(&m.mnt, &rels, SIZE, 4);
    assert_eq!(kernel(&m), (0, stray + 128));
    // Small hits are read through the kernel's cache all the same: direct I/O would cost two
    // READs and pin the reader's whole buffer. Read through an open file, its page is there.
    const CHECKED: usize = 16;
    for rel in &rels[..CHECKED] {
        let mut f = std::fs::File::open(m.path(rel)).unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut got).unwrap();
        assert_eq!(got, std::fs::read(src.join(rel)).unwrap());
        assert_eq!(resident_in(&f), (1, 1), "{}", rel.display());
    }
    // Kept again: the sentinels tell, and hits use the kernel's cache again.
    read_epoch(&m.mnt, &rels, SIZE, 5);
    let (keeps, refills) = kernel(&m);
    assert_eq!(keeps, 1);
    assert!(
        (stray + 128..=stray + 128 + STRAY_READS).contains(&refills),
        "{refills} refills, {stray} before the drops"
    );
    // Six epochs read and two passes that dropped pages opened every file: all hits but the
    // first epoch, whichever way the kernel was told to cache them, and the files checked.
    let s = stats(&m.mnt);
    assert_eq!(
        (num(&s, "misses"), num(&s, "hits")),
        (FILES as u64, 7 * FILES as u64 + CHECKED as u64)
    );
    m.unmount();
}

/// Pages of the mount's file `rel` in the kernel's page cache, and the file's pages.
fn resident_pages(mnt: &Path, rel: &Path) -> (usize, usize) {
    resident_in(&std::fs::File::open(mnt.join(rel)).unwrap())
}

/// Pages of open file `f` in the kernel's page cache, and the file's pages.
fn resident_in(f: &std::fs::File) -> (usize, usize) {
    // SAFETY: a private read-only mapping of a file nobody writes while the test runs.
    let map = unsafe { memmap2::Mmap::map(f) }.unwrap();
    let pages = map.len().div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` has one byte for each page of the mapping.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    (vec.iter().filter(|&&b| b & 1 == 1).count(), pages)
}

#[test]
fn small_misses_enter_the_kernel_page_cache_only_if_the_cache_keeps_them() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let small = make_dataset(&src.join("small"), 40, 6000, 2);
    let large = make_dataset(&src.join("large"), 4, 100 * 1024, 1);
    let rel = |base: &str, r: &PathBuf| Path::new(base).join(r);
    let cases = [
        // MinIO with room: a small file read once is in the kernel's page cache (its next
        // open needs no READ); a large one went around it. (Without passthrough: a
        // passthrough open's mapping is the cache's own file, whose pages mincore would show.)
        (
            vec!["--no-prefetch", "--cache-size", "64M", "--no-passthrough"],
            true,
        ),
        // LRU may evict what it takes, so a miss is never known to stay: direct I/O.
        (
            vec!["--no-prefetch", "--cache-size", "64M", "--policy", "lru"],
            false,
        ),
    ];
    for (options, small_in_kernel) in cases {
        let m = Mount::new(&src, &options);
        wait_for_scan(&m.mnt);
        let files: Vec<(PathBuf, usize)> = small
            .iter()
            .map(|r| (rel("small", r), 6000))
            .chain(large.iter().map(|r| (rel("large", r), 100 * 1024)))
            .collect();
        for (f, size) in &files {
            let got = std::fs::read(m.path(f)).unwrap();
            assert_eq!(got, std::fs::read(src.join(f)).unwrap(), "{}", f.display());
            assert_eq!(got.len(), *size);
        }
        for (f, size) in &files {
            let (resident, pages) = resident_pages(&m.mnt, f);
            let want = if *size <= 6000 && small_in_kernel {
                pages
            } else {
                0
            };
            assert_eq!(resident, want, "{} with {options:?}", f.display());
        }
        let s = stats(&m.mnt);
        assert_eq!(num(&s, "misses"), files.len() as u64, "{s}");
        m.unmount();
    }
}
