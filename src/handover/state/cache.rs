//! The cache journal: every change to the memory cache's index, for a successor to find the
//! blocks the arena and the tmpfs it takes over hold.

use super::*;

/// Where a cached block is: a slot of the arena, or a range of a file on the cache's tmpfs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedAt {
    Arena {
        offset: u64,
        len: u64,
    },
    /// In the tmpfs file named `file` (a number), at `offset`.
    File {
        file: u64,
        offset: u64,
        len: u64,
    },
}

/// One change to the memory cache's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheRecord {
    Added {
        version: FileVersion,
        block: u64,
        at: CachedAt,
    },
    Removed {
        version: FileVersion,
        block: u64,
    },
}

/// Record layout (80 bytes): tag u64 (1 arena, 2 file, 3 removed), version (dev, ino, size,
/// mtime, ctime), block, then offset, len, file.
const CACHE_RECORD: usize = 80;
const CACHE_MAGIC: u64 = u64::from_le_bytes(*b"COORFSca");
const CACHE_VERSION: u64 = 1;
const CACHE_RESERVE: usize = 1 << 38;

/// Every change to the memory cache's index, in order: a successor replays it to find the
/// blocks the arena and the tmpfs it takes over hold. A record is written only once its block
/// is (the cache publishes after it copies), so a replayed block is whole.
#[derive(Debug)]
pub struct CacheJournal {
    log: Log,
}

impl CacheJournal {
    pub fn create() -> io::Result<CacheJournal> {
        let log = Log::create(
            "coorfs-cache-index",
            CACHE_RESERVE,
            CACHE_MAGIC,
            CACHE_VERSION,
        )?;
        Ok(CacheJournal { log })
    }

    pub fn open(fd: OwnedFd) -> io::Result<CacheJournal> {
        let log = Log::open(fd, CACHE_RESERVE, CACHE_MAGIC, CACHE_VERSION, "cache index")?;
        Ok(CacheJournal { log })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.log.region.fd.as_fd()
    }

    /// False once an append failed: a successor must not trust the journal.
    pub fn whole(&self) -> bool {
        self.log.whole()
    }

    pub fn append(&self, r: &CacheRecord) {
        let mut words = [0u64; CACHE_RECORD / 8];
        let (tag, version, block, rest) = match *r {
            CacheRecord::Added {
                version,
                block,
                at: CachedAt::Arena { offset, len },
            } => (1, version, block, [offset, len, 0]),
            CacheRecord::Added {
                version,
                block,
                at: CachedAt::File { file, offset, len },
            } => (2, version, block, [offset, len, file]),
            CacheRecord::Removed { version, block } => (3, version, block, [0; 3]),
        };
        words[0] = tag;
        words[1] = version.dev;
        words[2] = version.ino;
        words[3] = version.size;
        words[4] = version.mtime_ns as u64;
        words[5] = version.ctime_ns as u64;
        words[6] = block;
        words[7..10].copy_from_slice(&rest);
        let _g = self.log.append.lock();
        let Some(at) = self.log.room(CACHE_RECORD, "cache index journal") else {
            return;
        };
        let region = &self.log.region;
        for (i, w) in words.iter().enumerate() {
            // Past the committed length: nobody reads these words until the length moves.
            region
                .word(at as usize + i * 8)
                .store(*w, Ordering::Relaxed);
        }
        region
            .word(16)
            .store(at + CACHE_RECORD as u64, Ordering::Release);
    }

    /// Every committed record, in order.
    pub fn records(&self) -> io::Result<Vec<CacheRecord>> {
        let end = self.log.committed("cache index")?;
        if !(end - JOURNAL_START).is_multiple_of(CACHE_RECORD) {
            return Err(bad(format!("cache index: length {end} out of range")));
        }
        let mut out = Vec::with_capacity((end - JOURNAL_START) / CACHE_RECORD);
        let mut at = JOURNAL_START;
        while at < end {
            let w = |i: usize| self.log.region.word(at + i * 8).load(Ordering::Relaxed);
            let version = FileVersion {
                dev: w(1),
                ino: w(2),
                size: w(3),
                mtime_ns: w(4) as i64,
                ctime_ns: w(5) as i64,
            };
            let block = w(6);
            out.push(match w(0) {
                1 => CacheRecord::Added {
                    version,
                    block,
                    at: CachedAt::Arena {
                        offset: w(7),
                        len: w(8),
                    },
                },
                2 => CacheRecord::Added {
                    version,
                    block,
                    at: CachedAt::File {
                        offset: w(7),
                        len: w(8),
                        file: w(9),
                    },
                },
                3 => CacheRecord::Removed { version, block },
                t => return Err(bad(format!("cache index: record kind {t}"))),
            });
            at += CACHE_RECORD;
        }
        Ok(out)
    }

    /// Starts the journal again with `records` (what a successor kept of it), so that it does
    /// not grow with every daemon.
    pub fn rewrite(&self, records: &[CacheRecord]) {
        {
            let _g = self.log.append.lock();
            (self.log.region.word(16)).store(JOURNAL_START as u64, Ordering::Release);
        }
        for r in records {
            self.append(r);
        }
    }
}
