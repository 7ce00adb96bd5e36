//! Shards through a real mount: big files (WebDataset tars, TFRecords) read whole and in
//! sequence with small reads, shards in a shuffled order. Small reads cost no round trip each,
//! a shard the cache holds part of is read from the source only for the rest, and the byte
//! hit rate says what the per-file one cannot.

use std::io::Read;
use std::path::Path;

use crate::common::*;
use rand::SeedableRng;
use rand::seq::SliceRandom;

const SHARDS: usize = 6;
const SHARD: usize = 6 << 20;
/// What a tar reader asks for at a time.
const READ: usize = 16 << 10;

/// Shard `i` beneath `dir`.
fn shard(dir: &Path, i: usize) -> std::path::PathBuf {
    dir.join(format!("shard-{i:03}.tar"))
}

/// Reads every shard once, in a shuffled order fixed by `seed` ([`read_epoch_of`]).
fn read_epoch(mnt: &Path, seed: u64) {
    let mut order: Vec<usize> = (0..SHARDS).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    read_epoch_of(mnt, &order);
}

/// Reads shards `order` whole, in that order, with `READ`-byte reads, and checks every byte
/// against the source's.
fn read_epoch_of(mnt: &Path, order: &[usize]) {
    for &i in order {
        let mut f = std::fs::File::open(shard(mnt, i)).unwrap();
        let mut got = Vec::with_capacity(SHARD);
        let mut buf = vec![0; READ];
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == bytes(i as u64, SHARD), "shard {i} differs");
    }
}

/// Writes the shards, on disk and not in the page cache (see [`evict_pages`]).
fn make_shards(src: &Path) {
    std::fs::create_dir_all(src).unwrap();
    for i in 0..SHARDS {
        std::fs::write(shard(src, i), bytes(i as u64, SHARD)).unwrap();
    }
    evict_pages(src);
}

#[test]
fn shards_the_page_cache_holds_are_read_by_the_kernel_from_the_source_and_cached_once_evicted() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_shards(&src);
    // The page cache holds every shard: locked there, so that reclaim for the rest of a busy
    // machine cannot take a page of one before its open (which then reads it, rightly,
    // through the daemon).
    let held: Vec<(std::fs::File, memmap2::Mmap)> = (0..SHARDS)
        .map(|i| {
            let f = std::fs::File::open(shard(&src, i)).unwrap();
            // SAFETY: a private read-only mapping of a file nobody writes while the test runs.
            let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
            map.lock().expect("mlock (root may lock pages)");
            (f, map)
        })
        .collect();
    let m = Mount::new(&src, &["--no-prefetch", "--cache-size", "256M"]);
    wait_for_scan(&m.mnt);
    read_epoch(&m.mnt, 1);
    let s = stats(&m.mnt);
    // What the daemon's check (`cachestat`) says of each shard here, for a failure's message.
    let resident: Vec<bool> = (held.iter())
        .map(|(f, _)| coorfs::source::resident_open_file(f, SHARD as u64))
        .collect();
    drop(held);
    // The kernel read every shard from the source's pages: no READ reached the daemon, and
    // its cache, which had room for all, took none (the page cache holds them already).
    assert_eq!(
        num(&s, "passthrough_source_opens"),
        SHARDS as u64,
        "resident by cachestat: {resident:?}; {s}"
    );
    assert_eq!(num(&s, "read_requests"), 0, "{s}");
    assert_eq!(num(&s, "cached_bytes"), 0, "{s}");
    // Evicted, they are read through the daemon, which caches them; then they are hits.
    evict_pages(&src);
    read_epoch(&m.mnt, 2);
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "passthrough_source_opens"), SHARDS as u64, "{s}");
    assert_eq!(num(&s, "cached_bytes"), (SHARDS * SHARD) as u64, "{s}");
    read_epoch(&m.mnt, 3);
    let s = stats(&m.mnt);
    assert_eq!(s["epochs"][2]["hits"], SHARDS, "{s}");
    m.unmount();
}

