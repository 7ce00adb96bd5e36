//! A successor daemon's cache: the blocks a predecessor's cache journal names, found again
//! in the arena and the tmpfs the keeper held for it.

use super::*;

impl BlockCache {
    /// Takes over what a previous daemon's cache held in the keeper's memory (see
    /// [`BlockCache::kept`]), after [`BlockCache::keep_files_for_kernel`] if it is called: the
    /// blocks its journal says are published, in the order they came, each where it is
    /// (an arena slot inside the arena, a file still on the tmpfs), as far as the budget
    /// allows; an elastic budget takes at least what they hold, up to its ceiling. From then
    /// on this cache records its own changes. Does nothing for a first daemon.
    pub fn restore(&self) -> std::io::Result<Restored> {
        let Some(journal) = &self.kept else {
            return Ok(Restored::default());
        };
        let records = match journal.records() {
            Ok(records) => records,
            Err(e) => {
                // Nothing of it is taken: the journal starts again, empty, with this cache.
                journal.rewrite(&[]);
                self.index.write().log = Some(journal.clone());
                return Err(e);
            }
        };
        // What the journal says is published now, in the order of its first publication. A
        // journal without removals (MinIO's, most often) is that order already.
        let removals = records
            .iter()
            .any(|r| matches!(r, CacheRecord::Removed { .. }));
        let order: Vec<(BlockKey, CachedAt)> = if removals {
            let mut live: HashMap<BlockKey, (usize, CachedAt)> =
                HashMap::with_capacity(records.len());
            for (i, r) in records.iter().enumerate() {
                match *r {
                    CacheRecord::Added { version, block, at } => {
                        live.insert(BlockKey { version, block }, (i, at));
                    }
                    CacheRecord::Removed { version, block } => {
                        live.remove(&BlockKey { version, block });
                    }
                }
            }
            let mut order: Vec<(usize, BlockKey, CachedAt)> =
                live.into_iter().map(|(k, (i, at))| (i, k, at)).collect();
            order.sort_unstable_by_key(|(i, _, _)| *i);
            order.into_iter().map(|(_, k, at)| (k, at)).collect()
        } else {
            records
                .iter()
                .filter_map(|r| match *r {
                    CacheRecord::Added { version, block, at } => {
                        Some((BlockKey { version, block }, at))
                    }
                    CacheRecord::Removed { .. } => None,
                })
                .collect()
        };
        let mut done = Restored::default();
        let mut policy = self.policy.lock();
        if self.elastic {
            policy.resize(self.ceiling());
        }
        let mut index = self.index.write();
        index.blocks.reserve(order.len());
        let (mut arena_end, mut arena_slots) = (0, 0);
        let mut kept = Vec::with_capacity(order.len());
        for (key, at) in order {
            let (stored, footprint) = match (at, &self.store) {
                (CachedAt::Arena { offset, len }, Store::Arena(arena))
                    if offset as usize + len as usize <= arena.capacity() =>
                {
                    let slot = Slot {
                        offset: offset as usize,
                        len: len as usize,
                    };
                    (Stored::Arena(slot), Arena::footprint(len as usize) as u64)
                }
                (CachedAt::File { file, offset, len }, _) => match self.kernel.get() {
                    Some(files) if files.restore(&key.version, file, len) => (
                        Stored::Kernel { offset, len, file },
                        KernelFiles::footprint(len),
                    ),
                    _ => {
                        done.dropped += 1;
                        continue;
                    }
                },
                _ => {
                    done.dropped += 1;
                    continue;
                }
            };
            if !matches!(policy.admit(&key, footprint), Admission::Admit { .. }) {
                if let (Stored::Kernel { len, .. }, Some(files)) = (&stored, self.kernel.get()) {
                    files.published(&key.version, -(*len as i64));
                }
                done.dropped += 1;
                continue;
            }
            if let Stored::Arena(slot) = &stored {
                arena_end = arena_end.max(slot.offset + slot.len);
                arena_slots += Arena::footprint(slot.len) as u64;
            }
            done.blocks += 1;
            done.bytes += stored.len();
            kept.push(CacheRecord::Added {
                version: key.version,
                block: key.block,
                at,
            });
            index.add(key, stored);
        }
        if let Store::Arena(arena) = &self.store {
            arena.resume_at(arena_end);
            // Slots below the end that no block holds now (removed) still take their memory,
            // as they did in the previous daemon's budget: the policy counts them.
            let holes = (Arena::footprint(arena_end) as u64).saturating_sub(arena_slots);
            if holes > 0 {
                let _ = policy.admit(&ARENA_HOLES, holes);
            }
        }
        if let Some(files) = self.kernel.get() {
            files.sweep();
        }
        // The journal starts again with what this cache holds, so that it does not grow with
        // every daemon (unless it holds just that already), and records this cache's changes
        // from now on.
        if kept.len() != records.len() {
            journal.rewrite(&kept);
        }
        index.log = Some(journal.clone());
        let held = policy.used();
        drop(index);
        drop(policy);
        if self.elastic {
            let capacity = self.config.capacity.max(held).min(self.ceiling());
            self.resize(capacity);
        }
        Ok(done)
    }
}
