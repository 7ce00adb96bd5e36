//! Cache admission and eviction policies. Pure: no I/O, no clock, no threads; sizes and
//! capacity come in as arguments, decisions go out as values.
//!
//! - [`MinIoPolicy`] (CoorDL's MinIO): admit while there is room, never evict. Under a fresh
//!   random order every epoch no policy without knowledge of the future does better: the
//!   hit rate of every epoch after the first equals the cached fraction.
//! - [`LruPolicy`]: least recently used, the page cache's behaviour; the baseline every
//!   benchmark shows beside MinIO. Under random per-epoch order it evicts exactly what the
//!   next epoch needs.
//! - [`NoCachePolicy`]: admits nothing.
//!
//! A policy also says what its callers must do for it, so that nobody outside this module
//! branches on which policy it is: whether it keeps anything, evicts (which store it needs),
//! must hear of hits, and may be offered blocks fetched on a guess.

use std::hash::Hash;

/// What a policy decides for a fetched item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission<K> {
    /// Store it, after dropping `evict` (oldest first).
    Admit { evict: Vec<(K, u64)> },
    /// Do not store it: no room (or, for LRU, larger than the whole cache).
    Refuse,
}

/// An admission/eviction policy over keys `K` with sizes in bytes.
pub trait CachePolicy<K>: Send {
    /// Decides whether `key` of `size` bytes, just fetched, enters the cache. On `Admit` the
    /// policy already counts it (and no longer counts what it evicts).
    fn admit(&mut self, key: &K, size: u64) -> Admission<K>;
    /// Records a hit on a cached `key`.
    fn touch(&mut self, key: &K);
    /// Forgets `key`, admitted with `size` bytes (what `admit` was told) and no longer
    /// stored: the store could not hold it after all. A policy that keeps no record per key
    /// (MinIO) gives back `size`; one that does (LRU) drops its record.
    fn remove(&mut self, key: &K, size: u64);
    /// Bytes the policy holds.
    fn used(&self) -> u64;
    /// Bytes the policy may hold.
    fn capacity(&self) -> u64;
    /// From now on the policy may hold `capacity` bytes (an elastic budget that grew or
    /// shrank). A policy with a record per key returns what it evicts to get there, least
    /// recently used first; one without (MinIO) returns nothing and goes on counting what it
    /// holds until the cache drops files and gives their bytes back ([`CachePolicy::remove`]).
    fn resize(&mut self, capacity: u64) -> Vec<(K, u64)>;
    /// False for a policy that admits nothing: the cache is then left out of every read,
    /// and the kernel's page cache does what it does.
    fn keeps_anything(&self) -> bool {
        true
    }
    /// True if the policy may evict what it admitted: its store must give memory back one
    /// block at a time. A policy that never evicts can have its blocks carved off an
    /// append-only arena, with no allocator and no fragmentation.
    fn evicts(&self) -> bool;
    /// True if the policy orders blocks by use and must hear of every hit ([`touch`]).
    /// Asked once, so that a policy that needs no touch costs no lock per hit.
    ///
    /// [`touch`]: CachePolicy::touch
    fn needs_touch(&self) -> bool;
    /// True if blocks the prefetcher fetched on a guess may be offered when they arrive.
    /// A policy that never evicts loses nothing to a wrong guess; one that evicts would push
    /// out blocks that will be read for one that may not be, so it is offered prefetched
    /// blocks when a reader takes them.
    fn admits_prefetch(&self) -> bool;
}

/// Admit while there is room; never evict.
#[derive(Debug)]
pub struct MinIoPolicy {
    capacity: u64,
    used: u64,
}

impl MinIoPolicy {
    /// A policy that holds at most `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        MinIoPolicy { capacity, used: 0 }
    }
}

