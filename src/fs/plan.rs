//! How a file is opened, decided apart from doing it: [`open_plan`] takes what the file is,
//! what the tiers hold of it and the mount's choices, and says how the kernel is to read the
//! open; `open.rs` gathers the facts and carries the plan out. Pure, so every branch is tested
//! here without a mount.
//!
//! The two questions, in order (the reasons are `open.rs`'s header):
//! 1. May the kernel read the file by itself, from a backing file (FUSE passthrough)? The
//!    cache's own file of a wholly cached file; or the source file of a miss the cache will not
//!    keep, that no tier below, member, other job or prefetched block wants the daemon to read.
//! 2. Otherwise, or if the inode's other opens refuse it: through the kernel's page cache (may
//!    it keep the pages? are they dropped at release?) or asking the daemon for every read
//!    (direct I/O)?

/// Misses of files up to this size are read through the kernel's page cache while the cache
/// has room to keep them whole (see `DatasetFs::kernel_caching` (`open.rs`)). Round trips are most of
/// what a small file costs: 128,000 files of 200-600 B, `--cache-size 1G`, `coorfs read
/// --procs 2`, 3 rounds of an A/B on this 2-CPU machine: the cold epoch took 10.2-14.8 s
/// (median 11.6) against 14.1-14.5 s through direct I/O, and the first hot epoch 1.9-2.3 s
/// against 3.2 s (its pages were in the kernel already). A larger file's bytes, not its
/// round trips, are its cost, and the page cache would hold a second copy of them.
pub const BUFFERED_MISS_MAX: u64 = 64 << 10;

/// Misses of files of at least this size (shards: WebDataset and MDS tars, TFRecords, LitData
/// chunks) are read through the kernel's page cache, whatever the cache keeps of them, and
/// their pages are dropped when the open is released, so that they never outlive the read
/// (see `DatasetFs::kernel_caching` (`open.rs`)). Shard readers read 8-64 KiB at a time (tarfile,
/// TFRecord): through direct I/O each such read was a round trip to the daemon (8 shards of
/// 12 MiB read by `webdataset`: 7,558 READs of 13 KiB on average, 7.2 s against 0.48 s
/// natively); through the page cache the kernel's readahead asks for up to 1 MiB a READ, many
/// in flight, and the small reads are served from its pages. Below this size (ImageNet-like
/// files) a file is read whole in one or two READs, and direct I/O saves a second copy.
/// A job whose reads of such files are large ([`OpenFacts::reads_large`]) reads them with
/// direct I/O instead ([`DaemonRead::DirectStream`]) where the daemon reads ahead itself
/// ([`OpenPolicy::reads_ahead`]).
pub const STREAMED_MISS_MIN: u64 = 4 << 20;

/// The first READ of a streamed miss through the page cache is the kernel's first readahead
/// window, which it sizes from the reader's first read: four times it, rounded up to a power
/// of two, while that is at most a 32nd of the readahead (`--readahead`, 16 MiB as root), else
/// twice it. A READ carries 1 MiB at most: a first READ of 1 MiB says the reader's first read
/// was more than 128 KiB (with a readahead of 1 MiB, where the daemon cannot raise it: more
/// than 256 KiB).
pub const LARGE_FIRST_READ: u32 = 1 << 20;

/// Through direct I/O the READs are the reader's own reads (split where the buffer's pages
/// pass 1 MiB): a mean of up to this size says its job reads small pieces after all. The same
/// bound as [`LARGE_FIRST_READ`]'s, so that a reader is not sent back and forth.
pub const SMALL_READ: u32 = 128 << 10;

