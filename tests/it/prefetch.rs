//! Jobs, per-job epochs, prefetch and order hints, through real mounts. The slow storage is a
//! second coorfs mount with `--policy none --no-prefetch --read-delay`, as in the benchmarks.

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::common::*;

/// A dataset behind a mount that delays every read by `delay`, like network storage.
struct SlowStorage {
    _dir: tempfile::TempDir,
    slow: Mount,
}

fn slow_storage(files: usize, size: usize, delay: &str) -> SlowStorage {
    let dir = open_tempdir();
    let data = dir.path().join("data");
    make_dataset(&data, files, size, 10);
    let slow = Mount::new(
        &data,
        &["--policy", "none", "--no-prefetch", "--read-delay", delay],
    );
    SlowStorage { _dir: dir, slow }
}

/// Runs `coorfs read` in a process group of its own; returns the child (its pid is the group).
fn reader(args: &[&str], dir: &Path) -> std::process::Child {
    Command::new(bin())
        .arg("read")
        .args(args)
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap()
}

/// Waits for a `coorfs read` started by [`reader`] (at most [`COMMAND_LIMIT`]).
fn wait_read(child: std::process::Child) -> std::process::ExitStatus {
    wait_within(child, COMMAND_LIMIT, "coorfs read").status
}

#[test]
fn two_concurrent_jobs_each_keep_their_own_epochs() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_dataset(&src, 300, 4096, 3);
    let m = Mount::new(&src, &[]);
    wait_for_scan(&m.mnt);
    let a = reader(&["--procs", "2", "--epochs", "3", "--seed", "1"], &m.mnt);
    let b = reader(&["--procs", "3", "--epochs", "2", "--seed", "2"], &m.mnt);
    let (pa, pb) = (a.id(), b.id());
    assert!(wait_read(a).success() && wait_read(b).success());
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "active_jobs"), 2, "{s}");
    for (pgid, epochs) in [(pa, 3), (pb, 2)] {
        let j = job_of(&s, pgid);
        let records = j["epochs"].as_array().unwrap();
        assert_eq!(records.len(), epochs, "{j}");
        for (i, r) in records.iter().enumerate() {
            assert_eq!(num(r, "epoch"), i as u64 + 1);
            assert_eq!((num(r, "files"), num(r, "reads")), (300, 300), "{r}");
            assert_eq!(num(r, "hits") + num(r, "misses"), 300);
            assert_eq!(r["complete"], true, "{r}");
        }
        // Every epoch completed by reading everything: the next one has not begun.
        assert_eq!(num(j, "epoch"), epochs as u64 + 1);
    }
    assert_eq!(num(&s, "reads"), 300 * 5);
    let table = coorfs([OsStr::new("stats"), m.mnt.as_os_str()]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(&format!("job pgid {pa} (active, epoch 4")),
        "{table}"
    );
    assert!(
        table.contains(&format!("job pgid {pb} (active, epoch 3")),
        "{table}"
    );
    m.unmount();
}

#[test]
fn prefetch_reads_every_file_once_per_epoch_and_wastes_nothing() {
    const FILES: usize = 400;
    const SIZE: usize = 16 * 1024;
    // 10 ms a read: storage plainly bound by latency on a loaded machine. At 2 ms the CPU
    // time of busy CPUs is a large part of each read and too few files were staged now and
    // then (CI: 104 of 300; one run in 15 beside two CPU hogs: 86).
    let storage = slow_storage(FILES, SIZE, "10ms");
    // A quarter of the dataset fits in the cache (16 KiB is a multiple of the arena's
    // alignment, so exactly 100 files do).
    let m = Mount::new(
        &storage.slow.mnt,
        &["--cache-size", &(FILES / 4 * SIZE).to_string()],
    );
    wait_for_scan(&m.mnt);
    let r = reader(&["--procs", "2", "--epochs", "3"], &m.mnt);
    let pgid = r.id();
    assert!(wait_read(r).success());
    let s = stats(&m.mnt);
    let j = job_of(&s, pgid);
    let cached = num(&s, "cached_files");
    assert_eq!(cached, FILES as u64 / 4, "{s}");
    let uncached = FILES as u64 - cached;
    let records = j["epochs"].as_array().unwrap();
    // A block in flight when epoch 3 ended lands for the job's next epoch, which then has a
    // record, with no read yet.
    assert!(
        records.len() == 3 || (records.len() == 4 && num(&records[3], "reads") == 0),
        "{s}"
    );
    for r in &records[..3] {
        let epoch = num(r, "epoch");
        assert_eq!(r["complete"], true, "{s}");
        assert_eq!(num(r, "prefetched_unused"), 0, "epoch {epoch}: {r}");
        if epoch > 1 {
            // Exactly the uncached files come from storage: none twice.
            assert_eq!(
                num(r, "bytes_from_source"),
                uncached * SIZE as u64,
                "epoch {epoch}: {r}"
            );
            // From its 4th file (1% of 400) the prefetcher stages the 300 uncached files, 16
            // at a time (10 ms each: about 190 ms for all) while the two readers take 10 ms a
            // miss: it serves all but the few they reach first (262-278 measured with two
            // CPU hogs beside the test), at most every one. At least half.
            let staged = num(r, "staging_hits");
            assert!(
                (uncached / 2..=uncached).contains(&staged),
                "epoch {epoch}: {staged} of {uncached} uncached files staged: {r}"
            );
        }
    }
    assert_eq!(num(&s, "prefetched_unused"), 0);
    assert_eq!(num(&s, "source_errors"), 0);
    m.unmount();
    storage.slow.unmount();
}