impl<K> CachePolicy<K> for MinIoPolicy {
    fn admit(&mut self, _key: &K, size: u64) -> Admission<K> {
        if self.used + size <= self.capacity {
            self.used += size;
            Admission::Admit { evict: Vec::new() }
        } else {
            Admission::Refuse
        }
    }
    fn touch(&mut self, _key: &K) {}
    fn remove(&mut self, _key: &K, size: u64) {
        self.used -= size.min(self.used);
    }
    fn used(&self) -> u64 {
        self.used
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn resize(&mut self, capacity: u64) -> Vec<(K, u64)> {
        self.capacity = capacity;
        Vec::new()
    }
    fn evicts(&self) -> bool {
        false
    }
    fn needs_touch(&self) -> bool {
        false
    }
    fn admits_prefetch(&self) -> bool {
        true
    }
}

/// Evict the least recently used until the newcomer fits.
pub struct LruPolicy<K: Hash + Eq> {
    capacity: u64,
    used: u64,
    order: lru::LruCache<K, u64>,
}

impl<K: Hash + Eq> std::fmt::Debug for LruPolicy<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LruPolicy")
            .field("capacity", &self.capacity)
            .field("used", &self.used)
            .field("items", &self.order.len())
            .finish()
    }
}

impl<K: Hash + Eq> LruPolicy<K> {
    /// A policy that holds at most `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        LruPolicy {
            capacity,
            used: 0,
            order: lru::LruCache::unbounded(),
        }
    }
}

impl<K: Hash + Eq + Clone + Send> CachePolicy<K> for LruPolicy<K> {
    fn admit(&mut self, key: &K, size: u64) -> Admission<K> {
        if size > self.capacity {
            return Admission::Refuse;
        }
        let mut evict = Vec::new();
        if let Some(old) = self.order.pop(key) {
            self.used -= old;
        }
        while self.used + size > self.capacity {
            let Some((k, s)) = self.order.pop_lru() else {
                break;
            };
            self.used -= s;
            evict.push((k, s));
        }
        self.order.put(key.clone(), size);
        self.used += size;
        Admission::Admit { evict }
    }
    fn touch(&mut self, key: &K) {
        self.order.promote(key);
    }
    fn remove(&mut self, key: &K, _size: u64) {
        if let Some(size) = self.order.pop(key) {
            self.used -= size;
        }
    }
    fn used(&self) -> u64 {
        self.used
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn resize(&mut self, capacity: u64) -> Vec<(K, u64)> {
        self.capacity = capacity;
        let mut evict = Vec::new();
        while self.used > capacity {
            let Some((k, s)) = self.order.pop_lru() else {
                break;
            };
            self.used -= s;
            evict.push((k, s));
        }
        evict
    }
    fn evicts(&self) -> bool {
        true
    }
    fn needs_touch(&self) -> bool {
        true
    }
    fn admits_prefetch(&self) -> bool {
        false
    }
}

/// Admits nothing.
#[derive(Debug, Default)]
pub struct NoCachePolicy;

impl<K> CachePolicy<K> for NoCachePolicy {
    fn admit(&mut self, _key: &K, _size: u64) -> Admission<K> {
        Admission::Refuse
    }
    fn touch(&mut self, _key: &K) {}
    fn remove(&mut self, _key: &K, _size: u64) {}
    fn used(&self) -> u64 {
        0
    }
    fn capacity(&self) -> u64 {
        0
    }
    fn resize(&mut self, _capacity: u64) -> Vec<(K, u64)> {
        Vec::new()
    }
    fn keeps_anything(&self) -> bool {
        false
    }
    fn evicts(&self) -> bool {
        false
    }
    fn needs_touch(&self) -> bool {
        false
    }
    fn admits_prefetch(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, VecDeque};

