//! FUSE passthrough through a real mount: the kernel reads cached files over 64 KiB from the
//! cache's own files, and files the cache will not keep from the source, with no READ reaching
//! the daemon; opens are still counted; the bytes are the source's on every path; a file that
//! changes while open behaves as a local one or as the cache's version, never mixed; and
//! `--no-passthrough` is today's path. (The security tests run with passthrough on, the
//! default: permissions are checked at each open as before.)

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::common::*;
use serde_json::Value;

/// Over 64 KiB, so that cached files are kept where the kernel can read them.
const SIZE: usize = 100 * 1024 + 7;

/// The bytes `make_dataset` wrote to `rel`.
fn content(rel: &Path, size: usize) -> Vec<u8> {
    let i = rel.file_stem().unwrap().to_str().unwrap()[1..]
        .parse()
        .unwrap();
    bytes(i, size)
}

/// Reads every file whole and checks it against what `make_dataset` wrote.
fn read_all(m: &Mount, rels: &[PathBuf], size: usize) {
    for rel in rels {
        let got = std::fs::read(m.path(rel)).unwrap();
        assert!(got == content(rel, size), "{} differs", rel.display());
    }
}

/// What an epoch changed of the counters named.
fn deltas(before: &Value, after: &Value, keys: &[&str]) -> Vec<u64> {
    keys.iter()
        .map(|k| num(after, k) - num(before, k))
        .collect()
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn cached_files_are_read_by_the_kernel_with_no_read_reaching_the_daemon() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 60, SIZE, 6);
    let log = dir.path().join("log");
    let m = Mount::new(
        &src,
        &["--no-prefetch", "--log-file", log.to_str().unwrap()],
    );
    wait_for_scan(&m.mnt);
    assert!(log_of(&log).contains("passthrough: on"), "{}", log_of(&log));
    read_all(&m, &rels, SIZE);
    let s1 = stats(&m.mnt);
    assert_eq!(num(&s1, "passthrough"), 1);
    assert_eq!(num(&s1, "cached_files"), 60);
    assert!(num(&s1, "read_requests") > 0, "epoch 1 fills the cache");
    for _ in 0..2 {
        let before = stats(&m.mnt);
        read_all(&m, &rels, SIZE);
        let after = stats(&m.mnt);
        let keys = ["hits", "misses", "passthrough_opens", "read_requests"];
        assert_eq!(deltas(&before, &after, &keys), [60, 0, 60, 0], "{after}");
        assert_eq!(
            num(&after, "bytes_from_cache") - num(&before, "bytes_from_cache"),
            60 * SIZE as u64
        );
    }
    // A mapping reads the same bytes, and so do reads at odd offsets, and two descriptors of
    // one file open at once (one backing file for the inode).
    let path = m.path(&rels[3]);
    let want = content(&rels[3], SIZE);
    let a = std::fs::File::open(&path).unwrap();
    let b = std::fs::File::open(&path).unwrap();
    // SAFETY: the file is read-only and nobody truncates the source while this test runs.
    let map = unsafe { memmap2::Mmap::map(&a) }.unwrap();
    let first_diff = map.iter().zip(&want).position(|(a, b)| a != b);
    assert!(
        map[..] == want[..],
        "mapped {} bytes of {}, first difference at {first_diff:?}",
        map.len(),
        want.len()
    );
    let mut part = vec![0u8; 5000];
    b.read_exact_at(&mut part, 70_001).unwrap();
    assert!(part[..] == want[70_001..75_001]);
    drop((map, a, b));
    assert_eq!(
        num(&stats(&m.mnt), "read_requests"),
        num(&s1, "read_requests")
    );
    m.unmount();
}

#[test]
fn files_the_cache_will_not_keep_are_read_by_the_kernel_from_the_source() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 40, SIZE, 4);
    // Room for 10 of the 40 files (each takes whole pages and the overhead of its file).
    let per_file = (SIZE as u64).div_ceil(4096) * 4096 + coorfs::cache::kernel_files::FILE_OVERHEAD;
    let capacity = (10 * per_file).to_string();
    let m = Mount::new(&src, &["--no-prefetch", "--cache-size", &capacity]);
    wait_for_scan(&m.mnt);
    read_all(&m, &rels, SIZE);
    let s1 = stats(&m.mnt);
    assert_eq!(num(&s1, "cached_files"), 10, "{s1}");
    for _ in 0..2 {
        let before = stats(&m.mnt);
        read_all(&m, &rels, SIZE);
        let after = stats(&m.mnt);
        let keys = [
            "hits",
            "misses",
            "passthrough_opens",
            "passthrough_source_opens",
            "read_requests",
            "bytes_from_source",
        ];
        let want = [10, 30, 40, 30, 0, 30 * SIZE as u64];
        assert_eq!(deltas(&before, &after, &keys), want, "{after}");
        assert!(num(&after, "cache_used") <= num(&after, "cache_capacity"));
    }
    // The epochs count what happened: 30 files a round from the source.
    let last = &stats(&m.mnt)["epochs"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(num(last, "misses"), 30, "{last}");
    assert_eq!(num(last, "bytes_from_source"), 30 * SIZE as u64, "{last}");
    m.unmount();
}