#[test]
fn with_an_order_hint_reads_of_uncached_files_hit_the_staging_area() {
    const FILES: usize = 600;
    // 10 ms a read: storage plainly bound by latency even on a loaded machine. At 1 ms the
    // CPU time of three processes on two busy CPUs grew each read with the reads in flight,
    // the pacer judged the storage bandwidth-bound and narrowed to one read (CI: 381 of 600
    // staged).
    let storage = slow_storage(FILES, 8 * 1024, "10ms");
    // No cache at all (a budget no file fits in; --cache-size 0 is refused): every file comes
    // from storage, through the staging area if the prefetcher is in time.
    let m = Mount::new(
        &storage.slow.mnt,
        &[
            "--cache-size",
            "1",
            "--prefetch-depth",
            "64",
            "--prefetch-memory",
            "64M",
        ],
    );
    wait_for_scan(&m.mnt);
    let r = reader(&["--procs", "1", "--epochs", "3", "--hint"], &m.mnt);
    let pgid = r.id();
    assert!(wait_read(r).success());
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "hints_accepted"), 3, "{s}");
    let j = job_of(&s, pgid);
    let epochs = j["epochs"].as_array().unwrap();
    let bytes = (FILES * 8 * 1024) as u64;
    for r in &epochs[..3] {
        let (staged, misses) = (num(r, "staging_hits"), num(r, "misses"));
        assert_eq!(misses, FILES as u64);
        // The hint names every file: all but the one the reader opens first are prefetched.
        assert!(num(r, "prefetched_files") >= FILES as u64 - 1, "{r}");
        // 64 reads of 10 ms in flight bring 6,400 files a second; a reader of staged files
        // goes faster and waits for the reads in flight now and then (measured with three
        // runs at once on two CPUs: 529-600 of 600 staged). Most are staged.
        assert!(
            staged >= misses * 3 / 4,
            "epoch {}: {staged} of {misses} staged: {r}",
            num(r, "epoch")
        );
        assert_eq!(num(r, "prefetched_unused"), 0);
        // A file an epoch reads first that the last one read moments before is a hit of the
        // kernel's page cache: the block prefetched for it waits for the next epoch, with its
        // bytes. No epoch counts more than its files.
        let read = num(r, "bytes_from_source");
        assert!(
            read <= bytes && read as f64 >= 0.95 * bytes as f64,
            "{read} bytes from the source for {bytes}: {r}"
        );
    }
    // No file read twice in a round, and every byte read counted in an epoch of the job.
    assert_eq!(s["source_reads_per_file"].as_f64(), Some(1.0), "{s}");
    let counted: u64 = epochs.iter().map(|r| num(r, "bytes_from_source")).sum();
    assert_eq!(counted, num(&s, "bytes_from_source"), "{j}");
    m.unmount();
    storage.slow.unmount();
}