#[test]
fn a_reader_of_part_of_a_shard_is_counted_the_bytes_it_read_not_the_whole_shard() {
    use std::io::{Seek, SeekFrom};
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_shards(&src);
    let m = Mount::new(&src, &["--no-prefetch", "--cache-size", "256M"]);
    wait_for_scan(&m.mnt);
    // Random access into a big file, as readers of one HDF5, LMDB or Parquet file do: 64 KiB
    // at 3 MiB of one shard, and the rest of the shard never read.
    {
        let mut f = std::fs::File::open(m.mnt.join("shard-000.tar")).unwrap();
        f.seek(SeekFrom::Start(3 << 20)).unwrap();
        let mut got = vec![0; 64 << 10];
        f.read_exact(&mut got).unwrap();
        assert!(got[..] == bytes(0, SHARD)[3 << 20..(3 << 20) + (64 << 10)]);
    }
    // The open counted the whole shard; its release, which reaches the daemon after the
    // close, takes back what was not read.
    wait_for(std::time::Duration::from_secs(5), || {
        num(&stats(&m.mnt), "bytes_read") < SHARD as u64
    });
    let s = stats(&m.mnt);
    let read = num(&s, "bytes_read");
    // What the kernel asked for: the 64 KiB, and at most what it read ahead of them.
    assert!(
        (64 << 10..=1 << 20).contains(&read),
        "{read} bytes read: {s}"
    );
    assert_eq!(s["epochs"][0]["bytes_read"], read, "{s}");
    // The daemon read the block that holds them, 1 MiB: more than was read, and no hit.
    assert_eq!(num(&s, "bytes_from_source"), 1 << 20, "{s}");
    assert_eq!(s["byte_hit_rate"], 0.0, "{s}");
    // A shard read whole counts whole.
    let before = read;
    read_epoch_of(&m.mnt, &[1]);
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "bytes_read") - before, SHARD as u64, "{s}");
    m.unmount();
}

#[test]
fn partly_cached_shards_read_only_their_uncached_bytes_and_small_reads_are_no_round_trip_each() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_shards(&src);
    // Room for two shards and a part of a third: MinIO keeps the blocks it admitted.
    let cache = (2 * SHARD + SHARD / 2).to_string();
    let m = Mount::new(&src, &["--no-prefetch", "--cache-size", &cache]);
    wait_for_scan(&m.mnt);
    let dataset = (SHARDS * SHARD) as u64;

    read_epoch(&m.mnt, 1);
    let s = stats(&m.mnt);
    // Epoch 1: the dataset once, and the reader's 16 KiB reads reached the daemon as the
    // kernel's readahead, about a READ per MiB (2,304 reads of 16 KiB were made).
    assert_eq!(num(&s, "bytes_from_source"), dataset, "{s}");
    let reads = num(&s, "read_requests");
    assert!(reads <= 2 * (dataset >> 20), "{reads} READs for 36 MiB");
    let cached = num(&s, "cached_bytes");
    assert!(
        cached > 2 * SHARD as u64 && cached < 3 * SHARD as u64,
        "a shard is cached in part: {cached}"
    );

    for epoch in 2..=3 {
        let before = num(&stats(&m.mnt), "bytes_from_source");
        read_epoch(&m.mnt, epoch);
        let s = stats(&m.mnt);
        let read = num(&s, "bytes_from_source") - before;
        // Exactly what the cache lacks: no byte of a partly cached shard twice.
        assert_eq!(read, dataset - cached, "epoch {epoch}: {s}");
        let e = &s["epochs"][epoch as usize - 1];
        let byte_hit = e["byte_hit_rate"].as_f64().unwrap();
        let want = cached as f64 / dataset as f64;
        assert!(
            (byte_hit - want).abs() < 1e-3,
            "{byte_hit} against {want}: {e}"
        );
        // Per file, only the whole shards are hits. The daemon read each uncached block of
        // the partly cached shard once; the kernel read the others by passthrough.
        assert_eq!(num(e, "hits"), 2, "{e}");
        let partly = (SHARD as u64 - cached % SHARD as u64) >> 20;
        assert_eq!(num(e, "source_reads"), partly, "{e}");
    }
    let text = String::from_utf8(coorfs(["stats".as_ref(), m.mnt.as_os_str()]).stdout).unwrap();
    assert!(text.contains("byte hit"), "{text}");
    m.unmount();
}

