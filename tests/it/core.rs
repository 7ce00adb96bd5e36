//! The filesystem core, driven directly (no FUSE, no mount).

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use crate::common::bytes;
use coorfs::config::MountConfig;
use coorfs::fs::{Caller, DatasetFs, FsError};
use coorfs::namespace::{Attr, Kind, ROOT};
use coorfs::source::{FaultySource, LocalSource};

fn core_over(src: &Path) -> (DatasetFs, Arc<FaultySource<LocalSource>>) {
    let source = Arc::new(FaultySource::new(
        LocalSource::new(src.to_path_buf(), false).unwrap(),
    ));
    let config = MountConfig::new(src.to_path_buf(), "/nonexistent".into());
    (DatasetFs::new(source.clone(), &config).unwrap(), source)
}

/// How long a read through the core may take before the test calls it hung: far beyond
/// the slowest read here (a 200 ms injected delay).
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Reads through the core and waits for the answer.
fn read(fs: &DatasetFs, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, String> {
    let (tx, rx) = mpsc::channel();
    fs.read(
        fh,
        offset,
        size,
        Box::new(move |r| {
            let _ = tx.send(r.map(|b| b.to_vec()).map_err(|e| e.to_string()));
        }),
    );
    rx.recv_timeout(ANSWER_WITHIN).unwrap_or_else(|_| {
        panic!("a read of {size} bytes at {offset} got no answer within {ANSWER_WITHIN:?}")
    })
}

fn lookup_path(fs: &DatasetFs, rel: &str) -> u64 {
    let mut at = ROOT;
    for part in rel.split('/') {
        at = fs
            .lookup(at, OsStr::new(part), Caller::default())
            .unwrap()
            .attr
            .ino;
    }
    at
}

/// One entry of a listing as the core hands it out.
struct Listed {
    name: std::ffi::OsString,
    ino: u64,
    attr: Option<Attr>,
    ttl: Option<Duration>,
}

/// Reads directory handle `fh` from its start to its end as the kernel does: calls of at most
/// `page` entries (a reply buffer with room for that many), each resuming at the offset the
/// last entry of the one before gave.
fn read_listing(fs: &DatasetFs, (fh, ino): (u64, u64), plus: bool, page: usize) -> Vec<Listed> {
    let (mut listed, mut offset) = (Vec::new(), 0);
    loop {
        let mut chunk = Vec::new();
        fs.readdir((fh, ino, Caller::default()), offset, plus, |e| {
            if chunk.len() == page {
                return true;
            }
            chunk.push((
                e.next,
                Listed {
                    name: e.name.to_owned(),
                    ino: e.ino,
                    attr: e.attr,
                    ttl: e.ttl,
                },
            ));
            false
        })
        .unwrap();
        let Some(&(next, _)) = chunk.last() else {
            return listed;
        };
        offset = next;
        listed.extend(chunk.into_iter().map(|(_, l)| l));
    }
}

#[test]
fn lookup_getattr_and_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("d/f"), bytes(1, 10_000)).unwrap();
    std::fs::write(dir.path().join("d/g"), bytes(2, 100_000)).unwrap();
    let (fs, _) = core_over(dir.path());

    let d = fs
        .lookup(ROOT, OsStr::new("d"), Caller::default())
        .unwrap()
        .attr;
    assert_eq!(d.kind, Kind::Dir);
    let f = fs
        .lookup(d.ino, OsStr::new("f"), Caller::default())
        .unwrap()
        .attr;
    assert_eq!((f.kind, f.size), (Kind::File, 10_000));
    assert_eq!(fs.getattr(f.ino).unwrap(), f);
    assert!(matches!(
        fs.lookup(d.ino, OsStr::new("nope"), Caller::default()),
        Err(FsError::NotFound)
    ));
    assert!(matches!(
        fs.lookup(f.ino, OsStr::new("x"), Caller::default()),
        Err(FsError::NotDir)
    ));

    // A large file not cached yet: the kernel must not cache it either.
    let g = fs
        .lookup(d.ino, OsStr::new("g"), Caller::default())
        .unwrap()
        .attr;
    let large = fs.open(g.ino, libc::O_RDONLY, Caller::default()).unwrap();
    assert!(!large.keep_cache && large.direct_io && !large.changed);
    fs.release(large.fh);
    // A small one that the cache has room to keep whole: the kernel may cache what it reads
    // (and keeps nothing it had).
    let opened = fs.open(f.ino, libc::O_RDONLY, Caller::default()).unwrap();
    assert!(!opened.keep_cache && !opened.direct_io && !opened.changed);
    assert_eq!(
        read(&fs, opened.fh, 0, 4096).unwrap(),
        bytes(1, 10_000)[..4096]
    );
    assert_eq!(
        read(&fs, opened.fh, 9_000, 4096).unwrap(),
        bytes(1, 10_000)[9_000..]
    );
    assert_eq!(read(&fs, opened.fh, 20_000, 10).unwrap(), Vec::<u8>::new());
    fs.release(opened.fh);
    assert_eq!(read(&fs, opened.fh, 0, 1), Err("stale file handle".into()));
    // Now wholly cached: the kernel may keep its pages.
    let again = fs.open(f.ino, libc::O_RDONLY, Caller::default()).unwrap();
    assert!(again.keep_cache && !again.direct_io);

    for flags in [
        libc::O_WRONLY,
        libc::O_RDWR,
        libc::O_RDONLY | libc::O_TRUNC,
        libc::O_RDONLY | libc::O_APPEND,
    ] {
        assert!(matches!(
            fs.open(f.ino, flags, Caller::default()),
            Err(FsError::ReadOnly)
        ));
    }
    assert!(matches!(
        fs.open(d.ino, libc::O_RDONLY, Caller::default()),
        Err(FsError::IsDir)
    ));
}