#[test]
fn without_passthrough_every_read_goes_through_the_daemon_as_before() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 20, SIZE, 2);
    for (extra, why) in [
        ("--no-passthrough", "passthrough: off (--no-passthrough)"),
        ("--fast-open", "passthrough: off (--opens kernel"),
    ] {
        let log = dir.path().join(format!("log{extra}"));
        let m = Mount::new(
            &src,
            &["--no-prefetch", extra, "--log-file", log.to_str().unwrap()],
        );
        wait_for_scan(&m.mnt);
        for _ in 0..3 {
            read_all(&m, &rels, SIZE);
        }
        let s = stats(&m.mnt);
        assert_eq!(num(&s, "passthrough"), 0, "{extra}");
        assert_eq!(num(&s, "passthrough_opens"), 0, "{extra}");
        assert!(num(&s, "read_requests") >= 20, "{extra}: {s}");
        let text = log_of(&log);
        assert_eq!(text.matches("passthrough: off").count(), 1, "{text}");
        assert!(text.contains(why), "{extra}: {text}");
        m.unmount();
    }
}

/// Reads what `f` gives from offset 0 to its end.
fn read_from_start(f: &mut std::fs::File) -> Vec<u8> {
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    got
}

#[test]
fn a_file_changed_while_open_is_never_read_mixed() {
    // Cached (the kernel reads the cache's copy: the version opened, whole, as through a
    // local descriptor of a file replaced by rename) and uncached with --policy none (the
    // kernel reads the source file itself: what a local descriptor reads). Either way the
    // next open reads the new bytes.
    for policy in ["minio", "none"] {
        let dir = open_tempdir();
        let src = dir.path().join("src");
        let rels = make_dataset(&src, 3, SIZE, 1);
        let m = Mount::new(&src, &["--no-prefetch", "--policy", policy]);
        wait_for_scan(&m.mnt);
        read_all(&m, &rels, SIZE);
        let (old, new) = (content(&rels[0], SIZE), bytes(99, SIZE));

        // Rewritten in place while open.
        let mut f = std::fs::File::open(m.path(&rels[0])).unwrap();
        std::fs::write(src.join(&rels[0]), &new).unwrap();
        let got = read_from_start(&mut f);
        let want = if policy == "none" { &new } else { &old };
        assert!(got == *want, "{policy}: rewritten in place");
        drop(f);
        assert!(std::fs::read(m.path(&rels[0])).unwrap() == new, "{policy}");

        // Truncated while open: a local descriptor reads up to the new end.
        let mut f = std::fs::File::open(m.path(&rels[1])).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(src.join(&rels[1]))
            .unwrap()
            .set_len(1000)
            .unwrap();
        let got = read_from_start(&mut f);
        let whole = content(&rels[1], SIZE);
        let want = if policy == "none" {
            &whole[..1000]
        } else {
            &whole[..]
        };
        assert!(got == want, "{policy}: truncated, read {} bytes", got.len());
        drop(f);
        assert!(
            std::fs::read(m.path(&rels[1])).unwrap() == whole[..1000],
            "{policy}"
        );

        // Replaced by a rename while open: the descriptor reads what it opened.
        let mut f = std::fs::File::open(m.path(&rels[2])).unwrap();
        let tmp = src.join("c000/new.tmp");
        std::fs::write(&tmp, &new).unwrap();
        std::fs::rename(&tmp, src.join(&rels[2])).unwrap();
        let opened = content(&rels[2], SIZE);
        assert!(read_from_start(&mut f) == opened, "{policy}: replaced");
        drop(f);
        assert!(std::fs::read(m.path(&rels[2])).unwrap() == new, "{policy}");

        // Close, change, open: always the new bytes, though the kernel sends the RELEASE of
        // the closed descriptor in the background and the next OPEN may come first.
        for round in 0..100u64 {
            let content = bytes(1000 + round, SIZE);
            std::fs::write(src.join(&rels[0]), &content).unwrap();
            // The second read is a hit, read by passthrough from the cache's file.
            for read in 0..2 {
                let got = std::fs::read(m.path(&rels[0])).unwrap();
                assert!(got == content, "{policy}: round {round}, read {read}");
            }
        }
        let s = stats(&m.mnt);
        // Passthrough was exercised: the second read of a round goes through the daemon only
        // when it comes before the RELEASE of the first (103-107 passthrough opens in all, 6
        // runs of each policy on a quiet machine; under 100 once under the whole suite's load).
        assert!(num(&s, "passthrough_opens") >= 50, "{policy}: {s}");
        m.unmount();
    }
}