/// What an open decides from: the file, and what the tiers hold of it now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFacts {
    /// The file's size.
    pub size: u64,
    /// It changed since the kernel was last told its attributes.
    pub changed: bool,
    /// The source file is a local descriptor the kernel could read (not an object's body).
    pub local: bool,
    /// The scan knows the file (it has a file id).
    pub known: bool,
    /// Every byte of it is in the memory cache.
    pub in_memory: bool,
    /// Every byte of it is in memory or the disk tier: nothing is read from below.
    pub hit: bool,
    /// The memory cache has its own file of it for the kernel (passthrough of a hit).
    pub kernel_file: bool,
    /// The memory cache holds part of it.
    pub partly_cached: bool,
    /// The prefetcher staged blocks of it for this open, or a fetch of its first is under way.
    pub prefetched: bool,
    /// The cache would keep a file of its size whole (a policy that never evicts, with room).
    pub would_keep: bool,
    /// The memory cache has room for it now.
    pub room: bool,
    /// It is big ([`STREAMED_MISS_MIN`] or more), and the page cache holds every page of the
    /// source file (a directory source): the kernel reads it from there as fast as natively.
    pub source_resident: bool,
    /// The job that opens it read the last such file in large pieces ([`LARGE_FIRST_READ`],
    /// [`SMALL_READ`]): asked only of a file of [`STREAMED_MISS_MIN`] or more.
    pub reads_large: bool,
    // (`partly_cached`, `prefetched`, `would_keep` and `room` decide only for a file not in
    // memory: the plan asks none of them of a file that is, so an open of one need not look.)
}

/// The mount's choices and state that an open decides by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenPolicy {
    /// The kernel may read files by itself (FUSE passthrough is on).
    pub passthrough: bool,
    /// There is a cache of ours (not `--policy none`).
    pub caches: bool,
    /// The daemon's reads of a miss feed something below: a disk tier with room, or the
    /// cluster's members.
    pub feeds_below: bool,
    /// The kernel keeps the pages it is given until they are read again (the gauge of
    /// `kernel_cache.rs`).
    pub kernel_keeps: bool,
    /// The gauge's answer for a hit on this file: its pages may be kept (a sentinel always).
    pub keep_hit: bool,
    /// The daemon's own reads keep a reader of a streamed file with one read in flight going
    /// (`Fetcher::streams_a_part`): an object store, read in parts, whose one stream brings a
    /// part in a request's wait. A directory source's blocks are read one by one, and only the
    /// kernel's readahead keeps several in flight: through direct I/O a reader of 1 MiB reads
    /// of big files with 2 ms a read took 3x as long. Nor from a store whose streams are slow
    /// (a cloud's): there the kernel's readahead window has parts read side by side; shards
    /// from S3 paced at 100 MiB/s a stream in a 384 MiB pod, epoch 1, took 3.35-3.38 s through
    /// direct I/O against 2.53 s through the page cache.
    pub reads_ahead: bool,
}

/// The file the kernel reads by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFile {
    /// The memory cache's own file of it.
    Cached,
    /// The source file.
    Source,
}

/// How the kernel reads an open that it does not read by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DaemonRead {
    /// Through its page cache: `keep` its pages from earlier opens (`keep_cache`), and drop
    /// them when the open is released (a streamed shard's pages must not outlive the read).
    PageCache { keep: bool, drop_at_release: bool },
    /// Every read asks the daemon (`direct_io`).
    Direct,
    /// As `Direct`, for a streamed miss whose job reads large pieces: each reply goes straight
    /// into the reader's buffer, with no page of the kernel's to fill, copy out and drop (a
    /// boto3-like loop of 1 MiB reads over 8 objects of 64 MiB from S3: about a fifth less
    /// CPU and time). Its reads are watched: small ones send the job's next opens back
    /// through the page cache.
    DirectStream,
}

/// What [`open_plan`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenPlan {
    /// The file the kernel should read by itself, if the inode's other opens allow it.
    pub backing: Option<KernelFile>,
    /// How it reads otherwise.
    pub read: DaemonRead,
    /// A sentinel of the kernel-cache gauge is watched on this open.
    pub watch: bool,
}

/// How an open of a file with `facts` is read under `policy`. `others_need` says whether
/// another job will read the file soon; it is asked only when the answer matters.
pub fn open_plan(
    facts: &OpenFacts,
    policy: &OpenPolicy,
    others_need: impl FnOnce() -> bool,
) -> OpenPlan {
    let (read, watch) = daemon_read(facts, policy);
    OpenPlan {
        backing: kernel_file(facts, policy, others_need),
        read,
        watch,
    }
}