#[test]
fn readdir_pages_resume_at_the_offset_they_return() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..1000 {
        std::fs::write(dir.path().join(format!("f{i:04}")), b"").unwrap();
    }
    let (fs, _) = core_over(dir.path());
    // Opened by the daemon, and by the kernel itself (handle 0: the listing is taken at its
    // first READDIR and kept for the rest).
    for (plus, opened) in [(false, true), (true, true), (false, false), (true, false)] {
        let fh = match opened {
            true => fs.opendir(ROOT, Caller::default()).unwrap(),
            false => 0,
        };
        // A reply buffer with room for 37 entries.
        let listed = read_listing(&fs, (fh, ROOT), plus, 37);
        assert!(listed.iter().all(|e| e.attr.is_some() == plus));
        let names: Vec<_> = listed.into_iter().map(|e| e.name).collect();
        fs.releasedir(fh);
        assert_eq!(names.len(), 1002);
        assert_eq!(names[0], ".");
        assert_eq!(names[1], "..");
        let mut files: Vec<_> = names[2..]
            .iter()
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        files.sort();
        let want: Vec<_> = (0..1000).map(|i| format!("f{i:04}")).collect();
        assert_eq!(files, want);
    }
}

#[test]
fn a_changed_source_file_is_detected_at_open() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"old").unwrap();
    let (fs, _) = core_over(dir.path());
    let ino = lookup_path(&fs, "f");
    let first = fs.open(ino, libc::O_RDONLY, Caller::default()).unwrap();
    assert!(!first.changed);
    let unread = fs.open(ino, libc::O_RDONLY, Caller::default()).unwrap();
    assert_eq!(read(&fs, first.fh, 0, 100).unwrap(), b"old");
    std::fs::write(dir.path().join("f"), b"new and longer").unwrap();
    // Rewritten in place (the same inode): a handle opened before reads what the file holds
    // now, as a local descriptor would, never the cached bytes of the old version.
    assert_eq!(
        read(&fs, unread.fh, 0, 100).unwrap(),
        b"new and longer",
        "the open file changed"
    );
    let second = fs.open(ino, libc::O_RDONLY, Caller::default()).unwrap();
    assert!(second.changed && !second.keep_cache && second.direct_io);
    assert_eq!(fs.getattr(ino).unwrap().size, 14);
    assert_eq!(read(&fs, second.fh, 0, 100).unwrap(), b"new and longer");
    // Replaced by a rename: the handle keeps reading the file it opened (uncached bytes
    // come from its open descriptor, since the path names another file now).
    std::fs::write(dir.path().join("g"), b"replacement").unwrap();
    std::fs::rename(dir.path().join("g"), dir.path().join("f")).unwrap();
    assert_eq!(read(&fs, second.fh, 0, 100).unwrap(), b"new and longer");
    let third = fs.open(ino, libc::O_RDONLY, Caller::default()).unwrap();
    assert!(third.changed);
    assert_eq!(read(&fs, third.fh, 0, 100).unwrap(), b"replacement");
    std::fs::remove_file(dir.path().join("f")).unwrap();
    assert_eq!(read(&fs, third.fh, 0, 100).unwrap(), b"replacement");
    assert!(matches!(
        fs.open(ino, libc::O_RDONLY, Caller::default()),
        Err(FsError::NotFound)
    ));
}