#[test]
fn bad_hints_are_rejected_with_clear_errnos_and_reads_go_on() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 50, 1000, 2);
    let log = dir.path().join("coorfs.log");
    let m = Mount::new(&src, &["--log-file", log.to_str().unwrap()]);
    wait_for_scan(&m.mnt);
    let order = m.path(".coorfs-order");
    let send = |text: &[u8]| -> Result<(), i32> {
        coorfs::reader::send_hint(&m.mnt, text).map_err(|e| e.raw_os_error().unwrap())
    };
    let good: Vec<u8> = rels
        .iter()
        .flat_map(|r| format!("{}\n", r.display()).into_bytes())
        .collect();
    assert_eq!(send(&good), Ok(()));
    assert_eq!(
        send(b"c000/f000000.bin\nno/such/file.bin\n"),
        Err(libc::ENOENT)
    );
    assert_eq!(send(b"c000/f000000.bin\nbin\0ary\xff\n"), Err(libc::EINVAL));
    assert_eq!(send(b"c000\n"), Err(libc::EINVAL), "a directory");
    assert_eq!(send(b"../../etc/passwd\n"), Err(libc::EINVAL));
    assert_eq!(send(b"\n\n"), Err(libc::EINVAL), "nothing");
    assert_eq!(send(&vec![b'a'; 70 << 20]), Err(libc::EFBIG));
    // The order file reads as empty, takes no writes (the mount is read-only) and is not
    // listed; any other ioctl on it is no terminal's.
    assert_eq!(std::fs::read(&order).unwrap(), b"");
    let err = std::fs::write(&order, &good).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let f = std::fs::File::open(&order).unwrap();
    // SAFETY: TCGETS on an open descriptor, into a termios the size the kernel expects.
    let rc = unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&f), libc::TCGETS, &mut t)
    };
    assert_eq!(
        (rc, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::ENOTTY))
    );
    drop(f);
    assert!(
        !std::fs::read_dir(&m.mnt)
            .unwrap()
            .any(|e| e.unwrap().file_name() == ".coorfs-order")
    );

    // Reads are undisturbed.
    for (i, rel) in rels.iter().enumerate() {
        let n: usize = rel.file_stem().unwrap().to_str().unwrap()[1..]
            .parse()
            .unwrap();
        assert_eq!(
            std::fs::read(m.path(rel)).unwrap(),
            bytes(n as u64, 1000),
            "{i}"
        );
    }
    let s = stats(&m.mnt);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        (num(&s, "hints_accepted"), num(&s, "hints_rejected")),
        (1, 6),
        "{s}\n{text}"
    );
    m.unmount();
    assert!(
        text.contains(
            "order hint rejected: line 2: \"no/such/file.bin\" is not a file of the dataset"
        ),
        "{text}"
    );
    assert!(
        text.contains("order hint rejected: line 2: a NUL byte"),
        "{text}"
    );
}

