//! The cache directory's formats: the index log's records (72 bytes each, checksummed),
//! its header, and what a record names (a block of a version of a file, where it is in the
//! data file).

use super::*;

pub(super) const MAGIC: &[u8; 8] = b"COORFSD1";
/// The files of a cache directory.
pub(super) const FILES: [&str; 3] = ["data", "index", "lock"];
/// The index's header: the magic and the block size.
pub(super) const HEADER: u64 = 16;
/// One index record.
pub(super) const RECORD: usize = 72;
/// The length of a tombstone record.
pub(super) const TOMBSTONE: u32 = u32::MAX;

/// What a block was read from: the source file's version, without the device (a device
/// number can change across reboots; the inode, size and times do not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Version {
    pub(super) ino: u64,
    pub(super) size: u64,
    pub(super) mtime_ns: i64,
    pub(super) ctime_ns: i64,
}

impl From<&FileVersion> for Version {
    fn from(v: &FileVersion) -> Self {
        Version {
            ino: v.ino,
            size: v.size,
            mtime_ns: v.mtime_ns,
            ctime_ns: v.ctime_ns,
        }
    }
}

/// Where a block's bytes are in `data`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Extent {
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) crc: u32,
}

/// One block on disk.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub(super) version: Version,
    pub(super) extent: Extent,
    /// Its checksum was checked (or computed) since the directory was opened.
    pub(super) checked: bool,
}

/// A block: the hash of its file's path, and its number.
pub(super) type Key = (u64, u64);

/// The hash of a path of the dataset whose root's own hash is `seed`: datasets mounted in
/// turn over one cache directory keep apart.
pub(super) fn path_hash(seed: u64, rel: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    xxhash_rust::xxh3::xxh3_64_with_seed(rel.as_os_str().as_bytes(), seed)
}

/// One index record, as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) key: Key,
    pub(super) version: Version,
    pub(super) extent: Extent,
}

impl Record {
    /// The record that drops block `key`: a restart does not load it again.
    pub(super) fn tombstone(key: Key) -> Record {
        Record {
            key,
            version: Version::default(),
            extent: Extent {
                len: TOMBSTONE,
                ..Extent::default()
            },
        }
    }

    pub(super) fn encode(&self) -> [u8; RECORD] {
        let mut r = [0u8; RECORD];
        let fields: [u64; 8] = [
            self.key.0,
            self.key.1,
            self.version.ino,
            self.version.size,
            self.version.mtime_ns as u64,
            self.version.ctime_ns as u64,
            self.extent.offset,
            u64::from(self.extent.len) | (u64::from(self.extent.crc) << 32),
        ];
        for (i, f) in fields.iter().enumerate() {
            r[i * 8..i * 8 + 8].copy_from_slice(&f.to_le_bytes());
        }
        let crc = crc32c::crc32c(&r[..64]);
        r[64..68].copy_from_slice(&crc.to_le_bytes());
        r
    }

    /// The record in `r`, unless its checksum says it is torn.
    pub(super) fn decode(r: &[u8]) -> Option<Record> {
        let crc = u32::from_le_bytes(r[64..68].try_into().ok()?);
        if crc32c::crc32c(&r[..64]) != crc {
            return None;
        }
        let f = |i: usize| u64::from_le_bytes(r[i * 8..i * 8 + 8].try_into().unwrap());
        Some(Record {
            key: (f(0), f(1)),
            version: Version {
                ino: f(2),
                size: f(3),
                mtime_ns: f(4) as i64,
                ctime_ns: f(5) as i64,
            },
            extent: Extent {
                offset: f(6),
                len: f(7) as u32,
                crc: (f(7) >> 32) as u32,
            },
        })
    }
}

/// The index log's header for blocks of `blocks`.
pub(super) fn header(blocks: BlockSize) -> [u8; HEADER as usize] {
    let mut header = [0u8; HEADER as usize];
    header[..8].copy_from_slice(MAGIC);
    header[8..].copy_from_slice(&blocks.get().to_le_bytes());
    header
}