#[test]
fn source_errors_reach_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad"), b"data").unwrap();
    let (fs, source) = core_over(dir.path());
    *source.fail_paths_containing.lock() = Some("bad".into());
    let ino = lookup_path(&fs, "bad");
    let fh = fs.open(ino, libc::O_RDONLY, Caller::default()).unwrap().fh;
    // EIO, with its cause for the log (the errno map: tier::error's tests).
    assert_eq!(
        read(&fs, fh, 0, 10),
        Err("reading bad block 0: source: Input/output error (os error 5)".into())
    );
}

#[test]
fn a_fetch_that_panics_answers_eio_and_releases_its_block() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("boom"), bytes(3, 5000)).unwrap();
    let (fs, source) = core_over(dir.path());
    *source.panic_paths_containing.lock() = Some("boom".into());
    let ino = lookup_path(&fs, "boom");
    let fh = fs.open(ino, libc::O_RDONLY, Caller::default()).unwrap().fh;
    // EIO (the errno map: tier::error's tests).
    assert_eq!(
        read(&fs, fh, 0, 10),
        Err("reading boom block 0: the fetch panicked".into())
    );
    // The block leaves flight once its waiters have run (a read that comes meanwhile gets
    // their EIO too): then a read fetches it again, and gets it.
    *source.panic_paths_containing.lock() = None;
    let started = std::time::Instant::now();
    let got = loop {
        match read(&fs, fh, 0, 5000) {
            Ok(got) => break got,
            Err(e) if started.elapsed() < ANSWER_WITHIN => {
                assert_eq!(e, "reading boom block 0: the fetch panicked");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("the block is still in flight after {ANSWER_WITHIN:?}: {e}"),
        }
    };
    assert_eq!(got, bytes(3, 5000));
    assert_eq!(source.reads(), 2);
}

#[test]
fn symlinks_access_and_xattrs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    std::os::unix::fs::symlink("f", dir.path().join("l")).unwrap();
    let (fs, _) = core_over(dir.path());
    let l = lookup_path(&fs, "l");
    let f = lookup_path(&fs, "f");
    assert_eq!(fs.readlink(l).unwrap(), Path::new("f"));
    assert!(matches!(fs.readlink(f), Err(FsError::NotSymlink)));
    let root = Caller::default();
    assert!(fs.access(f, libc::R_OK, root).is_ok());
    assert!(matches!(
        fs.access(f, libc::W_OK, root),
        Err(FsError::ReadOnly)
    ));
    let nobody = Caller {
        pid: 1,
        uid: 65534,
        gid: 65534,
    };
    assert!(fs.access(f, libc::R_OK, nobody).is_ok());
    assert!(matches!(
        fs.access(f, libc::X_OK, nobody),
        Err(FsError::Access)
    ));
    assert!(matches!(
        fs.getxattr(f, OsStr::new("user.nope")),
        Err(FsError::NoAttr)
    ));
    assert!(fs.statfs().unwrap().bsize > 0);
}

#[test]
fn concurrent_misses_on_one_block_read_the_source_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), bytes(4, 50_000)).unwrap();
    let (fs, source) = core_over(dir.path());
    *source.read_delay.lock() = std::time::Duration::from_millis(200);
    let ino = lookup_path(&fs, "f");
    let (tx, rx) = mpsc::channel();
    for i in 0..8u64 {
        let fh = fs.open(ino, libc::O_RDONLY, Caller::default()).unwrap().fh;
        let tx = tx.clone();
        fs.read(
            fh,
            i * 1000,
            1000,
            Box::new(move |r| {
                let _ = tx.send((i, r.map(|b| b.to_vec()).map_err(|e| e.to_string())));
            }),
        );
    }
    for _ in 0..8 {
        let (i, got) = rx
            .recv_timeout(ANSWER_WITHIN)
            .expect("every concurrent read answered within ANSWER_WITHIN");
        assert_eq!(got.unwrap(), bytes(4, 50_000)[i as usize * 1000..][..1000]);
    }
    assert_eq!(source.reads(), 1);
}