    #[test]
    fn minio_admits_until_full_and_never_evicts() {
        let mut p = MinIoPolicy::new(250);
        let table: &[(u32, u64, bool)] = &[
            (1, 100, true),
            (2, 100, true),
            (3, 100, false),
            (4, 50, true),
            (5, 1, false),
        ];
        for &(key, size, admitted) in table {
            let got = p.admit(&key, size);
            assert_eq!(
                got == (Admission::Admit { evict: vec![] }),
                admitted,
                "key {key}"
            );
        }
        assert_eq!(CachePolicy::<u32>::used(&p), 250);
    }

    #[test]
    fn each_policy_says_what_it_needs() {
        let policies: [(&dyn CachePolicy<u32>, [bool; 4]); 3] = [
            (&MinIoPolicy::new(1), [true, false, false, true]),
            (&LruPolicy::new(1), [true, true, true, false]),
            (&NoCachePolicy, [false, false, false, false]),
        ];
        for (i, (p, want)) in policies.iter().enumerate() {
            let got = [
                p.keeps_anything(),
                p.evicts(),
                p.needs_touch(),
                p.admits_prefetch(),
            ];
            assert_eq!(got, *want, "policy {i}");
        }
    }

    #[test]
    fn remove_gives_back_what_admit_counted() {
        let mut minio = MinIoPolicy::new(250);
        assert_eq!(minio.admit(&1u32, 200), Admission::Admit { evict: vec![] });
        assert_eq!(minio.admit(&2u32, 100), Admission::Refuse);
        minio.remove(&1, 200);
        assert_eq!(CachePolicy::<u32>::used(&minio), 0);
        assert_eq!(minio.admit(&2u32, 100), Admission::Admit { evict: vec![] });

        let mut lru = LruPolicy::new(300);
        for k in 1..=3u32 {
            assert_eq!(lru.admit(&k, 100), Admission::Admit { evict: vec![] });
        }
        lru.remove(&2, 100);
        lru.remove(&9, 100); // never admitted: nothing to give back
        assert_eq!(lru.used(), 200);
        // The removed key is gone from the order: 1 is evicted first, not 2.
        assert_eq!(
            lru.admit(&4, 200),
            Admission::Admit {
                evict: vec![(1, 100)]
            }
        );
    }

    #[test]
    fn a_shrunk_lru_evicts_the_least_recently_used_and_minio_only_stops_admitting() {
        let mut lru = LruPolicy::new(300);
        for k in 1..=3u32 {
            assert_eq!(lru.admit(&k, 100), Admission::Admit { evict: vec![] });
        }
        lru.touch(&1);
        assert_eq!(lru.resize(150), vec![(2, 100), (3, 100)]);
        assert_eq!((lru.used(), lru.capacity()), (100, 150));
        assert_eq!(
            lru.admit(&4, 100),
            Admission::Admit {
                evict: vec![(1, 100)]
            }
        );
        assert!(lru.resize(1000).is_empty());
        assert_eq!(lru.admit(&5, 900), Admission::Admit { evict: vec![] });

        let mut minio = MinIoPolicy::new(300);
        assert_eq!(minio.admit(&1u32, 200), Admission::Admit { evict: vec![] });
        assert!(CachePolicy::<u32>::resize(&mut minio, 100).is_empty());
        // It holds what it held until the cache drops files, and admits nothing meanwhile.
        assert_eq!(CachePolicy::<u32>::used(&minio), 200);
        assert_eq!(minio.admit(&2u32, 1), Admission::Refuse);
        minio.remove(&1, 150);
        assert_eq!(minio.admit(&2u32, 50), Admission::Admit { evict: vec![] });
        assert_eq!(minio.admit(&3u32, 1), Admission::Refuse);
    }

    #[test]
    fn lru_evicts_least_recently_used_first() {
        let mut p = LruPolicy::new(300);
        for k in 1..=3u32 {
            assert_eq!(p.admit(&k, 100), Admission::Admit { evict: vec![] });
        }
        p.touch(&1);
        assert_eq!(
            p.admit(&4, 150),
            Admission::Admit {
                evict: vec![(2, 100), (3, 100)]
            }
        );
        assert_eq!(p.admit(&5, 301), Admission::Refuse);
        assert_eq!(p.used(), 250);
    }