/// The shards on disk, mounted so that every read streams through the kernel's page cache to
/// the daemon (no prefetch, no passthrough, a cache of 1 MiB); and their temporary directory,
/// to keep while the mount lives.
fn streamed_mount() -> (tempfile::TempDir, Mount) {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_shards(&src);
    let m = Mount::new(
        &src,
        &["--no-prefetch", "--no-passthrough", "--cache-size", "1M"],
    );
    (dir, m)
}

#[test]
fn a_streamed_shard_leaves_no_page_behind_in_the_kernel() {
    // A shard read through the kernel's page cache (so that its small reads are served from
    // there) has its pages dropped when it is closed: left there, the kernel's LRU would push
    // out what the cache serves.
    let (_dir, m) = streamed_mount();
    wait_for_scan(&m.mnt);
    let path = m.mnt.join("shard-000.tar");
    // Every open without keep_cache drops the file's pages, so they are looked at through a
    // mapping of a descriptor opened before the read, not by opening the file again.
    let watcher = std::fs::File::open(&path).unwrap();
    // SAFETY: a private read-only mapping, only its residency is asked.
    let map = unsafe { memmap2::Mmap::map(&watcher) }.unwrap();
    let resident = || {
        let mut vec = vec![0u8; map.len().div_ceil(4096)];
        // SAFETY: `map` is live for `map.len()` bytes; `vec` has a byte per page.
        let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 == 1).count()
    };
    {
        let mut f = std::fs::File::open(&path).unwrap();
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        assert!(got == bytes(0, SHARD));
        // While it is open its pages are there: that is how small reads are served.
        assert!(resident() > SHARD / 4096 / 2, "{} pages", resident());
    }
    // The release reaches the daemon after the close, and the invalidation after that.
    assert!(
        wait_for(std::time::Duration::from_secs(5), || resident() == 0),
        "{} pages left",
        resident()
    );
    drop(map);
    drop(watcher);
    m.unmount();
}

#[test]
fn two_readers_of_streamed_shards_do_not_find_the_connection_congested() {
    // Two readers of 16 MiB readahead windows ask for 32 READs at once, 16 of them in flight:
    // a connection the kernel deems congested drops each readahead window it has just put in
    // the page cache, and reads those pages again later. The mount asks for a threshold of
    // two readers' windows, above the 16 in flight (fusectl shows what the kernel took), and
    // streamed shards are read as stored.
    let (_dir, m) = streamed_mount();
    let connections = Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(connections).map_or(true, |mut d| d.next().is_none()) {
        let mounted = std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(connections)
            .status()
            .unwrap();
        assert!(mounted.success(), "fusectl: {mounted}");
    }
    let dev = std::os::linux::fs::MetadataExt::st_dev(&std::fs::metadata(&m.mnt).unwrap());
    let knob = |name: &str| {
        let path = connections.join(format!("{}/{name}", libc::minor(dev)));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        text.trim().parse::<u64>().unwrap()
    };
    assert_eq!(knob("max_background"), 16);
    assert_eq!(knob("congestion_threshold"), 32);
    std::thread::scope(|s| {
        for half in 0..2 {
            let mnt = &m.mnt;
            s.spawn(move || {
                for i in (half..SHARDS).step_by(2) {
                    let got = std::fs::read(shard(mnt, i)).unwrap();
                    assert!(got == bytes(i as u64, SHARD), "shard {i}");
                }
            });
        }
    });
    m.unmount();
}

