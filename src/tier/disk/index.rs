//! The index in memory, loaded from the log at open: torn tails cut, a directory filled
//! under a larger size fitted to this one, one mostly of dropped blocks started afresh.

use super::*;

/// The index in memory, and where the data file ends.
#[derive(Default)]
pub(super) struct Index {
    pub(super) entries: HashMap<Key, Entry>,
    /// Bytes of live blocks.
    pub(super) bytes: u64,
    /// Where the next write goes: the end of `data`.
    pub(super) tail: u64,
}

impl Index {
    /// True if block `key` is held, read from `version` of its file.
    pub(super) fn holds(&self, key: &Key, version: Version) -> bool {
        self.entries.get(key).is_some_and(|e| e.version == version)
    }

    pub(super) fn insert(&mut self, key: Key, entry: Entry) {
        self.bytes += u64::from(entry.extent.len);
        if let Some(old) = self.entries.insert(key, entry) {
            self.bytes -= u64::from(old.extent.len);
        }
    }

    pub(super) fn remove(&mut self, key: &Key) -> bool {
        match self.entries.remove(key) {
            Some(old) => {
                self.bytes -= u64::from(old.extent.len);
                true
            }
            None => false,
        }
    }
}

/// Appends `records` to the index log in one write, synced: a power cut after it loses none
/// of the blocks it names.
pub(super) fn append(log: &File, records: &[[u8; RECORD]]) -> io::Result<()> {
    let bytes: Vec<u8> = records.iter().flatten().copied().collect();
    let end = log.metadata()?.len();
    log.write_all_at(&bytes, end)?;
    log.sync_data()
}

/// Fits a directory filled under a larger `--disk-cache-size` into `size`: the blocks that end
/// past it are dropped (tombstones in the log, synced first, then the data file cut), with
/// one warning. The blocks kept are those written first, as a MinIO cache keeps the first
/// that fit. Without this a smaller size at a remount was neither enforced nor said: the
/// directory kept every byte it held, over its budget, and the tier took no more.
pub(super) fn shrink(
    dir: &Path,
    log: &File,
    data: &File,
    index: &mut Index,
    size: u64,
) -> io::Result<()> {
    if index.tail <= size {
        return Ok(());
    }
    // Batches are written from a page boundary: the data file is cut at one.
    let cut = size / ALIGN as u64 * ALIGN as u64;
    let past: Vec<(Key, u32)> = (index.entries.iter())
        .filter(|(_, e)| e.extent.offset + u64::from(e.extent.len) > cut)
        .map(|(k, e)| (*k, e.extent.len))
        .collect();
    let dropped: u64 = past.iter().map(|(_, len)| u64::from(*len)).sum();
    tracing::warn!(
        "disk cache {}: holds {}, more than --disk-cache-size {}: dropped the {} blocks ({}) past it",
        dir.display(),
        crate::units::format_size(index.tail),
        crate::units::format_size(size),
        past.len(),
        crate::units::format_size(dropped)
    );
    let tombs: Vec<[u8; RECORD]> = (past.iter())
        .map(|(key, _)| Record::tombstone(*key).encode())
        .collect();
    if !tombs.is_empty() {
        append(log, &tombs)?;
    }
    for (key, _) in &past {
        index.remove(key);
    }
    data.set_len(cut)?;
    data.sync_data()?;
    index.tail = cut;
    Ok(())
}

/// Empties the data file and the index log (its header alone).
pub(super) fn start_afresh(log: &File, data: &File, blocks: BlockSize) -> io::Result<()> {
    data.set_len(0)?;
    log.set_len(0)?;
    log.write_all_at(&header(blocks), 0)?;
    log.sync_data()
}

/// Reads the index log of `dir` into memory: cuts a torn tail, drops records that point past
/// the end of `data`, and starts both afresh if they were written with another block size.
pub(super) fn load(dir: &Path, log: &File, data: &File, blocks: BlockSize) -> io::Result<Index> {
    let header = header(blocks);
    let mut bytes = Vec::new();
    (&*log).read_to_end(&mut bytes)?;
    if bytes.len() < HEADER as usize || bytes[..HEADER as usize] != header {
        if !bytes.is_empty() {
            tracing::warn!(
                "disk cache {}: written by another version or with another block size; starting it afresh",
                dir.display()
            );
        }
        start_afresh(log, data, blocks)?;
        return Ok(Index::default());
    }
    let data_len = data.metadata()?.len();
    let mut index = Index::default();
    let mut good = HEADER as usize;
    let mut torn = false;
    for r in bytes[HEADER as usize..].chunks(RECORD) {
        let Some(rec) = (r.len() == RECORD).then(|| Record::decode(r)).flatten() else {
            torn = true;
            break;
        };
        good += RECORD;
        if rec.extent.len == TOMBSTONE {
            index.remove(&rec.key);
        } else if rec.extent.offset + u64::from(rec.extent.len) <= data_len {
            index.insert(
                rec.key,
                Entry {
                    version: rec.version,
                    extent: rec.extent,
                    checked: false,
                },
            );
        }
    }
    if torn {
        tracing::warn!(
            "disk cache {}: the index ends in a torn record (the daemon stopped mid-write); cut there",
            dir.display()
        );
        log.set_len(good as u64)?;
    }
    // Batches are written in whole pages from a page boundary; a write cut short may have
    // left less.
    index.tail = data_len.next_multiple_of(ALIGN as u64);
    Ok(index)
}
