//! The what-if simulator: the per-epoch byte hit rate of a cache of a given size under
//! training's access pattern (every file once per epoch, whole, in a fresh random order each
//! epoch), for three policies:
//!
//! - [`Policy::Lru`]: least recently used, what the kernel's page cache does with the same
//!   memory (and `coorfs mount --policy lru`). Files take whole pages (`align` 4096).
//! - [`Policy::MinIo`]: admit while there is room, never evict (`--policy minio`, the default);
//!   files take 64-byte arena slots.
//! - [`Policy::MinIoPrefetch`]: MinIO plus a prefetcher that stages uncached files from the
//!   job's remaining set (the files it has not read yet this epoch) in a buffer of `staging`
//!   bytes. The prefetcher is modelled as infinitely fast, so this is an upper bound: the
//!   buffer is always full of remaining files, taken in an order unrelated to the job's
//!   (on-disk order is as good as random for that). It turns about S(1 + ln(U/S)) of U misses
//!   into hits for a buffer of S files. It does not reduce the bytes read
//!   from storage (every staged file is read from it, once), only when they are read.
//!
//! Pure: no I/O, no clock, no threads; sizes, capacity and seed come in as arguments. The
//! policies are the cache's own ([`crate::cache::policy`]), so the simulator and the mount
//! cannot disagree on what LRU and MinIO admit, and the orders are `coorfs read`'s
//! ([`crate::reader::epoch_order`] over file indices).
//!
//! Big datasets: under random order a hit rate depends on the cached fraction, not on the file
//! count, so a dataset of more than [`SIM_FILES`] files is simulated on a uniform sample of
//! that many ([`sample_sizes`]) with the capacity and the staging buffer scaled by the
//! sample's share of the dataset's footprint ([`scale_capacity`]). Hit rates, not byte
//! counts, carry over to the whole dataset.

use serde::Serialize;

use crate::cache::policy::{Admission, CachePolicy, LruPolicy, MinIoPolicy};
use crate::reader::epoch_order;

/// At most this many files are simulated. 100,000 keeps a sweep (21 sizes x 3 policies x
/// 5 epochs) to a few seconds on this machine's 2 cores (LRU runs 5 epochs of 200,000 files
/// in 0.27 s, optimised), and a uniform sample of that size estimates a hit rate with a
/// standard error of at most 0.0016 (at p = 0.5).
pub const SIM_FILES: usize = 100_000;

/// What the simulated cache does. Not the mount's [`crate::cache::PolicyKind`]: this is a
/// model, with one case the mount has no policy for (MinIO with an ideal prefetcher and its
/// staging buffer) and none for `--policy none` (nothing to simulate); both run the cache's
/// own [`crate::cache::policy`] types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Policy {
    Lru,
    MinIo,
    /// MinIO, plus remaining-set prefetch into a staging buffer of `staging` bytes.
    MinIoPrefetch {
        staging: u64,
    },
}

/// One simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Bytes the cache may hold (footprints, see `align`).
    pub capacity: u64,
    /// A cached file takes its size rounded up to a multiple of this many bytes (4096: the
    /// page cache and LRU's mappings hold whole pages; 64: MinIO's arena slots).
    pub align: u64,
    /// Epochs to run.
    pub epochs: u32,
    /// Seed of the orders: epoch `e` reads in the order of `coorfs read --seed seed`'s epoch `e`.
    pub seed: u64,
}

/// What one simulated epoch read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EpochSim {
    pub epoch: u32,
    /// Files read (all of them, once).
    pub files: u64,
    /// Reads that did not wait for storage: the file was cached, or staged by the prefetcher.
    pub hits: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Bytes of the hits.
    pub hit_bytes: u64,
    /// Bytes read from storage during the epoch (misses, and the prefetcher's reads).
    pub storage_bytes: u64,
}

impl EpochSim {
    /// hit_bytes / bytes.
    pub fn byte_hit_rate(&self) -> f64 {
        ratio(self.hit_bytes, self.bytes)
    }

    /// hits / files.
    pub fn file_hit_rate(&self) -> f64 {
        ratio(self.hits, self.files)
    }

