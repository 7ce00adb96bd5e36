//! An elastic budget's resize: growing lets the policy admit more; shrinking drops the
//! newest blocks (the arena's end, the newest files kept for the kernel, cut or unlinked),
//! so that what stays is what was cached first (see the module header of `cache`).

use super::*;

impl BlockCache {
    /// From now on the cache may hold `capacity` bytes (at most [`BlockCache::ceiling`]). A
    /// smaller budget than it holds drops files, newest first (LRU: evicts the least recently
    /// used blocks), and gives their memory back (see the module header).
    pub fn resize(&self, capacity: u64) -> Resized {
        self.resize_with(capacity, false)
    }

    /// From now on the cache admits nothing past `capacity`, and drops nothing: blocks
    /// admitted since the caller looked at [`BlockCache::used`] stay, and the capacity is what
    /// it holds then.
    pub fn hold(&self, capacity: u64) -> Resized {
        self.resize_with(capacity, true)
    }

    pub(super) fn resize_with(&self, capacity: u64, keep: bool) -> Resized {
        let _alone = self.shrink.write();
        let mut policy = self.policy.lock();
        let capacity = if keep {
            capacity.max(policy.used())
        } else {
            capacity
        };
        let capacity = capacity.min(self.ceiling());
        let evict = policy.resize(capacity);
        let mut index = self.index.write();
        let mut done = Resized::default();
        for (k, size) in &evict {
            if index.remove(k).is_some() {
                done.evicted += 1;
                done.freed += size;
            }
        }
        self.counters
            .evicted
            .fetch_add(done.evicted, Ordering::Relaxed);
        let mut touched = HashSet::new();
        while policy.used() > capacity {
            let Some(newest) = index.admitted.as_ref().and_then(Admitted::newest) else {
                break;
            };
            let over = policy.used() - capacity;
            let version = match newest {
                Newest::Slot(key) => {
                    self.drop_last_slot(&mut index, &mut **policy, key, &mut done);
                    key.version
                }
                Newest::File(version) => {
                    if !self.cut_file(&mut index, &mut **policy, version, over, &mut done) {
                        self.drop_file(&mut index, &mut **policy, version, &mut done);
                    }
                    version
                }
            };
            touched.insert(version);
            if !index.per_file.contains_key(&version) && !done.dropped.contains(&version) {
                done.dropped.push(version);
            }
        }
        done.files = touched.len() as u64;
        let c = &self.counters;
        (c.shrink_dropped_files).fetch_add(done.files, Ordering::Relaxed);
        c.shrink_freed.fetch_add(done.freed, Ordering::Relaxed);
        done
    }

    /// Takes back the arena's last slot, block `key`, and the arena's end past the slots left.
    pub(super) fn drop_last_slot(
        &self,
        index: &mut Index,
        policy: &mut dyn CachePolicy<BlockKey>,
        key: BlockKey,
        done: &mut Resized,
    ) {
        index.remove(&key);
        self.give_back_arena_end(index, policy, &key, done);
    }

    /// Gives the arena's pages past its last slot in the index back to the kernel; the policy
    /// stops counting them (as `key`'s).
    pub(super) fn give_back_arena_end(
        &self,
        index: &Index,
        policy: &mut dyn CachePolicy<BlockKey>,
        key: &BlockKey,
        done: &mut Resized,
    ) {
        if let (Store::Arena(arena), Some(admitted)) = (&self.store, &index.admitted) {
            let back = arena.truncate(admitted.arena_end()) as u64;
            policy.remove(key, back);
            done.freed += back;
        }
    }

    /// Takes back the newest blocks of `version`'s file kept for the kernel, its last first,
    /// until `over` bytes are freed, and leaves it the rest. False, and nothing changes, if
    /// that would take every block, or the file was ever opened whole
    /// ([`KernelFiles::cut`]): it goes whole then ([`BlockCache::drop_file`]).
    pub(super) fn cut_file(
        &self,
        index: &mut Index,
        policy: &mut dyn CachePolicy<BlockKey>,
        version: FileVersion,
        over: u64,
        done: &mut Resized,
    ) -> bool {
        let Some(files) = self.kernel.get() else {
            return false;
        };
        let (mut cut, mut bytes, mut freed) = (Vec::new(), 0, 0);
        for block in (0..self.blocks().count(version.size)).rev() {
            if freed >= over {
                break;
            }
            let key = BlockKey { version, block };
            if let Some(Stored::Kernel { offset, len, .. }) = index.blocks.get(&key) {
                cut.push((key, *offset, *len));
                bytes += len;
                freed += KernelFiles::footprint(*len);
            }
        }
        let whole = index.per_file.get(&version).copied().unwrap_or(0);
        if freed < over || bytes >= whole || !files.cut(&version, bytes) {
            return false;
        }
        for (key, _, len) in &cut {
            index.remove(key);
            policy.remove(key, KernelFiles::footprint(*len));
        }
        files.punch(&version, cut.iter().map(|&(_, offset, len)| (offset, len)));
        done.freed += freed;
        true
    }

    /// Drops every block of `version`, and its file kept for the kernel.
    pub(super) fn drop_file(
        &self,
        index: &mut Index,
        policy: &mut dyn CachePolicy<BlockKey>,
        version: FileVersion,
        done: &mut Resized,
    ) {
        let mut kernel_bytes = 0;
        for block in 0..self.blocks().count(version.size).max(1) {
            let key = BlockKey { version, block };
            if let Some(Stored::Kernel { len, .. }) = index.remove(&key) {
                kernel_bytes += KernelFiles::footprint(len);
            }
        }
        if let Some(admitted) = &mut index.admitted {
            // Whatever the blocks said, the file is gone from the order: the loop ends.
            admitted.file_gone(&version);
        }
        let first = BlockKey { version, block: 0 };
        if let Some(files) = self.kernel.get()
            && files.remove(&version)
        {
            policy.remove(&first, kernel_bytes);
            done.freed += kernel_bytes;
        }
        self.give_back_arena_end(index, policy, &first, done);
    }
}