#[test]
fn webdataset_and_tfrecord_readers_read_a_mount_as_the_source_and_cost_no_round_trip_a_read() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    shard_readers(&["make".as_ref(), src.as_os_str()]);
    let want = shard_readers(&["read".as_ref(), src.as_os_str(), "1".as_ref()]);
    assert_eq!(want["samples"], 300, "{want}");
    assert_eq!(want["records"], 240, "{want}");
    let dataset: u64 = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    // On disk, as a dataset nothing has read lately (the reads above brought it in).
    evict_pages(&src);
    // A third of the dataset: the cache keeps some shards whole and one in part.
    let cache = (dataset / 3).to_string();
    let m = Mount::new(&src, &["--no-prefetch", "--cache-size", &cache]);
    wait_for_scan(&m.mnt);
    let mut cached = 0;
    for epoch in 1..=3u64 {
        let before = stats(&m.mnt);
        let got = shard_readers(&[
            "read".as_ref(),
            m.mnt.as_os_str(),
            epoch.to_string().as_ref(),
        ]);
        assert_eq!(got, want, "epoch {epoch}: samples, records or bytes differ");
        let s = stats(&m.mnt);
        let from_source = num(&s, "bytes_from_source") - num(&before, "bytes_from_source");
        let requests = num(&s, "read_requests") - num(&before, "read_requests");
        // tarfile and the TFRecord loader read a few bytes to 200 KiB at a time (thousands
        // of reads); the kernel's readahead asks the daemon for about a MiB a READ.
        assert!(
            requests <= 2 * (dataset >> 20) + 20,
            "epoch {epoch}: {requests} READs for {} MiB",
            dataset >> 20
        );
        if epoch == 1 {
            assert_eq!(from_source, dataset, "epoch 1 reads the dataset once: {s}");
            cached = num(&s, "cached_bytes");
            assert!(cached > 0 && cached < dataset, "{s}");
        } else {
            assert_eq!(
                from_source,
                dataset - cached,
                "epoch {epoch}: the uncached bytes: {s}"
            );
        }
    }
    m.unmount();
}

/// `shard_readers.py epochs` over `dir` (seed 5, 3 epochs, 2 processes as DataLoader workers
/// split the shards), under `coorfs run` if `run`: one JSON report an epoch, and stderr.
fn webdataset_epochs(dir: &Path, run: bool) -> (Vec<serde_json::Value>, String) {
    use std::os::unix::process::CommandExt;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shard_readers.py");
    let program = if run { bin().into() } else { shard_python() };
    let mut cmd = std::process::Command::new(program);
    if run {
        cmd.args(["run".as_ref(), "--".as_ref(), shard_python().as_os_str()]);
    }
    let out = cmd
        .arg(script)
        .args([
            "epochs".as_ref(),
            dir.as_os_str(),
            "5".as_ref(),
            "3".as_ref(),
            "2".as_ref(),
        ])
        .process_group(0)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let reports = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (reports, stderr)
}

#[test]
fn webdataset_under_coorfs_run_hands_each_worker_s_shuffled_shards_to_the_mount() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    shard_readers(&["make".as_ref(), src.as_os_str()]);
    let (want, _) = webdataset_epochs(&src, false);
    let tars = std::fs::read_dir(&src)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().unwrap() == "tar")
        .count() as u64;
    // Room for a shard or two: the rest is read from the source every epoch, the next shards
    // staged ahead by the prefetcher as each worker's order says.
    let m = Mount::new(&src, &["--cache-size", "8M"]);
    wait_for_scan(&m.mnt);
    let (got, stderr) = webdataset_epochs(&m.mnt, true);
    // The same samples, and the shards in the same order: the hook changes no draw.
    assert_eq!(got, want);
    assert!(!stderr.contains("no order hint"), "{stderr}");
    let s = stats(&m.mnt);
    assert_eq!(
        num(&s, "hints_accepted"),
        3 * 2,
        "a hint per worker and epoch: {s}"
    );
    // Each worker's order joined its partner's: the job's epochs are the script's, each of
    // every shard (without the orders two workers' quick passes blur into one).
    let job = &s["jobs"].as_array().unwrap()[0];
    let epochs = job["epochs"].as_array().unwrap();
    let complete: Vec<u64> = epochs
        .iter()
        .filter(|e| e["complete"] == true)
        .map(|e| num(e, "files"))
        .collect();
    assert_eq!(complete, vec![tars; 3], "{job}");
    // The next shards streamed in while the current ones were read, and all were used in the
    // script's epochs (once the last ended, the prefetcher may guess at a fourth that never
    // comes: that one's are not the script's).
    assert!(
        num(&s, "prefetched_blocks") >= 3 * (tars - 2),
        "a block at least of each worker's next shard: {s}"
    );
    let unused: u64 = epochs
        .iter()
        .filter(|e| e["complete"] == true)
        .map(|e| num(e, "prefetched_unused"))
        .sum();
    assert_eq!(unused, 0, "{job}");
    m.unmount();
}