    /// storage_bytes / bytes.
    pub fn storage_fraction(&self) -> f64 {
        ratio(self.storage_bytes, self.bytes)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The bytes a file of `size` bytes takes in a cache that rounds to `align`.
pub fn footprint(size: u64, align: u64) -> u64 {
    let align = align.max(1);
    size.div_ceil(align) * align
}

/// Runs `config.epochs` epochs over files of `sizes` bytes under `policy`.
pub fn simulate(sizes: &[u64], policy: Policy, config: &SimConfig) -> Vec<EpochSim> {
    let n = sizes.len();
    let mut cache: Box<dyn CachePolicy<u32>> = match policy {
        Policy::Lru => Box::new(LruPolicy::new(config.capacity)),
        Policy::MinIo | Policy::MinIoPrefetch { .. } => Box::new(MinIoPolicy::new(config.capacity)),
    };
    let staging = match policy {
        Policy::MinIoPrefetch { staging } => staging,
        Policy::Lru | Policy::MinIo => 0,
    };
    let ids: Vec<u32> = (0..n as u32).collect();
    let mut cached = vec![false; n];
    let mut read = vec![false; n];
    let mut epochs = Vec::with_capacity(config.epochs as usize);
    for epoch in 1..=config.epochs {
        let order = epoch_order(&ids, config.seed, epoch as usize, false);
        let mut stager = (staging > 0).then(|| Stager::new(&ids, &cached, staging, config, epoch));
        read.iter_mut().for_each(|r| *r = false);
        let mut e = EpochSim {
            epoch,
            ..Default::default()
        };
        for &f in &order {
            let i = f as usize;
            let size = sizes[i];
            if let Some(s) = stager.as_mut() {
                s.refill(sizes, &read, &cached, config.align);
            }
            e.files += 1;
            e.bytes += size;
            if cached[i] {
                e.hits += 1;
                e.hit_bytes += size;
                cache.touch(&f);
            } else {
                if stager
                    .as_mut()
                    .is_some_and(|s| s.take(i, sizes, config.align))
                {
                    e.hits += 1;
                    e.hit_bytes += size;
                }
                e.storage_bytes += size;
                if let Admission::Admit { evict } = cache.admit(&f, footprint(size, config.align)) {
                    for (k, _) in evict {
                        cached[k as usize] = false;
                    }
                    cached[i] = true;
                }
            }
            read[i] = true;
        }
        epochs.push(e);
    }
    epochs
}

/// The prefetcher's staging buffer over one epoch: files uncached at the epoch's start, in
/// an order of their own, staged while they fit.
struct Stager {
    queue: Vec<u32>,
    next: usize,
    staged: Vec<bool>,
    staged_bytes: u64,
    capacity: u64,
}

/// Mixed into the seed of the prefetcher's order, so that it is not the job's.
const PREFETCH_SEED: u64 = 0x5eed_0f57_a9e5;

impl Stager {
    fn new(ids: &[u32], cached: &[bool], capacity: u64, config: &SimConfig, epoch: u32) -> Self {
        let uncached: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&f| !cached[f as usize])
            .collect();
        Stager {
            queue: epoch_order(
                &uncached,
                config.seed ^ PREFETCH_SEED,
                epoch as usize,
                false,
            ),
            next: 0,
            staged: vec![false; cached.len()],
            staged_bytes: 0,
            capacity,
        }
    }

    /// Stages remaining uncached files, in queue order, while the next one fits.
    fn refill(&mut self, sizes: &[u64], read: &[bool], cached: &[bool], align: u64) {
        while let Some(&f) = self.queue.get(self.next) {
            let i = f as usize;
            if read[i] || cached[i] || self.staged[i] {
                self.next += 1;
                continue;
            }
            let need = footprint(sizes[i], align);
            if self.staged_bytes + need > self.capacity {
                break;
            }
            self.staged[i] = true;
            self.staged_bytes += need;
            self.next += 1;
        }
    }

    /// True if file `i` was staged (it leaves the buffer: the job has read it).
    fn take(&mut self, i: usize, sizes: &[u64], align: u64) -> bool {
        if !self.staged[i] {
            return false;
        }
        self.staged[i] = false;
        self.staged_bytes -= footprint(sizes[i], align);
        true
    }
}

/// The sizes to simulate: all of `sizes`, or a uniform sample of `max` of them (seeded).
pub fn sample_sizes(sizes: &[u64], max: usize, seed: u64) -> Vec<u64> {
    use rand::SeedableRng;
    if sizes.len() <= max {
        return sizes.to_vec();
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut picked: Vec<u64> = rand::seq::index::sample(&mut rng, sizes.len(), max)
        .into_iter()
        .map(|i| sizes[i])
        .collect();
    // The simulator shuffles anyway; sorting makes the sample independent of the index order.
    picked.sort_unstable();
    picked
}

/// `capacity` bytes of cache for the dataset `all`, scaled to the simulated `sample` by its
/// share of the dataset's footprint (so that the cached fraction stays the same).
pub fn scale_capacity(capacity: u64, all: &[u64], sample: &[u64], align: u64) -> u64 {
    if all.len() == sample.len() {
        return capacity;
    }
    let total = |s: &[u64]| s.iter().map(|&x| footprint(x, align)).sum::<u64>() as f64;
    let share = total(sample) / total(all).max(1.0);
    (capacity as f64 * share).round() as u64
}

/// The rates an epoch (or a mean of epochs) came out with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Outcome {
    /// Bytes of hits / bytes read.
    pub hit_rate: f64,
    /// Hits / files read.
    pub file_hit_rate: f64,
    /// Bytes read from storage / bytes read.
    pub storage_fraction: f64,
}

impl EpochSim {
    /// Its rates.
    pub fn outcome(&self) -> Outcome {
        Outcome {
            hit_rate: self.byte_hit_rate(),
            file_hit_rate: self.file_hit_rate(),
            storage_fraction: self.storage_fraction(),
        }
    }
}

/// The mean rates of the epochs after the first (the steady state), or of the first if it
/// is the only one.
pub fn steady(epochs: &[EpochSim]) -> Outcome {
    let later = if epochs.len() > 1 {
        &epochs[1..]
    } else {
        epochs
    };
    let n = later.len().max(1) as f64;
    let mean = |f: fn(&EpochSim) -> f64| later.iter().map(f).sum::<f64>() / n;
    Outcome {
        hit_rate: mean(EpochSim::byte_hit_rate),
        file_hit_rate: mean(EpochSim::file_hit_rate),
        storage_fraction: mean(EpochSim::storage_fraction),
    }
}

impl Policy {
    /// What a cached file takes in the store this policy models: whole pages for the page
    /// cache and LRU's mappings, 64-byte slots in MinIO's arena.
    pub fn align(self) -> u64 {
        match self {
            Policy::Lru => 4096,
            Policy::MinIo | Policy::MinIoPrefetch { .. } => crate::cache::arena::ALIGN as u64,
        }
    }
}

/// A dataset to simulate: its sizes, the sample that stands for them, and the epochs.
#[derive(Clone, Debug)]
pub struct Workload<'a> {
    /// Every file's size, bytes.
    pub all: &'a [u64],
    /// What is simulated: all of them, or a sample of [`SIM_FILES`].
    pub sample: Vec<u64>,
    pub epochs: u32,
    pub seed: u64,
}

