//! The disk tier (`--cache-dir`, `--disk-cache-size`) on real mounts: it keeps what memory
//! does not, the hit rate survives a restart, a `kill -9` and flipped bytes never serve anything corrupt, a changed source file
//! is a miss, a full disk turns the tier off without a failed read (counted in `tier_errors`),
//! a smaller size at a remount is enforced, and the directory is one daemon's and root's
//! alone.

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;

/// Files of the dataset, and their size: a multiple of the page, so that the disk holds
/// exactly as many as its size says (blocks of 64 KiB and more start on a page).
const FILES: usize = 40;
const SIZE: usize = 64 << 10;

struct Setup {
    _dir: tempfile::TempDir,
    src: PathBuf,
    cache: PathBuf,
    /// Relative to `src`, in the order they are read.
    files: Vec<PathBuf>,
}

fn setup() -> Setup {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let files = make_dataset(&src, FILES, SIZE, 4);
    let cache = dir.path().join("cache");
    Setup {
        cache,
        src,
        files,
        _dir: dir,
    }
}

impl Setup {
    /// Mounts with no memory cache and a disk tier of `files` files, plus `extra`.
    fn mount(&self, files: usize, extra: &[&str]) -> Mount {
        let size = (files * SIZE).to_string();
        let mut args = vec![
            "--cache-size",
            "0",
            "--no-prefetch",
            "--cache-dir",
            self.cache.to_str().unwrap(),
            "--disk-cache-size",
            &size,
        ];
        args.extend(extra);
        Mount::new(&self.src, &args)
    }

    /// Reads every file through `m` and checks its bytes against the source.
    fn read_all(&self, m: &Mount) {
        for rel in &self.files {
            let got = std::fs::read(m.path(rel)).unwrap();
            let want = std::fs::read(self.src.join(rel)).unwrap();
            assert!(got == want, "{} differs", rel.display());
        }
    }
}

/// Waits until the disk tier of `m` holds `blocks` blocks.
fn wait_for_disk(m: &Mount, blocks: u64) {
    assert!(
        wait_for(Duration::from_secs(20), || num(
            &stats(&m.mnt),
            "disk_cached_blocks"
        ) == blocks),
        "the disk tier holds {} blocks, not {blocks}",
        num(&stats(&m.mnt), "disk_cached_blocks")
    );
}

#[test]
fn a_restart_keeps_the_disk_tiers_hit_rate() {
    let s = setup();
    let m = s.mount(FILES / 2, &[]);
    s.read_all(&m);
    wait_for_disk(&m, FILES as u64 / 2);
    let st = stats(&m.mnt);
    assert_eq!(num(&st, "hits"), 0);
    assert_eq!(num(&st, "disk_used"), (FILES / 2 * SIZE) as u64);
    assert_eq!(num(&st, "disk_enabled"), 1);
    // The index: a hash table of 73-byte slots, at most 7/8 full.
    let index = num(&st, "disk_index_bytes");
    assert!((20 * 73..=40 * 73).contains(&index), "{index}");
    m.unmount();
    // Every file in the directory is root's alone.
    for name in ["data", "index", "lock"] {
        let out = as_nobody("cat", &[s.cache.join(name).as_os_str()]);
        assert!(!out.status.success(), "nobody read {name}");
        assert!(
            stderr(&out).contains("Permission denied"),
            "{}",
            stderr(&out)
        );
    }

    // Epoch 1 after the restart: memory holds nothing, the disk half the dataset.
    let m = s.mount(FILES / 2, &[]);
    s.read_all(&m);
    let st = stats(&m.mnt);
    assert_eq!(num(&st, "reads"), FILES as u64);
    assert_eq!(num(&st, "hits"), FILES as u64 / 2);
    assert_eq!(st["hit_rate"].as_f64(), Some(0.5));
    assert_eq!(num(&st, "disk_hits"), FILES as u64 / 2);
    assert_eq!(num(&st, "bytes_from_disk"), (FILES / 2 * SIZE) as u64);
    assert_eq!(num(&st, "bytes_from_source"), (FILES / 2 * SIZE) as u64);
    assert_eq!(num(&st, "disk_dropped"), 0);
    m.unmount();
}