#[test]
fn reads_across_blocks_are_assembled_and_a_full_cache_still_serves() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(6, 10_000);
    std::fs::write(dir.path().join("f"), &data).unwrap();
    let source = Arc::new(FaultySource::new(
        LocalSource::new(dir.path().to_path_buf(), false).unwrap(),
    ));
    let mut config = MountConfig::new(dir.path().to_path_buf(), "/nonexistent".into());
    config.cache.block_size = std::num::NonZeroU64::new(4096).unwrap();
    config.cache.capacity = 4096;
    let fs = DatasetFs::new(source.clone(), &config).unwrap();
    let ino = lookup_path(&fs, "f");
    let fh = fs.open(ino, libc::O_RDONLY, Caller::default()).unwrap().fh;
    // Blocks of 4096, 4096 and 1808 bytes; only one 4096-byte block fits in the cache.
    assert_eq!(read(&fs, fh, 0, 4096).unwrap(), data[..4096]);
    assert_eq!(source.reads(), 1);
    // Block 1 is refused by the full cache but kept as the handle's last block.
    assert_eq!(read(&fs, fh, 4096, 100).unwrap(), data[4096..4196]);
    assert_eq!(source.reads(), 2);
    // Across blocks 0 (cache) and 1 (last block): no source read.
    assert_eq!(read(&fs, fh, 4000, 200).unwrap(), data[4000..4200]);
    assert_eq!(source.reads(), 2);
    // Across all three: block 2 is fetched.
    assert_eq!(read(&fs, fh, 100, 9900).unwrap(), data[100..]);
    assert_eq!(source.reads(), 3);
    let snap = fs.snapshot();
    assert_eq!(
        snap.get(coorfs::stats::Stat::CachedBlocks),
        Some(coorfs::stats::Value::Count(1))
    );
    assert_eq!(
        snap.get(coorfs::stats::Stat::AdmissionsRefused),
        Some(coorfs::stats::Value::Count(2))
    );
}

#[test]
fn a_node_table_past_its_room_is_reported_by_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    crate::common::make_dataset(dir.path(), 300, 10, 3);
    let source = Arc::new(LocalSource::new(dir.path().to_path_buf(), false).unwrap());
    let mut config = MountConfig::new(dir.path().to_path_buf(), "/nonexistent".into());
    config.metadata_room = Some(1 << 20);
    let roomy = DatasetFs::new(source.clone(), &config).unwrap();
    roomy.scan();
    assert!(!roomy.metadata_over_room(), "300 entries fit in a MiB");
    config.metadata_room = Some(4096);
    let tight = DatasetFs::new(source, &config).unwrap();
    tight.scan();
    assert!(tight.metadata_over_room());
}

#[test]
fn the_scan_counts_every_file_of_a_wide_and_deep_tree() {
    // Directories wide (40 x 6 subdirectories) and deep (a chain of 40), so that the scan's
    // threads share a queue of directories that grows and shrinks while they walk.
    let dir = tempfile::tempdir().unwrap();
    let (mut files, mut total) = (0u64, 0u64);
    let mut put = |rel: &Path, len: usize| {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes(files, len)).unwrap();
        files += 1;
        total += len as u64;
    };
    for top in 0..40 {
        for sub in 0..6 {
            for f in 0..5 {
                let len = (top * 31 + sub * 7 + f) % 300;
                put(Path::new(&format!("w{top}/s{sub}/f{f}")), len);
            }
        }
    }
    let mut chain = std::path::PathBuf::from("deep");
    for level in 0..40 {
        chain.push(format!("d{level}"));
        put(&chain.join("f"), level + 1);
    }
    std::fs::create_dir_all(dir.path().join("empty/also-empty")).unwrap();
    let (fs, _) = core_over(dir.path());
    fs.scan();
    let snap = fs.snapshot();
    use coorfs::stats::{Stat, Value};
    assert_eq!(snap.get(Stat::ScanComplete), Some(Value::Count(1)));
    assert_eq!(snap.get(Stat::DatasetFiles), Some(Value::Count(files)));
    assert_eq!(snap.get(Stat::DatasetBytes), Some(Value::Count(total)));
}