impl<'a> Workload<'a> {
    /// The workload of `all`, sampled with `seed` if it is big.
    pub fn new(all: &'a [u64], epochs: u32, seed: u64) -> Self {
        Workload {
            all,
            sample: sample_sizes(all, SIM_FILES, seed),
            epochs,
            seed,
        }
    }

    /// The epochs of a cache of `capacity` bytes (of the whole dataset) under `policy`; a
    /// staging buffer is scaled like the capacity.
    pub fn run(&self, policy: Policy, capacity: u64) -> Vec<EpochSim> {
        let align = policy.align();
        let scale = |bytes| scale_capacity(bytes, self.all, &self.sample, align);
        let policy = match policy {
            Policy::MinIoPrefetch { staging } => Policy::MinIoPrefetch {
                staging: scale(staging),
            },
            other => other,
        };
        let config = SimConfig {
            capacity: scale(capacity),
            align,
            epochs: self.epochs,
            seed: self.seed,
        };
        simulate(&self.sample, policy, &config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    const PAGE: u64 = 4096;
    const SLOT: u64 = crate::cache::arena::ALIGN as u64;
    const GIB: u64 = 1 << 30;

    fn run(sizes: &[u64], policy: Policy, capacity: u64, align: u64) -> Vec<EpochSim> {
        simulate(
            sizes,
            policy,
            &SimConfig {
                capacity,
                align,
                epochs: 5,
                seed: 1,
            },
        )
    }

    fn rates(epochs: &[EpochSim]) -> Vec<f64> {
        epochs.iter().map(EpochSim::byte_hit_rate).collect()
    }

    fn close(got: f64, want: f64, tol: f64) -> bool {
        (got - want).abs() <= tol
    }

    /// The table of docs/DESIGN.md ("The problem, in numbers"): 20,000 files of 100 KiB, random
    /// order each epoch.
    #[test]
    fn reproduces_the_design_table() {
        let sizes = vec![100 << 10; 20_000];
        let total: u64 = sizes.iter().sum();
        // (cache, LRU epochs 2-5, MinIO epochs 2-5)
        let table: &[(u64, f64, f64)] = &[
            (GIB, 0.16, 0.52),
            (total * 3 / 4, 0.40, 0.75),
            (total / 4, 0.03, 0.25),
        ];
        for &(cache, lru_want, minio_want) in table {
            let lru = rates(&run(&sizes, Policy::Lru, cache, PAGE));
            let minio = rates(&run(&sizes, Policy::MinIo, cache, SLOT));
            assert_eq!((lru[0], minio[0]), (0.0, 0.0), "epoch 1 is cold");
            for e in 1..5 {
                assert!(close(lru[e], lru_want, 0.03), "LRU at {cache}: {lru:?}");
                assert!(
                    close(minio[e], minio_want, 0.03),
                    "MinIO at {cache}: {minio:?}"
                );
            }
        }
    }

    /// scripts/bench-epochs.sh's setup: 20,000 files of 110 KiB +-10%, a 1 GiB budget. The
    /// mount measured MinIO 0.476 and LRU 0.13 in epochs 2-5.
    #[test]
    fn reproduces_bench_epochs() {
        let sizes: Vec<u64> = (0..20_000u64)
            .map(|i| (110 << 10) * (90 + (i * 7919) % 21) / 100)
            .collect();
        let minio = run(&sizes, Policy::MinIo, GIB, SLOT);
        let lru = run(&sizes, Policy::Lru, GIB, PAGE);
        for e in 1..5 {
            assert!(close(minio[e].byte_hit_rate(), 0.476, 0.01), "{minio:?}");
            assert!(close(lru[e].byte_hit_rate(), 0.13, 0.02), "{lru:?}");
        }
    }

    #[test]
    fn empty_and_full_caches() {
        let sizes: Vec<u64> = (1..=500).map(|i| i * 100).collect();
        let total: u64 = sizes.iter().sum();
        for policy in [Policy::Lru, Policy::MinIo] {
            let none = run(&sizes, policy, 0, PAGE);
            assert!(none.iter().all(|e| e.hits == 0 && e.storage_bytes == total));
            let all = run(&sizes, policy, total * 2, PAGE);
            assert_eq!(all[0].hit_bytes, 0);
            assert!(
                all[1..]
                    .iter()
                    .all(|e| e.hit_bytes == total && e.storage_bytes == 0)
            );
        }
    }

    /// Prefetch from the remaining set: about S(1 + ln(U/S)) of U misses become hits, and
    /// storage reads exactly what MinIO alone reads.
    #[test]
    fn prefetch_turns_misses_into_hits_without_saving_storage() {
        let n = 20_000u64;
        let sizes = vec![100 << 10; n as usize];
        let cache = n / 2 * (100 << 10);
        // (staging files S, uncached files U = 10,000)
        for s in [100u64, 1000, 5000] {
            let staging = s * (100 << 10);
            let minio = run(&sizes, Policy::MinIo, cache, SLOT);
            let pre = run(&sizes, Policy::MinIoPrefetch { staging }, cache, SLOT);
            let u = 10_000f64;
            let want = (s as f64 * (1.0 + (u / s as f64).ln())).min(u);
            let mut extra = 0.0;
            for e in 1..5 {
                assert_eq!(pre[e].storage_bytes, minio[e].storage_bytes);
                extra += (pre[e].hits - minio[e].hits) as f64 / 4.0;
            }
            // A sum of Bernoulli trials has a variance below its mean: the mean of 4 epochs
            // has a standard deviation below sqrt(want) / 2; allow 4 of them.
            assert!(
                (extra - want).abs() < 2.0 * want.sqrt(),
                "S={s}: {extra} vs {want}"
            );
        }
    }

    #[test]
    fn a_sample_predicts_the_whole() {
        let sizes: Vec<u64> = (0..100_000u64)
            .map(|i| 1000 + (i * 7919) % 200_000)
            .collect();
        let total: u64 = sizes.iter().sum();
        let sample = sample_sizes(&sizes, 20_000, 3);
        assert_eq!(sample.len(), 20_000);
        assert_eq!(sample_sizes(&sizes, 20_000, 3), sample, "fixed by the seed");
        assert_eq!(sample_sizes(&sizes[..10], 20_000, 3), sizes[..10].to_vec());
        let cap = total * 6 / 10;
        for (policy, align) in [(Policy::Lru, PAGE), (Policy::MinIo, SLOT)] {
            let whole = steady(&run(&sizes, policy, cap, align)).hit_rate;
            let scaled = scale_capacity(cap, &sizes, &sample, align);
            let part = steady(&run(&sample, policy, scaled, align)).hit_rate;
            assert!(close(whole, part, 0.02), "{policy:?}: {whole} vs {part}");
        }
    }

    /// The simplest possible LRU and MinIO: a queue of (file, footprint), most recent last.
    fn reference(sizes: &[u64], lru: bool, config: &SimConfig) -> Vec<EpochSim> {
        let mut queue: VecDeque<(u32, u64)> = VecDeque::new();
        let ids: Vec<u32> = (0..sizes.len() as u32).collect();
        (1..=config.epochs)
            .map(|epoch| {
                let mut e = EpochSim {
                    epoch,
                    ..Default::default()
                };
                for f in epoch_order(&ids, config.seed, epoch as usize, false) {
                    let size = sizes[f as usize];
                    let need = footprint(size, config.align);
                    e.files += 1;
                    e.bytes += size;
                    if let Some(at) = queue.iter().position(|(k, _)| *k == f) {
                        e.hits += 1;
                        e.hit_bytes += size;
                        if lru {
                            let item = queue.remove(at).unwrap();
                            queue.push_back(item);
                        }
                        continue;
                    }
                    e.storage_bytes += size;
                    let used = |q: &VecDeque<(u32, u64)>| q.iter().map(|(_, s)| s).sum::<u64>();
                    if lru && need <= config.capacity {
                        while used(&queue) + need > config.capacity {
                            queue.pop_front();
                        }
                    }
                    if used(&queue) + need <= config.capacity {
                        queue.push_back((f, need));
                    }
                }
                e
            })
            .collect()
    }

    proptest! {
        #[test]
        fn matches_a_reference_model(
            sizes in prop::collection::vec(0u64..20_000, 1..60),
            capacity in 0u64..400_000,
            align in prop::sample::select(vec![1u64, 64, 4096]),
            epochs in 1u32..5,
            seed in any::<u64>(),
            lru in any::<bool>(),
        ) {
            let config = SimConfig { capacity, align, epochs, seed };
            let policy = if lru { Policy::Lru } else { Policy::MinIo };
            prop_assert_eq!(simulate(&sizes, policy, &config), reference(&sizes, lru, &config));
        }

        #[test]
        fn prefetch_only_adds_hits(
            sizes in prop::collection::vec(0u64..20_000, 1..60),
            capacity in 0u64..400_000,
            staging in 0u64..200_000,
            seed in any::<u64>(),
        ) {
            let config = SimConfig { capacity, align: 64, epochs: 3, seed };
            let minio = simulate(&sizes, Policy::MinIo, &config);
            let pre = simulate(&sizes, Policy::MinIoPrefetch { staging }, &config);
            for (m, p) in minio.iter().zip(&pre) {
                prop_assert_eq!(m.storage_bytes, p.storage_bytes);
                prop_assert!(p.hits >= m.hits && p.hit_bytes >= m.hit_bytes);
                prop_assert_eq!(p.storage_bytes + m.hit_bytes, p.bytes);
            }
        }
    }
}
