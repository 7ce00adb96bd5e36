//! The writer: blocks the tier admits are queued, written to the data file in batches of
//! whole pages, synced, then named in the index log and published.

use super::*;

/// A block handed to the writer.
pub(super) struct Pending {
    pub(super) key: Key,
    pub(super) version: Version,
    pub(super) data: Arc<Block>,
}

/// The writer's queue.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) blocks: Vec<Pending>,
    pub(super) bytes: u64,
    pub(super) closing: bool,
    /// Every block taken and not yet in the index (queued, or in the batch being written):
    /// served from here meanwhile, so that a reader right behind the prefetcher reads it once.
    pub(super) transit: HashMap<Key, (Version, Arc<Block>)>,
}

impl Queue {
    /// Block `key` read from `version`, if it is on its way to the disk.
    pub(super) fn carried(&self, key: &Key, version: Version) -> Option<&Arc<Block>> {
        let (v, data) = self.transit.get(key)?;
        (*v == version).then_some(data)
    }
}

impl DiskTier {
    /// The writer: takes queued blocks, writes them in batches, publishes them.
    pub(super) fn write_loop(&self) {
        // The batch buffer, kept from batch to batch: memory that a fresh mapping a batch
        // would fault in page by page (a fifth of the daemon's CPU in profiles of a cold
        // epoch from S3 with a disk tier went to such faults, docs/BENCHMARKS.md).
        let mut buf = None;
        loop {
            let batch = {
                let mut q = self.queue.lock();
                while q.blocks.is_empty() && !q.closing {
                    self.wake.wait_for(&mut q, Duration::from_secs(1));
                }
                if q.blocks.is_empty() && q.closing {
                    return;
                }
                q.bytes = 0;
                std::mem::take(&mut q.blocks)
            };
            let mut rest = batch.as_slice();
            while !rest.is_empty() && self.enabled() {
                rest = self.write_batch(rest, &mut buf);
            }
            // Written (in the index now), or not written at all.
            let mut q = self.queue.lock();
            for p in &batch {
                q.transit.remove(&p.key);
            }
        }
    }

    /// Writes the first blocks of `pending` that fit one batch and the capacity, through
    /// `buf` (the batch buffer: made here if it is none or too small); returns the rest
    /// (empty once the capacity is reached: what does not fit is not written).
    pub(super) fn write_batch<'p>(
        &self,
        pending: &'p [Pending],
        buf: &mut Option<Block>,
    ) -> &'p [Pending] {
        let tail = self.index.read().tail;
        let mut records = Vec::new();
        let mut chosen = Vec::new();
        let mut in_batch = std::collections::HashSet::new();
        let mut end = 0usize;
        let mut taken = 0;
        for p in pending {
            let len = p.data.len();
            if !records.is_empty() && end + len > BATCH_MAX {
                break;
            }
            taken += 1;
            if self.index.read().holds(&p.key, p.version) || !in_batch.insert(p.key) {
                continue;
            }
            // Large blocks start on a page, to be read straight into their buffer.
            let at = if len >= MAP_FROM {
                end.next_multiple_of(ALIGN)
            } else {
                end
            };
            if tail + (at + len).next_multiple_of(ALIGN) as u64 > self.capacity {
                if !self.full.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "disk cache {} is full ({}): it keeps what it has and takes no more",
                        self.dir.display(),
                        crate::units::format_size(self.capacity)
                    );
                }
                taken = pending.len();
                break;
            }
            end = at + len;
            chosen.push((at, &p.data));
            records.push(Record {
                key: p.key,
                version: p.version,
                extent: Extent {
                    offset: tail + at as u64,
                    len: len as u32,
                    crc: crc32c::crc32c(&p.data),
                },
            });
        }
        if records.is_empty() {
            return &pending[taken..];
        }
        // Whole pages, in page-aligned memory: one O_DIRECT write. The bytes between the
        // blocks and after the last are zeros, not a former batch's.
        let size = end.next_multiple_of(ALIGN);
        let written = batch_buffer(buf, size).and_then(|whole| {
            let mut filled = 0;
            for (at, data) in &chosen {
                whole[filled..*at].fill(0);
                whole[*at..*at + data.len()].copy_from_slice(data);
                filled = *at + data.len();
            }
            whole[filled..size].fill(0);
            self.write_data(tail, &whole[..size])
        });
        if let Err(e) = written {
            self.write_failed("writing blocks", &e);
            return &[];
        }
        let encoded: Vec<[u8; RECORD]> = records.iter().map(Record::encode).collect();
        if let Err(e) = append(&self.index_log.lock(), &encoded) {
            self.write_failed("writing the index", &e);
            return &[];
        }
        let mut index = self.index.write();
        for r in &records {
            index.insert(
                r.key,
                Entry {
                    version: r.version,
                    extent: r.extent,
                    checked: true,
                },
            );
        }
        index.tail = tail + size as u64;
        &pending[taken..]
    }

    /// Writes `buf` (whole pages) at `at` (a page boundary) of the data file and syncs it:
    /// with `O_DIRECT` where the filesystem takes it, so that the writes neither dirty nor
    /// fill the page cache (in a memory cgroup, dirty pages would throttle the writer and
    /// take the jobs' memory); else buffered, then dropped from the page cache.
    pub(super) fn write_data(&self, at: u64, buf: &[u8]) -> io::Result<()> {
        if let Some(direct) = &self.direct_writes {
            direct.write_all_at(buf, at)?;
            return direct.sync_data();
        }
        self.data.write_all_at(buf, at)?;
        self.data.sync_data()?;
        // Only advice to the kernel's page cache: a failure changes nothing.
        let _ = rustix::fs::fadvise(
            &self.data,
            at,
            std::num::NonZeroU64::new(buf.len() as u64),
            rustix::fs::Advice::DontNeed,
        );
        Ok(())
    }
}

/// The first `size` bytes of the batch buffer `buf`, made (of [`BATCH_MAX`] bytes, or `size`
/// if a single block is larger) where it is none or smaller than `size`.
fn batch_buffer(buf: &mut Option<Block>, size: usize) -> io::Result<&mut [u8]> {
    if buf.as_ref().is_none_or(|b| b.len() < size) {
        *buf = Some(Block::for_overwrite(size.max(BATCH_MAX))?);
    }
    let whole = buf.as_mut().expect("made above").whole_mut();
    Ok(&mut whole[..size])
}