    #[test]
    fn random_order_epochs_hit_the_cached_fraction_with_minio_and_less_with_lru() {
        use rand::{SeedableRng, seq::SliceRandom};
        let n = 1000u32;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut minio = MinIoPolicy::new(500);
        let mut lru = LruPolicy::new(500);
        let mut in_minio = std::collections::HashSet::new();
        let mut in_lru = std::collections::HashSet::new();
        let mut hits = (0, 0);
        for epoch in 0..4 {
            let mut order: Vec<u32> = (0..n).collect();
            order.shuffle(&mut rng);
            let before = hits;
            for k in order {
                if in_minio.contains(&k) {
                    hits.0 += 1;
                } else if let Admission::Admit { .. } = minio.admit(&k, 1) {
                    in_minio.insert(k);
                }
                if in_lru.contains(&k) {
                    hits.1 += 1;
                    lru.touch(&k);
                } else if let Admission::Admit { evict } = lru.admit(&k, 1) {
                    for (e, _) in evict {
                        in_lru.remove(&e);
                    }
                    in_lru.insert(k);
                }
            }
            if epoch > 0 {
                assert_eq!(hits.0 - before.0, 500, "MinIO hits the cached half");
                assert!(
                    hits.1 - before.1 < 350,
                    "LRU thrashes: {}",
                    hits.1 - before.1
                );
            }
        }
    }

    /// A reference LRU: a queue of (key, size), most recent at the back.
    #[derive(Default)]
    struct Model {
        queue: VecDeque<(u8, u64)>,
    }

    impl Model {
        fn used(&self) -> u64 {
            self.queue.iter().map(|(_, s)| s).sum()
        }
    }

    proptest! {
        #[test]
        fn lru_matches_a_reference_model(ops in prop::collection::vec((0u8..20, 1u64..60, 0u8..3), 1..200)) {
            let cap = 200;
            let mut p = LruPolicy::new(cap);
            let mut m = Model::default();
            let mut sizes = HashMap::new();
            for (key, size, op) in ops {
                // 0: admit, 1: touch, 2: remove.
                if op == 1 {
                    p.touch(&key);
                    if let Some(i) = m.queue.iter().position(|(k, _)| *k == key) {
                        let e = m.queue.remove(i).unwrap();
                        m.queue.push_back(e);
                    }
                    continue;
                }
                if op == 2 {
                    p.remove(&key, size);
                    m.queue.retain(|(k, _)| *k != key);
                    prop_assert_eq!(p.used(), m.used());
                    continue;
                }
                let got = p.admit(&key, size);
                if let Some(i) = m.queue.iter().position(|(k, _)| *k == key) {
                    m.queue.remove(i);
                }
                let mut evict = Vec::new();
                while m.used() + size > cap {
                    evict.push(m.queue.pop_front().unwrap());
                }
                m.queue.push_back((key, size));
                sizes.insert(key, size);
                prop_assert_eq!(got, Admission::Admit { evict });
                prop_assert_eq!(p.used(), m.used());
                prop_assert!(p.used() <= cap);
            }
        }

        #[test]
        fn minio_never_exceeds_capacity_and_never_evicts(sizes in prop::collection::vec(0u64..100, 0..100), cap in 0u64..1000) {
            let mut p = MinIoPolicy::new(cap);
            let mut used = 0;
            for (i, s) in sizes.into_iter().enumerate() {
                match p.admit(&i, s) {
                    Admission::Admit { evict } => { prop_assert!(evict.is_empty()); used += s; }
                    Admission::Refuse => prop_assert!(used + s > cap),
                }
                prop_assert_eq!(CachePolicy::<usize>::used(&p), used);
                prop_assert!(used <= cap);
            }
        }
    }
}