/// Runs `cat` on `files` (paths below the mount) in a process group of its own.
fn cat(m: &Mount, files: impl IntoIterator<Item = String>) {
    let paths: Vec<_> = files.into_iter().map(|rel| m.path(rel)).collect();
    let out = output_within(
        Command::new("cat").args(&paths).process_group(0),
        COMMAND_LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The dataset file `i` of `make_dataset` with 10 classes.
fn file(i: usize) -> String {
    format!("c{:03}/f{i:06}.bin", i % 10)
}

#[test]
fn a_first_epoch_is_prefetched_from_its_start_where_the_whole_dataset_fits_in_the_cache() {
    // Storage whose reads do not queue (2 ms each, however many), below what counts as
    // remote: a file prefetched that the job might not read (a guess) is kept by the cache,
    // which has room for every file, so the prefetcher reads ahead once the epoch is under
    // way, not only once the job has read half the dataset.
    const FILES: usize = 600;
    const SIZE: usize = 4096;
    let storage = slow_storage(FILES, SIZE, "2ms");
    let m = Mount::new(
        &storage.slow.mnt,
        &["--cache-size", &(4 * FILES * SIZE).to_string()],
    );
    wait_for_scan(&m.mnt);
    let r = reader(&["--procs", "1", "--epochs", "1", "--seed", "3"], &m.mnt);
    let pgid = r.id();
    assert!(wait_read(r).success());
    let s = stats(&m.mnt);
    let epoch1 = &job_of(&s, pgid)["epochs"][0];
    assert_eq!(num(epoch1, "reads"), FILES as u64, "{epoch1}");
    // Without guesses the first 300 files and more were read on demand: at most half hit.
    let hits = num(epoch1, "hits");
    assert!(hits >= FILES as u64 * 3 / 4, "{hits} hits of {FILES}: {s}");
    assert_eq!(s["source_reads_per_file"].as_f64(), Some(1.0), "{s}");
    assert_eq!(num(&s, "cached_files"), FILES as u64, "{s}");
    m.unmount();
}

#[test]
fn a_glance_at_a_file_prefetches_nothing() {
    const FILES: usize = 300;
    const SIZE: usize = 64 * 1024;
    let dir = open_tempdir();
    let src = dir.path().join("src");
    make_dataset(&src, FILES, SIZE, 10);
    let log = dir.path().join("coorfs.log");
    // One job for everyone (uid), so that the glance at the end joins a job that has read
    // the whole dataset in an epoch: even then, one file is no epoch under way.
    let m = Mount::new(
        &src,
        &[
            "--cache-size",
            "1",
            "--job-key",
            "uid",
            "--log-file",
            log.to_str().unwrap(),
        ],
    );
    wait_for_scan(&m.mnt);
    let glance = |m: &Mount, i: usize| {
        let out = output_within(
            Command::new("head")
                .args(["-c", "100"])
                .arg(m.path(file(i))),
            COMMAND_LIMIT,
        );
        assert!(out.status.success(), "{}", stderr(&out));
        // The prefetcher wakes at once on a miss; give it time to do the wrong thing.
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    glance(&m, 7);
    let s = stats(&m.mnt);
    assert_eq!(num(&s, "prefetched_blocks"), 0, "{s}");
    assert_eq!(num(&s, "staging_bytes"), 0, "{s}");
    assert_eq!(
        num(&s, "bytes_from_source"),
        SIZE as u64,
        "one file, not the dataset: {s}"
    );

    // A whole epoch, then another glance.
    let r = reader(&["--procs", "2", "--epochs", "1"], &m.mnt);
    assert!(wait_read(r).success());
    let before = stats(&m.mnt);
    assert_eq!(before["jobs"][0]["epoch"], 2, "{before}");
    glance(&m, 8);
    let s = stats(&m.mnt);
    assert_eq!(
        num(&s, "prefetched_blocks"),
        num(&before, "prefetched_blocks"),
        "{s}"
    );
    // What the prefetcher staged for epoch 2 as epoch 1 ended, before the glance, may still
    // wait there (it did once); the glance staged nothing more.
    assert!(
        num(&s, "staging_bytes") <= num(&before, "staging_bytes"),
        "{s} {before}"
    );
    assert_eq!(
        num(&s, "bytes_from_source") - num(&before, "bytes_from_source"),
        SIZE as u64,
        "{s}"
    );
    m.unmount();
    // The prefetch window's changes are DEBUG lines, not INFO.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("prefetch window"), "{text}");
}

#[test]
fn a_job_that_stops_reading_has_its_staging_released_within_seconds() {
    const FILES: usize = 400;
    // 20 ms a read: the prefetcher (4 in flight) stages about 200 files a second, and the
    // job leaves 360 unread.
    let storage = slow_storage(FILES, 8192, "20ms");
    // Nothing cached (a budget no file fits in; --cache-size 0 is refused): only staging.
    // One job for everyone, so that `coorfs read` and `cat` are one job; it is forgotten
    // only after the default --job-idle-timeout of 10 minutes.
    let m = Mount::new(
        &storage.slow.mnt,
        &[
            "--cache-size",
            "1",
            "--prefetch-depth",
            "4",
            "--job-key",
            "uid",
        ],
    );
    wait_for_scan(&m.mnt);
    // A whole epoch shows that the job reads the dataset; then 40 files of the next one, and
    // the job stops. They are the last 40 in inode order, the order the prefetcher reads in,
    // so that it fetches none of them while the job reads them.
    let r = reader(&["--procs", "4", "--epochs", "1"], &m.mnt);
    assert!(wait_read(r).success());
    let mut by_inode: Vec<(u64, usize)> = (0..FILES)
        .map(|i| {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::symlink_metadata(storage.slow.mnt.join(file(i))).unwrap();
            (meta.ino(), i)
        })
        .collect();
    by_inode.sort();
    cat(&m, by_inode[FILES - 40..].iter().map(|(_, i)| file(*i)));
    let stopped = std::time::Instant::now();
    let s = stats(&m.mnt);
    assert_eq!(s["jobs"][0]["epoch"], 2, "{s}");
    assert!(
        num(&s, "staging_bytes") > 0,
        "prefetch of epoch 2 began: {s}"
    );
    // Released within seconds (5 s without a read, and a tick), the job still live.
    assert!(
        wait_for(std::time::Duration::from_secs(20), || {
            num(&stats(&m.mnt), "staging_bytes") == 0
        }),
        "{}",
        stats(&m.mnt)
    );
    let released = stopped.elapsed();
    assert!(
        released < std::time::Duration::from_secs(8),
        "released after {released:?}"
    );
    let s = stats(&m.mnt);
    assert_eq!(s["jobs"][0]["active"], true, "{s}");
    let prefetched = num(&s, "prefetched_blocks");
    // What could be prefetched at all, one block a file: in epoch 1 only once the job has
    // read clearly more than half of the files (more than 200 + SPAN, src/jobs/mod.rs
    // `reads_the_dataset`), so at most the 135 it had not read then; in epoch 2 at most the
    // 360 it left unread. Nothing after it stopped, nothing twice.
    let (epoch1, epoch2) = (&s["jobs"][0]["epochs"][0], &s["jobs"][0]["epochs"][1]);
    let first_most = (FILES - (FILES / 2 + coorfs::epoch::SPAN as usize + 1)) as u64;
    let second_most = (FILES - 40) as u64;
    assert!(
        num(epoch1, "prefetched_files") <= first_most,
        "at most {first_most} in epoch 1: {s}"
    );
    assert!(
        num(epoch2, "prefetched_files") <= second_most,
        "at most {second_most} in epoch 2: {s}"
    );
    assert_eq!(
        prefetched,
        num(epoch1, "prefetched_files") + num(epoch2, "prefetched_files"),
        "{s}"
    );
    assert!(
        prefetched <= first_most + second_most,
        "prefetch stopped: {s}"
    );
    // Every file staged for epoch 2 (one block each) was dropped unused.
    assert_eq!(num(epoch2, "epoch"), 2, "{s}");
    assert!(num(epoch2, "prefetched_unused") > 0, "{s}");
    assert_eq!(
        num(epoch2, "prefetched_unused"),
        num(epoch2, "prefetched_files"),
        "{s}"
    );
    assert_eq!(
        num(epoch2, "prefetched_unused"),
        num(&s, "prefetched_unused"),
        "{s}"
    );
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(num(&stats(&m.mnt), "prefetched_blocks"), prefetched);
    m.unmount();
    storage.slow.unmount();
}

#[test]
fn small_files_are_prefetched_in_batches_and_read_back_as_stored() {
    const FILES: usize = 600;
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, FILES, 3000, 6);
    // Half of them on the disk only (read with O_DIRECT), half in the page cache (read
    // through it): the batch chooses per file, as a read one by one does.
    evict_pages(&src);
    for rel in rels.iter().step_by(2) {
        std::fs::read(src.join(rel)).unwrap();
    }
    let m = Mount::new(&src, &[]);
    wait_for_scan(&m.mnt);
    // Prefetches wait for a batch only once demand reads have shown the storage fast (under
    // 1 ms on average, the first read's own time at first). A cold virtual disk can take
    // milliseconds for a first read with O_DIRECT (a CI run's did), so a few files the page
    // cache holds are read first: the storage is measured fast, as it is.
    for rel in rels.iter().step_by(2).take(8) {
        assert_eq!(
            std::fs::read(m.mnt.join(rel)).unwrap(),
            std::fs::read(src.join(rel)).unwrap()
        );
    }
    let r = reader(&["--procs", "1", "--epochs", "1"], &m.mnt);
    assert!(wait_read(r).success());
    let s = stats(&m.mnt);
    // Every file read from the source once, by the prefetcher or its reader; what the
    // prefetcher read was read in batches (this source reads small files together), all of
    // it while demand reads answer fast (279-600 of 600 prefetched, beside CPU burners).
    assert_eq!(num(&s, "bytes_from_source"), (FILES * 3000) as u64, "{s}");
    assert_eq!(s["source_reads_per_file"].as_f64(), Some(1.0), "{s}");
    let (batched, prefetched) = (num(&s, "batched_reads"), num(&s, "prefetched_blocks"));
    assert!(
        batched > 0 && batched <= prefetched,
        "{batched} read in batches of {prefetched} prefetched: {s}"
    );
    assert_eq!(num(&s, "source_errors"), 0, "{s}");
    // What the batches read is what the files hold (a second epoch: every file a hit).
    assert_reads_the_source(&m, &rels);
    assert_eq!(
        num(&stats(&m.mnt), "bytes_from_source"),
        (FILES * 3000) as u64
    );
    m.unmount();
}