#[test]
fn a_listing_read_in_chunks_names_every_entry_with_its_node() {
    // Two directories scanned one after the other, then a file added to the first: its node
    // comes after all of the second's, outside the first's run of consecutive nodes.
    let dir = tempfile::tempdir().unwrap();
    for d in ["a", "b"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
        for i in 0..300 {
            std::fs::write(dir.path().join(format!("{d}/f{i}")), bytes(i, 10)).unwrap();
        }
    }
    let (fs, _) = core_over(dir.path());
    fs.scan();
    std::fs::write(dir.path().join("a/late"), b"x").unwrap();
    let me = Caller::default();
    let a = fs.lookup(ROOT, OsStr::new("a"), me).unwrap().attr.ino;
    let fh = fs.opendir(a, me).unwrap();
    // Seven entries a call, as a kernel buffer that fills would take them.
    let listed = read_listing(&fs, (fh, a), false, 7);
    fs.releasedir(fh);
    let mut names: Vec<_> = listed.iter().map(|e| e.name.clone()).collect();
    names.sort();
    let mut want: Vec<_> = std::fs::read_dir(dir.path().join("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .chain([".".into(), "..".into()])
        .collect();
    want.sort();
    assert_eq!(names, want);
    for Listed { name, ino, .. } in &listed {
        let node = match name.to_str() {
            Some(".") => a,
            Some("..") => ROOT,
            _ => fs.lookup(a, name, me).unwrap().attr.ino,
        };
        assert_eq!(*ino, node, "{name:?}");
    }
}

/// Every entry of directory `dir` as `readdirplus` hands it out, but `.` and `..`: name,
/// permission bits and how long the kernel may keep them (None: the whole `--metadata-ttl`).
fn listing_plus(fs: &DatasetFs, dir: u64) -> Vec<(String, u16, Option<Duration>)> {
    let fh = fs.opendir(dir, Caller::default()).unwrap();
    let listed = read_listing(fs, (fh, dir), true, usize::MAX);
    fs.releasedir(fh);
    let mut out: Vec<_> = listed
        .into_iter()
        .filter(|e| e.name != "." && e.name != "..")
        .map(|e| {
            let attr = e.attr.expect("readdirplus carries attributes");
            (e.name.to_string_lossy().into_owned(), attr.perm, e.ttl)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_directory_unchanged_since_the_scan_is_listed_from_it_and_a_changed_one_from_the_source() {
    let dir = tempfile::tempdir().unwrap();
    for d in ["same", "added", "removed"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
        for i in 0..20 {
            std::fs::write(dir.path().join(format!("{d}/f{i:02}")), bytes(i, 10)).unwrap();
        }
    }
    // A directory changed within the last second is listed from the source every time
    // (its change time could not tell a later change from the scan's); let them settle.
    std::thread::sleep(Duration::from_millis(1100));
    let (fs, _) = core_over(dir.path());
    fs.scan();
    let me = Caller::default();
    let node = |d: &str| fs.lookup(ROOT, OsStr::new(d), me).unwrap().attr.ino;
    // chmod changes the file, not its directory.
    let private: std::fs::Permissions = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    for d in ["same", "added", "removed"] {
        std::fs::set_permissions(dir.path().join(format!("{d}/f00")), private.clone()).unwrap();
    }
    std::fs::write(dir.path().join("added/late"), b"x").unwrap();
    std::fs::remove_file(dir.path().join("removed/f19")).unwrap();
    let day = Duration::from_secs(86_400);

    // Unchanged: the scan's names and attributes (f00 as scanned, 0644), for what is left of
    // the day the metadata TTL allows since the scan.
    let same = listing_plus(&fs, node("same"));
    let names: Vec<String> = (0..20).map(|i| format!("f{i:02}")).collect();
    assert_eq!(same.iter().map(|e| e.0.clone()).collect::<Vec<_>>(), names);
    assert_eq!(same[0].1, 0o644, "f00's attributes are the scan's");
    for (name, _, ttl) in &same {
        let ttl = ttl.unwrap_or_else(|| panic!("{name}: no TTL of its own"));
        assert!(
            ttl < day && ttl > day - Duration::from_secs(60),
            "{name}: {ttl:?}"
        );
    }

    // Changed: what the source holds now, each entry freshly stat'ed.
    let added = listing_plus(&fs, node("added"));
    let mut want: Vec<String> = names.clone();
    want.push("late".into());
    assert_eq!(added.iter().map(|e| e.0.clone()).collect::<Vec<_>>(), want);
    assert_eq!((added[0].1, added[0].2), (0o600, None));
    let removed = listing_plus(&fs, node("removed"));
    assert_eq!(
        removed.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
        names[..19]
    );
    assert_eq!((removed[0].1, removed[0].2), (0o600, None));
}

#[test]
fn a_listing_with_attributes_hands_out_every_entry_with_its_attributes_from_any_offset() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..100 {
        std::fs::write(dir.path().join(format!("f{i:03}")), bytes(i, 10)).unwrap();
    }
    let (fs, _) = core_over(dir.path());
    fs.scan();
    // Every entry with its attributes (the kernel then opens each without a LOOKUP), as far
    // as the reply has room: here for all.
    let fh = fs.opendir(ROOT, Caller::default()).unwrap();
    let mut all = Vec::new();
    fs.readdir((fh, ROOT, Caller::default()), 0, true, |e| {
        all.push((e.name.to_owned(), e.attr.map(|a| a.size), e.next));
        false
    })
    .unwrap();
    fs.releasedir(fh);
    assert_eq!(all.len(), 102);
    assert!(all.iter().skip(2).all(|(_, size, _)| *size == Some(10)));
    let mut names: Vec<_> = all.iter().map(|(n, _, _)| n.clone()).collect();
    names.sort();
    let mut want: Vec<std::ffi::OsString> = (0..100).map(|i| format!("f{i:03}").into()).collect();
    want.extend([".".into(), "..".into()]);
    want.sort();
    assert_eq!(names, want);
    // A reply that filled up goes on where it stopped: every name once, with attributes.
    let fh = fs.opendir(ROOT, Caller::default()).unwrap();
    let mut first = Vec::new();
    fs.readdir((fh, ROOT, Caller::default()), 0, true, |e| {
        first.push((e.name.to_owned(), e.next));
        first.len() == 40
    })
    .unwrap();
    let mut rest = Vec::new();
    fs.readdir(
        (fh, ROOT, Caller::default()),
        first.last().unwrap().1,
        true,
        |e| {
            rest.push((e.name.to_owned(), e.attr.map(|a| a.size)));
            false
        },
    )
    .unwrap();
    fs.releasedir(fh);
    assert_eq!(first.len() + rest.len(), 102);
    assert!(rest.iter().all(|(_, size)| *size == Some(10)));
}

#[test]
fn every_stats_snapshot_taken_under_load_has_hits_plus_misses_equal_reads() {
    // Two readers open files as fast as they can (half of them read whole, so cached, and
    // hits from then on; the other half opened only, misses each time) while the stats are
    // read again and again, as `coorfs stats` and the attribute read them: each snapshot
    // must add up. A snapshot read `misses` apart from `reads` and `hits`, which an open
    // counts one after the other: 2 of 3,687 snapshots under load did not add up.
    const FILES: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    for i in 0..FILES {
        std::fs::write(dir.path().join(format!("f{i:02}")), bytes(i as u64, 1000)).unwrap();
    }
    let (fs, _) = core_over(dir.path());
    let inos: Vec<u64> = (0..FILES)
        .map(|i| lookup_path(&fs, &format!("f{i:02}")))
        .collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (mut snapshots, mut bad) = (0u64, Vec::new());
    std::thread::scope(|s| {
        for reader in 0..2u32 {
            let (fs, inos, stop) = (&fs, &inos, &stop);
            s.spawn(move || {
                let caller = Caller {
                    pid: 1000 + reader,
                    ..Caller::default()
                };
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (i, ino) in inos.iter().enumerate() {
                        let o = fs.open(*ino, libc::O_RDONLY, caller).unwrap();
                        if i % 2 == 0 {
                            assert_eq!(read(fs, o.fh, 0, 4096).unwrap(), bytes(i as u64, 1000));
                        }
                        fs.release(o.fh);
                    }
                }
            });
        }
        let started = std::time::Instant::now();
        while snapshots < 2000 || started.elapsed() < Duration::from_secs(3) {
            let raw = fs.getxattr(ROOT, OsStr::new("user.coorfs.stats")).unwrap();
            let s: serde_json::Value = serde_json::from_slice(&raw).unwrap();
            let n = |k: &str| s[k].as_u64().unwrap();
            if n("hits") + n("misses") != n("reads") {
                bad.push((n("reads"), n("hits"), n("misses")));
            }
            snapshots += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(
        bad.is_empty(),
        "{} of {snapshots} snapshots with hits + misses != reads, e.g. (reads, hits, misses) {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    let s = fs.snapshot();
    let get = |stat| match s.get(stat) {
        Some(coorfs::stats::Value::Count(n)) => n,
        other => panic!("{other:?}"),
    };
    let (reads, hits) = (
        get(coorfs::stats::Stat::Reads),
        get(coorfs::stats::Stat::Hits),
    );
    assert!(hits > 0 && reads > hits, "reads {reads}, hits {hits}");
}