#[test]
fn memory_and_disk_together_hold_a_dataset_neither_holds_alone_and_again_after_a_restart() {
    let s = setup();
    // Memory for a quarter of the files (and half a file), the disk for three quarters.
    let memory = (FILES / 4 * SIZE + SIZE / 2).to_string();
    let disk = (FILES * 3 / 4 * SIZE).to_string();
    let args = [
        "--cache-size",
        &memory,
        "--no-prefetch",
        "--cache-dir",
        s.cache.to_str().unwrap(),
        "--disk-cache-size",
        &disk,
    ];
    let m = Mount::new(&s.src, &args);
    wait_for_scan(&m.mnt);
    s.read_all(&m);
    wait_for_disk(&m, FILES as u64 * 3 / 4);
    let st = stats(&m.mnt);
    assert_eq!(num(&st, "cached_files"), FILES as u64 / 4);
    assert_eq!(num(&st, "bytes_from_source"), (FILES * SIZE) as u64);
    // Epoch 2, read by another process (this one's re-reads, moments later, would be
    // epoch 1's): a quarter from memory, the rest from the disk, nothing from the source.
    let out = std::process::Command::new("cat")
        .args(s.files.iter().map(|rel| m.path(rel)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let want: Vec<u8> = (s.files.iter())
        .flat_map(|rel| std::fs::read(s.src.join(rel)).unwrap())
        .collect();
    assert!(out.stdout == want, "epoch 2 differs from the source");
    let st = stats(&m.mnt);
    assert_eq!(num(&st, "bytes_from_source"), (FILES * SIZE) as u64);
    assert_eq!(num(&st, "disk_hits"), FILES as u64 * 3 / 4);
    assert_eq!(num(&st, "hits"), FILES as u64);
    m.unmount();

    // After a restart memory is empty and the disk holds three quarters. The job reads the
    // disk's files first (the reverse order): memory does not fill with copies of them, so
    // it still has room for the quarter only the source has, and epoch 2 reads nothing
    // from the source.
    let m = Mount::new(&s.src, &args);
    wait_for_scan(&m.mnt);
    let reversed: Vec<&PathBuf> = s.files.iter().rev().collect();
    for epoch in 1..=2 {
        let out = std::process::Command::new("cat")
            .args(reversed.iter().map(|rel| m.path(rel)))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let want: Vec<u8> = (reversed.iter())
            .flat_map(|rel| std::fs::read(s.src.join(rel)).unwrap())
            .collect();
        assert!(
            out.stdout == want,
            "epoch {epoch} after the restart differs"
        );
        let st = stats(&m.mnt);
        assert_eq!(
            num(&st, "bytes_from_source"),
            (FILES / 4 * SIZE) as u64,
            "epoch {epoch}: {st}"
        );
        assert_eq!(
            num(&st, "cached_files"),
            FILES as u64 / 4,
            "epoch {epoch}: {st}"
        );
    }
    m.unmount();
}

#[test]
fn after_a_kill_corrupt_blocks_and_changed_files_are_read_again_not_served() {
    let s = setup();
    let m = s.mount(FILES, &[]);
    s.read_all(&m);
    wait_for_disk(&m, FILES as u64);
    let pid = m.kill();
    assert!(wait_for(Duration::from_secs(10), || !process_alive(pid)));
    drop(m);
    // A torn record at the end of the index, as a kill mid-append leaves it.
    let index = std::fs::OpenOptions::new()
        .append(true)
        .open(s.cache.join("index"))
        .unwrap();
    std::io::Write::write_all(&mut &index, &[0xa5; 40]).unwrap();
    // Flip bytes inside three blocks of the data file.
    let data = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(s.cache.join("data"))
        .unwrap();
    for block in [3u64, 17, 31] {
        let at = block * SIZE as u64 + 1000;
        let mut b = [0u8; 16];
        data.read_exact_at(&mut b, at).unwrap();
        b.iter_mut().for_each(|x| *x ^= 0xff);
        data.write_all_at(&b, at).unwrap();
    }
    // And one file changes in the source, keeping its size.
    std::fs::write(s.src.join(&s.files[5]), bytes(99, SIZE)).unwrap();

    // Room for the blocks read again: dropped blocks' space is not reused.
    let m = s.mount(2 * FILES, &[]);
    s.read_all(&m);
    let st = stats(&m.mnt);
    // Four blocks dropped (three corrupt, one stale) and read from the source; none served.
    assert_eq!(num(&st, "disk_dropped"), 4);
    assert_eq!(num(&st, "disk_hits"), FILES as u64 - 4);
    assert_eq!(num(&st, "bytes_from_source"), 4 * SIZE as u64);
    // The changed file was a miss at open; the three corrupt ones were hits that became misses.
    assert_eq!(num(&st, "hits"), FILES as u64 - 4);
    // They are written again, at the end, and served from disk on the next mount.
    wait_for_disk(&m, FILES as u64);
    m.unmount();
    let m = s.mount(2 * FILES, &[]);
    s.read_all(&m);
    let st = stats(&m.mnt);
    assert_eq!(num(&st, "disk_hits"), FILES as u64);
    assert_eq!(num(&st, "bytes_from_source"), 0);
    m.unmount();
}

#[test]
fn a_kill_in_the_middle_of_the_writes_leaves_nothing_torn_to_serve() {
    let s = setup();
    // Reads take 20 ms more each, so that reads and writes go on when the daemon is killed.
    let m = s.mount(FILES, &["--read-delay", "20ms"]);
    let mnt = m.mnt.clone();
    let files = s.files.clone();
    let reader = std::thread::spawn(move || {
        // Errors are expected once the daemon is gone.
        for rel in &files {
            if std::fs::read(mnt.join(rel)).is_err() {
                break;
            }
        }
    });
    // Killed once five blocks are on disk, while the reader goes on and more are written.
    assert!(wait_for(Duration::from_secs(20), || num(
        &stats(&m.mnt),
        "disk_cached_blocks"
    ) >= 5));
    let pid = m.kill();
    assert!(wait_for(Duration::from_secs(10), || !process_alive(pid)));
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(&m.mnt)
        .status();
    reader.join().unwrap();
    drop(m);
    assert!(
        std::fs::metadata(s.cache.join("data")).unwrap().len() < (FILES * SIZE) as u64,
        "killed after the last write"
    );
    // Whatever the kill cut short, the next daemon serves every file right, from the disk
    // where it has it whole and checked, else from the source.
    let m = s.mount(2 * FILES, &[]);
    s.read_all(&m);
    let st = stats(&m.mnt);
    let on_disk = num(&st, "disk_hits");
    assert!(on_disk >= 5, "{st}");
    assert_eq!(num(&st, "source_errors"), 0);
    assert_eq!(
        num(&st, "bytes_from_source") + num(&st, "bytes_from_disk"),
        (FILES * SIZE) as u64
    );
    // A second pass: every block on disk now, each checked once already.
    wait_for_disk(&m, FILES as u64);
    m.unmount();
    let m = s.mount(2 * FILES, &[]);
    s.read_all(&m);
    assert_eq!(num(&stats(&m.mnt), "bytes_from_source"), 0);
    m.unmount();
}

#[test]
fn large_files_in_blocks_empty_files_and_random_reads_come_back_the_same() {
    use std::os::unix::fs::FileExt;
    let dir = open_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // Sizes around the 1 MiB block and the page: last blocks of 1 byte, of a page and a bit,
    // of just under 64 KiB; an empty file.
    let sizes = [
        (1 << 20) * 5 + 1,
        (1 << 20) * 3 + 4097,
        (1 << 20) + 65535,
        4095,
        0,
        1,
    ];
    for (i, size) in sizes.iter().enumerate() {
        std::fs::write(src.join(format!("f{i}")), bytes(i as u64 + 7, *size)).unwrap();
    }
    let cache = dir.path().join("cache");
    let opts = [
        "--cache-size",
        "0",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--disk-cache-size",
        "1G",
    ];
    // Random reads at odd offsets, then every file whole: through the mount as in the source.
    let check = |m: &Mount| {
        let mut rng = 12345u64;
        for (i, size) in sizes.iter().enumerate() {
            let want = std::fs::read(src.join(format!("f{i}"))).unwrap();
            let f = std::fs::File::open(m.path(format!("f{i}"))).unwrap();
            for _ in 0..20 {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let at = (rng >> 33) as usize % (size + 1);
                let len = ((rng >> 13) as usize % 300_000).min(size - at);
                let mut buf = vec![0u8; len];
                f.read_exact_at(&mut buf, at as u64).unwrap();
                assert!(buf == want[at..at + len], "f{i} at {at} len {len}");
            }
            assert!(
                std::fs::read(m.path(format!("f{i}"))).unwrap() == want,
                "f{i}"
            );
        }
    };
    let m = Mount::new(&src, &opts);
    check(&m);
    // An empty file has nothing to read, and needs no block anywhere.
    let blocks: u64 = sizes.iter().map(|s| (*s as u64).div_ceil(1 << 20)).sum();
    wait_for_disk(&m, blocks);
    m.unmount();
    let m = Mount::new(&src, &opts);
    check(&m);
    let st = stats(&m.mnt);
    assert_eq!(num(&st, "bytes_from_source"), 0, "{st}");
    assert_eq!(num(&st, "disk_dropped"), 0, "{st}");
    m.unmount();
}

#[test]
fn a_smaller_disk_cache_size_at_a_remount_is_enforced_and_said() {
    // Filled to 40 files, remounted with room for 10: the blocks past the new size are
    // dropped at mount (the first 10 written are kept, as MinIO keeps the first that fit),
    // with a warning in the log; the data file shrinks to the new size and stays there.
    let s = setup();
    let m = s.mount(FILES, &[]);
    s.read_all(&m);
    wait_for_disk(&m, FILES as u64);
    assert_eq!(num(&stats(&m.mnt), "disk_used"), (FILES * SIZE) as u64);
    m.unmount();

    let log = s._dir.path().join("log");
    let small = FILES / 4;
    let m = s.mount(small, &["--log-file", log.to_str().unwrap()]);
    let st = stats(&m.mnt);
    assert_eq!(num(&st, "disk_capacity"), (small * SIZE) as u64, "{st}");
    assert_eq!(num(&st, "disk_used"), (small * SIZE) as u64, "{st}");
    assert_eq!(num(&st, "disk_cached_blocks"), small as u64, "{st}");
    assert_eq!(
        std::fs::metadata(s.cache.join("data")).unwrap().len(),
        (small * SIZE) as u64
    );
    s.read_all(&m);
    let st = stats(&m.mnt);
    assert_eq!(num(&st, "disk_hits"), small as u64, "{st}");
    assert_eq!(
        num(&st, "bytes_from_source"),
        ((FILES - small) * SIZE) as u64,
        "{st}"
    );
    assert!(num(&st, "disk_used") <= (small * SIZE) as u64, "{st}");
    m.unmount();
    let said = std::fs::read_to_string(&log).unwrap();
    let warned: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("--disk-cache-size"))
        .collect();
    assert_eq!(warned.len(), 1, "{said}");
    assert!(
        warned[0].contains("holds 2.5 MiB, more than --disk-cache-size 640 KiB: dropped the 30 blocks (1.9 MiB) past it"),
        "{said}"
    );

    // The same size again: nothing more to drop, the 10 blocks still served.
    let m = s.mount(small, &[]);
    let st = stats(&m.mnt);
    assert_eq!(num(&st, "disk_cached_blocks"), small as u64, "{st}");
    s.read_all(&m);
    assert_eq!(num(&stats(&m.mnt), "disk_hits"), small as u64);
    m.unmount();
}

#[test]
fn a_full_disk_turns_the_tier_off_and_reads_go_on() {
    let s = setup();
    // A 256 KiB filesystem for a disk tier told it may take 100 MiB.
    std::fs::create_dir(&s.cache).unwrap();
    let out = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs"])
        .arg(&s.cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _tmpfs = Unmount(&s.cache);
    let log = s._dir.path().join("log");
    let m = s.mount(1600, &["--log-file", log.to_str().unwrap()]);
    s.read_all(&m);
    assert!(wait_for(Duration::from_secs(10), || num(
        &stats(&m.mnt),
        "disk_enabled"
    ) == 0));
    let st = stats(&m.mnt);
    assert_eq!(num(&st, "source_errors"), 0);
    assert_eq!(num(&st, "bytes_from_source"), (FILES * SIZE) as u64);
    // The write that failed is the tier's fault, counted once (it stayed 0).
    assert_eq!(num(&st, "tier_errors"), 1, "{st}");
    // A second epoch is read from the source alone, right.
    s.read_all(&m);
    assert_eq!(num(&stats(&m.mnt), "tier_errors"), 1);
    m.unmount();
    let log = std::fs::read_to_string(&log).unwrap();
    let off: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("the disk tier is off"))
        .collect();
    assert_eq!(off.len(), 1, "{log}");
    assert!(off[0].contains("No space left on device"), "{log}");
}

#[test]
fn a_cache_directory_is_one_daemons_and_never_inside_the_dataset() {
    let s = setup();
    let m = s.mount(FILES, &[]);
    let pid = m.pid();
    let other = open_tempdir();
    let dir = s.cache.to_str().unwrap();
    let out = coorfs([
        OsStr::new("mount"),
        OsStr::new("--cache-dir"),
        OsStr::new(dir),
        s.src.as_os_str(),
        other.path().as_os_str(),
    ]);
    fails_with_line(
        &out,
        2,
        &format!("cache directory {dir} is in use by another coorfs daemon (pid {pid})"),
        "a second daemon",
    );
    m.unmount();
    let inside = s.src.join("cache");
    let out = coorfs([
        OsStr::new("mount"),
        OsStr::new("--cache-dir"),
        inside.as_os_str(),
        s.src.as_os_str(),
        other.path().as_os_str(),
    ]);
    fails_with_line(
        &out,
        2,
        &format!(
            "cache directory {} is inside the source or the mount point; coorfs never writes to the source",
            inside.display()
        ),
        "inside the source",
    );
    assert!(!inside.exists(), "the source was written to");
    let out = coorfs([
        OsStr::new("mount"),
        OsStr::new("--disk-cache-size"),
        OsStr::new("1G"),
        s.src.as_os_str(),
        other.path().as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--cache-dir"), "{}", stderr(&out));
}