/// The backing file the kernel may read the open from by itself, if any.
fn kernel_file(
    f: &OpenFacts,
    policy: &OpenPolicy,
    others_need: impl FnOnce() -> bool,
) -> Option<KernelFile> {
    if !policy.passthrough || f.changed {
        return None;
    }
    if f.in_memory {
        return f.kernel_file.then_some(KernelFile::Cached);
    }
    // The daemon's own reads feed the disk tier, the cluster's members, and the other jobs
    // that read the file this round; what the prefetcher staged, or anyone is reading now,
    // would be read twice; a file the cache holds part of is served that part from the cache
    // (by passthrough every byte of it came from the source again). A shard the source's page
    // cache holds whole is read from there even if the cache would keep it: through the
    // daemon it crossed it twice, at a fifth of native speed (8 WebDataset shards of 12 MiB:
    // 0.19-0.26 s against 0.02-0.05 s); the cache takes it once the page cache lost it.
    let source = f.local
        && !f.hit
        && !policy.feeds_below
        && !f.partly_cached
        && !f.prefetched
        && (!f.would_keep || f.source_resident)
        && f.known
        && !others_need();
    source.then_some(KernelFile::Source)
}

/// How the kernel reads through the daemon, and whether the gauge watches the open.
fn daemon_read(f: &OpenFacts, policy: &OpenPolicy) -> (DaemonRead, bool) {
    let page_cache = |keep| DaemonRead::PageCache {
        keep,
        drop_at_release: !keep && f.size >= STREAMED_MISS_MIN,
    };
    // A file that changed since the kernel was told is read with direct I/O: the kernel's
    // size may be the old one until the invalidation lands, and a page-cache read that came
    // back short while it landed would be padded with zeros up to that old size.
    if !policy.caches {
        let read = if f.changed {
            DaemonRead::Direct
        } else {
            page_cache(true)
        };
        return (read, false);
    }
    let hit = f.known && f.in_memory && !f.changed;
    let keep = hit && policy.keep_hit;
    // A large miss streams through the kernel's page cache (readahead, small reads served
    // from its pages), dropped at release; straight to the reader where its job reads large.
    if !keep && !f.changed && f.size >= STREAMED_MISS_MIN {
        let read = if f.reads_large && policy.reads_ahead {
            DaemonRead::DirectStream
        } else {
            page_cache(false)
        };
        return (read, hit);
    }
    // A small miss the cache will keep whole may enter the kernel's page cache: it is about
    // to be a file of the cache, and its pages are then right (one READ instead of two, and
    // the next epoch finds them there). A sentinel read this way is watched.
    if f.known
        && !keep
        && !f.changed
        && f.size <= BUFFERED_MISS_MAX
        && policy.kernel_keeps
        && f.room
    {
        return (page_cache(false), true);
    }
    // Direct I/O costs a small hit more than the page cache it saves (two READs, the reader's
    // buffer pinned): a small hit is read through the page cache even when not kept.
    let small_hit = f.in_memory && !f.changed && f.size <= BUFFERED_MISS_MAX;
    let read = if keep || small_hit {
        page_cache(keep)
    } else {
        DaemonRead::Direct
    };
    (read, hit)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: u64 = 20 << 10;
    const MEDIUM: u64 = 1 << 20;
    const SHARD: u64 = 64 << 20;

    fn cached(size: u64) -> OpenFacts {
        OpenFacts {
            size,
            local: true,
            known: true,
            in_memory: true,
            hit: true,
            kernel_file: true,
            ..Default::default()
        }
    }

    fn miss(size: u64) -> OpenFacts {
        OpenFacts {
            size,
            local: true,
            known: true,
            ..Default::default()
        }
    }

    fn mount() -> OpenPolicy {
        OpenPolicy {
            passthrough: true,
            caches: true,
            kernel_keeps: true,
            keep_hit: true,
            ..Default::default()
        }
    }

    fn plan(f: OpenFacts, p: OpenPolicy) -> OpenPlan {
        open_plan(&f, &p, || false)
    }

    fn no_passthrough() -> OpenPolicy {
        OpenPolicy {
            passthrough: false,
            ..mount()
        }
    }

    const KEEP: DaemonRead = DaemonRead::PageCache {
        keep: true,
        drop_at_release: false,
    };
    const FRESH: DaemonRead = DaemonRead::PageCache {
        keep: false,
        drop_at_release: false,
    };
    const STREAMED: DaemonRead = DaemonRead::PageCache {
        keep: false,
        drop_at_release: true,
    };

    #[test]
    fn a_cached_file_is_read_by_the_kernel_from_the_cache_s_own_file() {
        let p = plan(cached(MEDIUM), mount());
        assert_eq!(p.backing, Some(KernelFile::Cached));
        assert_eq!(p.read, KEEP, "if the inode refuses passthrough: kept pages");
        // Without the cache's own file of it (not yet written): through the daemon.
        let f = OpenFacts {
            kernel_file: false,
            ..cached(MEDIUM)
        };
        assert_eq!(plan(f, mount()).backing, None);
    }

    #[test]
    fn a_miss_nobody_else_wants_is_read_by_the_kernel_from_the_source() {
        assert_eq!(
            plan(miss(MEDIUM), mount()).backing,
            Some(KernelFile::Source)
        );
        // Each reason for the daemon to read it itself.
        let daemon_reads = [
            OpenFacts {
                local: false,
                ..miss(MEDIUM)
            },
            OpenFacts {
                hit: true,
                ..miss(MEDIUM)
            },
            OpenFacts {
                partly_cached: true,
                ..miss(MEDIUM)
            },
            OpenFacts {
                prefetched: true,
                ..miss(MEDIUM)
            },
            OpenFacts {
                would_keep: true,
                ..miss(MEDIUM)
            },
            OpenFacts {
                known: false,
                ..miss(MEDIUM)
            },
            OpenFacts {
                changed: true,
                ..miss(MEDIUM)
            },
        ];
        for f in daemon_reads {
            assert_eq!(plan(f, mount()).backing, None, "{f:?}");
        }
        let below = OpenPolicy {
            feeds_below: true,
            ..mount()
        };
        assert_eq!(plan(miss(MEDIUM), below).backing, None);
        assert_eq!(plan(miss(MEDIUM), no_passthrough()).backing, None);
        assert_eq!(open_plan(&miss(MEDIUM), &mount(), || true).backing, None);
    }

    #[test]
    fn a_shard_the_source_s_page_cache_holds_is_read_from_there_even_if_the_cache_would_keep_it() {
        let hot = OpenFacts {
            would_keep: true,
            source_resident: true,
            ..miss(SHARD)
        };
        assert_eq!(plan(hot, mount()).backing, Some(KernelFile::Source));
        // Cold, the cache takes it through the daemon.
        let cold = OpenFacts {
            source_resident: false,
            ..hot
        };
        assert_eq!(plan(cold, mount()).backing, None);
        // The other reasons for the daemon to read it still hold.
        for f in [
            OpenFacts {
                partly_cached: true,
                ..hot
            },
            OpenFacts {
                prefetched: true,
                ..hot
            },
            OpenFacts { hit: true, ..hot },
        ] {
            assert_eq!(plan(f, mount()).backing, None, "{f:?}");
        }
        let below = OpenPolicy {
            feeds_below: true,
            ..mount()
        };
        assert_eq!(plan(hot, below).backing, None);
        assert_eq!(open_plan(&hot, &mount(), || true).backing, None);
    }

    #[test]
    fn a_file_in_memory_is_planned_without_the_facts_of_a_miss() {
        for size in [SMALL, MEDIUM, SHARD] {
            for policy in [mount(), no_passthrough()] {
                let asked = OpenFacts {
                    partly_cached: true,
                    prefetched: true,
                    would_keep: true,
                    room: true,
                    ..cached(size)
                };
                assert_eq!(plan(asked, policy), plan(cached(size), policy), "{size}");
            }
        }
    }

    #[test]
    fn others_are_asked_only_when_it_matters() {
        let mut asked = false;
        open_plan(&cached(MEDIUM), &mount(), || {
            asked = true;
            false
        });
        open_plan(&miss(MEDIUM), &no_passthrough(), || {
            asked = true;
            false
        });
        assert!(!asked);
    }

    #[test]
    fn a_large_miss_streams_through_the_page_cache_and_is_dropped_at_release() {
        let p = plan(miss(SHARD), no_passthrough());
        assert_eq!((p.read, p.watch), (STREAMED, false));
        // Partly cached: the same, and the daemon serves the cached part.
        let f = OpenFacts {
            partly_cached: true,
            ..miss(SHARD)
        };
        assert_eq!(plan(f, mount()).read, STREAMED);
        // A cached shard whose pages the kernel does not keep streams too.
        let gauge_says_no = OpenPolicy {
            keep_hit: false,
            ..no_passthrough()
        };
        let p = plan(cached(SHARD), gauge_says_no);
        assert_eq!((p.read, p.watch), (STREAMED, true));
    }

    #[test]
    fn a_large_miss_of_a_job_that_reads_large_goes_straight_to_the_reader() {
        let large = |f: OpenFacts| OpenFacts {
            reads_large: true,
            ..f
        };
        // An object store's, read in parts by the daemon, one of whose streams brings a part
        // in a request's wait.
        let store = OpenPolicy {
            reads_ahead: true,
            ..no_passthrough()
        };
        assert_eq!(
            plan(large(miss(SHARD)), store).read,
            DaemonRead::DirectStream
        );
        let gauge_says_no = OpenPolicy {
            keep_hit: false,
            ..store
        };
        assert_eq!(
            plan(large(cached(SHARD)), gauge_says_no).read,
            DaemonRead::DirectStream
        );
        // A hit whose pages the kernel keeps keeps them; a changed file and a smaller one
        // are read as before; and a directory's, which only the kernel's readahead reads
        // ahead, or a slow store's, whose parts only the kernel's window reads side by side,
        // stream through the page cache.
        assert_eq!(plan(large(cached(SHARD)), store).read, KEEP);
        let changed = OpenFacts {
            changed: true,
            ..large(miss(SHARD))
        };
        assert_eq!(plan(changed, store).read, DaemonRead::Direct);
        assert_eq!(plan(large(miss(MEDIUM)), store).read, DaemonRead::Direct);
        assert_eq!(plan(large(miss(SHARD)), no_passthrough()).read, STREAMED);
    }

    #[test]
    fn a_small_miss_the_cache_will_keep_enters_the_page_cache_watched() {
        let f = OpenFacts {
            room: true,
            would_keep: true,
            ..miss(SMALL)
        };
        let p = plan(f, no_passthrough());
        assert_eq!((p.read, p.watch), (FRESH, true));
        // No room, or a kernel that drops pages: direct I/O.
        let no_room = OpenFacts { room: false, ..f };
        assert_eq!(plan(no_room, no_passthrough()).read, DaemonRead::Direct);
        let dropping = OpenPolicy {
            kernel_keeps: false,
            ..no_passthrough()
        };
        assert_eq!(plan(f, dropping).read, DaemonRead::Direct);
        // A medium miss: direct I/O, no second copy in the page cache.
        assert_eq!(
            plan(miss(MEDIUM), no_passthrough()).read,
            DaemonRead::Direct
        );
    }

    #[test]
    fn a_hit_keeps_its_pages_as_the_gauge_says() {
        let p = plan(cached(MEDIUM), no_passthrough());
        assert_eq!((p.read, p.watch), (KEEP, true));
        let gauge_says_no = OpenPolicy {
            keep_hit: false,
            kernel_keeps: false,
            ..no_passthrough()
        };
        assert_eq!(plan(cached(MEDIUM), gauge_says_no).read, DaemonRead::Direct);
        // A small hit is cheaper through the page cache even when its pages go.
        assert_eq!(plan(cached(SMALL), gauge_says_no).read, FRESH);
    }

    #[test]
    fn a_changed_file_is_read_with_direct_io() {
        for f in [cached(SMALL), miss(SHARD), miss(SMALL)] {
            let changed = OpenFacts { changed: true, ..f };
            let p = plan(changed, mount());
            assert_eq!(
                (p.backing, p.read, p.watch),
                (None, DaemonRead::Direct, false)
            );
        }
    }

    #[test]
    fn without_a_cache_the_kernel_s_page_cache_does_what_it_does() {
        let none = OpenPolicy {
            caches: false,
            ..no_passthrough()
        };
        assert_eq!(plan(miss(SHARD), none).read, KEEP);
        let changed = OpenFacts {
            changed: true,
            ..miss(SMALL)
        };
        assert_eq!(plan(changed, none).read, DaemonRead::Direct);
    }
}