#[test]
fn readers_opening_the_same_files_at_once_all_get_the_bytes() {
    // Two threads in the same order open each file at about the same time, while the kernel
    // reads it by passthrough for one of them and the other may have wanted the daemon (a
    // staged file): the kernel refuses any open of an inode other than its passthrough one
    // while that is open (EIO), so every open of it must be given the same backing file.
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let big = make_dataset(&src.join("big"), 60, SIZE, 3);
    let small = make_dataset(&src.join("small"), 200, 16_000, 4);
    let files: Vec<(PathBuf, usize)> = (big.iter().map(|r| (Path::new("big").join(r), SIZE)))
        .chain(small.iter().map(|r| (Path::new("small").join(r), 16_000)))
        .collect();
    for options in [&["--policy", "none"][..], &["--cache-size", "2M"], &[]] {
        let m = Mount::new(&src, options);
        wait_for_scan(&m.mnt);
        for _ in 0..3 {
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for (rel, size) in &files {
                            let got = std::fs::read(m.path(rel))
                                .unwrap_or_else(|e| panic!("{options:?} {}: {e}", rel.display()));
                            let name = Path::new(rel.file_name().unwrap());
                            assert!(got == content(name, *size), "{}", rel.display());
                        }
                    });
                }
            });
        }
        let s = stats(&m.mnt);
        assert!(num(&s, "passthrough_opens") > 0, "{options:?}: {s}");
        m.unmount();
    }
}

#[test]
fn without_passthrough_a_file_truncated_or_removed_while_open_reads_as_with_it() {
    // As `a_file_changed_while_open_is_never_read_mixed`, through the daemon: a cached file
    // reads as the version opened, whole (close-to-open, as from the cache's file by
    // passthrough); with no cache (`--policy none`) as a local descriptor reads it, up to the
    // new end. Never bytes that were not the source's (the kernel padded a short read of the
    // truncated file with 128-256 KiB of zeros), and a read at the end is 0 bytes, not the
    // ENOENT of the removed file's path (`cat` failed after reading every byte).
    const BIG: usize = 3 << 20;
    const KEEP: usize = 100_000;
    for policy in ["minio", "none"] {
        let dir = open_tempdir();
        let src = dir.path().join("src");
        let rels = make_dataset(&src, 2, BIG, 1);
        let m = Mount::new(
            &src,
            &[
                "--no-prefetch",
                "--no-passthrough",
                "--policy",
                policy,
                // The kernel asks for the attributes again past a second.
                "--metadata-ttl",
                "1s",
            ],
        );
        wait_for_scan(&m.mnt);
        read_all(&m, &rels, BIG);
        let s = stats(&m.mnt);
        if policy == "minio" {
            assert_eq!(num(&s, "cached_files"), 2, "{s}");
        }

        // Truncated while open, after a first read.
        let whole = content(&rels[0], BIG);
        let mut f = std::fs::File::open(m.path(&rels[0])).unwrap();
        let mut got = vec![0u8; 64 << 10];
        f.read_exact(&mut got).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(src.join(&rels[0]))
            .unwrap()
            .set_len(KEEP as u64)
            .unwrap();
        f.read_to_end(&mut got).unwrap();
        // The source is watched (the kernel may come to open files itself), so the kernel
        // may learn the new size before the read ends: then the read ends there, as a local
        // descriptor's would. Either way, only the opened version's bytes.
        if policy == "minio" && got.len() != KEEP {
            assert!(
                got == whole,
                "{policy}: truncated, read {} bytes",
                got.len()
            );
        } else {
            // The kernel's page cache may still hold pages of the version opened: each byte
            // is the opened file's, to its new end at least.
            assert!(
                got.len() >= KEEP,
                "{policy}: truncated, read {} bytes",
                got.len()
            );
            assert!(
                got == whole[..got.len()],
                "{policy}: truncated, {} bytes, not the source's",
                got.len()
            );
        }
        drop(f);
        assert!(
            std::fs::read(m.path(&rels[0])).unwrap() == whole[..KEEP],
            "{policy}: the next open"
        );

        // Removed while open: every byte, then the end, as `cat` reads it.
        let whole = content(&rels[1], BIG);
        let mut f = std::fs::File::open(m.path(&rels[1])).unwrap();
        let mut got = vec![0u8; 64 << 10];
        f.read_exact(&mut got).unwrap();
        std::fs::remove_file(src.join(&rels[1])).unwrap();
        // Past the kernel's attribute timeout, so that the read at the end asks again.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        f.read_to_end(&mut got)
            .unwrap_or_else(|e| panic!("{policy}: removed, after {} bytes: {e}", got.len()));
        assert!(got == whole, "{policy}: removed, read {} bytes", got.len());
        let mut more = [0u8; 16];
        assert_eq!(f.read(&mut more).unwrap(), 0, "{policy}: past the end");
        drop(f);
        let gone = std::fs::File::open(m.path(&rels[1])).unwrap_err();
        assert_eq!(gone.raw_os_error(), Some(libc::ENOENT), "{policy}");
        m.unmount();
    }
}
