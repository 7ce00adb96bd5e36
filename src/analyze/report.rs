//! The report of `coorfs analyze`: what was measured, what the simulator predicts, and the
//! verdict, as one serialisable struct ([`Report`], what `--json` writes) and as text
//! ([`render`]). The arithmetic of the prediction lives here and is pure.
//!
//! The model is DS-Analyzer's: reading, preparing and computing overlap, so an epoch lasts as
//! long as its slowest stage. For each policy and epoch:
//! - fetch time = bytes read from storage / the storage's throughput at the best useful
//!   queue depth (the simulator says which bytes; the measurement how fast);
//! - cache time = files served from coorfs's cache / the hit path's files/s, when a mount was
//!   measured (the page cache's hits are taken as free: ~22 us a file here, hot);
//! - data time = max(fetch, cache); storage sustains files / data time samples/s;
//! - with `--rate R`, compute time = files / R; the epoch lasts max(data, compute), and the
//!   GPUs wait (fetch stall) data - compute when that is positive.
//!
//! The prediction does not model CPU-bound preparation (decoding, augmentation): it answers
//! whether storage and cache can feed the rate, which is what the cache size changes.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value as Json;

use super::measure::DepthResult;
use super::simulate::{EpochSim, Outcome};
use crate::units::format_size;

/// Facts of the dataset.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DatasetReport {
    pub path: String,
    pub files: u64,
    /// Bytes.
    pub bytes: u64,
    pub sizes: SizeDistribution,
    /// Directories that could not be listed and entries that could not be examined.
    pub scan_errors: u64,
    pub first_scan_error: Option<String>,
    /// Files the simulator ran on (a uniform sample of a big dataset).
    pub simulated_files: u64,
}

/// File sizes, bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SizeDistribution {
    pub min: u64,
    pub p10: u64,
    pub median: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: u64,
    /// Files and bytes per power-of-two size class, empty classes left out.
    pub histogram: Vec<SizeBucket>,
}

/// Files of at most `up_to` bytes (and more than half of it).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SizeBucket {
    pub up_to: u64,
    pub files: u64,
    pub bytes: u64,
}

/// The distribution of `sizes` (ascending).
pub fn size_distribution(sizes: &[u64]) -> SizeDistribution {
    if sizes.is_empty() {
        return SizeDistribution::default();
    }
    let at = |q: f64| sizes[((sizes.len() - 1) as f64 * q).round() as usize];
    let mut histogram: Vec<SizeBucket> = Vec::new();
    for &s in sizes {
        let up_to = s.max(1).next_power_of_two();
        match histogram.last_mut() {
            Some(b) if b.up_to == up_to => {
                b.files += 1;
                b.bytes += s;
            }
            _ => histogram.push(SizeBucket {
                up_to,
                files: 1,
                bytes: s,
            }),
        }
    }
    SizeDistribution {
        min: sizes[0],
        p10: at(0.1),
        median: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: sizes[sizes.len() - 1],
        mean: sizes.iter().sum::<u64>() / sizes.len() as u64,
        histogram,
    }
}

/// A read path's measurement: the storage, or a mount's cache.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PathReport {
    /// What was read: "storage (page cache bypassed)" or "cached files through MNT".
    pub what: String,
    /// Distinct files available to read.
    pub files: u64,
    pub seconds_per_depth: f64,
    pub depths: Vec<DepthResult>,
    /// The smallest depth within 10% of the fastest, and its rates.
    pub best_depth: Option<usize>,
    pub mib_per_sec: f64,
    pub files_per_sec: f64,
    /// Files that could not be read (skipped).
    pub unreadable: u64,
    pub first_unreadable: Option<String>,
}

/// The rates the prediction divides by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Storage bytes per second at the best useful depth.
    pub storage_bytes_per_sec: f64,
    /// Files per second the mount's cache serves, if measured.
    pub hit_files_per_sec: Option<f64>,
    /// Samples (files) per second the GPUs consume, if given.
    pub rate: Option<f64>,
}

/// One policy's prediction for an epoch (or the mean of epochs 2+).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Prediction {
    /// Byte hit rate (reads that did not wait for storage).
    pub hit_rate: f64,
    /// Bytes read from storage.
    pub storage_bytes: f64,
    /// Seconds to read them at the measured throughput.
    pub fetch_seconds: f64,
    /// Seconds the cache's hit path needs for the hits (0 when not measured or not coorfs).
    pub cache_seconds: f64,
    /// Samples per second storage and cache sustain (None: unbounded, nothing to read).
    pub samples_per_sec: Option<f64>,
    /// max(fetch, cache, compute) seconds.
    pub epoch_seconds: f64,
    /// Seconds the GPUs wait for data (with --rate).
    pub stall_seconds: Option<f64>,
    /// stall / epoch (with --rate).
    pub stall_fraction: Option<f64>,
}

/// The prediction for an epoch of `files` files and `bytes` bytes that came out as
/// `outcome`; `coorfs` says whether the hits go through coorfs's hit path.
pub fn predict(
    files: u64,
    bytes: u64,
    outcome: &Outcome,
    coorfs: bool,
    rates: &Rates,
) -> Prediction {
    let storage_bytes = outcome.storage_fraction * bytes as f64;
    let fetch = storage_bytes / rates.storage_bytes_per_sec;
    let cache = match (coorfs, rates.hit_files_per_sec) {
        (true, Some(r)) if r > 0.0 => outcome.file_hit_rate * files as f64 / r,
        _ => 0.0,
    };
    let data = fetch.max(cache);
    let compute = rates.rate.map(|r| files as f64 / r);
    let epoch = data.max(compute.unwrap_or(0.0));
    let stall = compute.map(|c| (data - c).max(0.0));
    Prediction {
        hit_rate: outcome.hit_rate,
        storage_bytes,
        fetch_seconds: fetch,
        cache_seconds: cache,
        samples_per_sec: (data > 0.0).then(|| files as f64 / data),
        epoch_seconds: epoch,
        stall_seconds: stall,
        stall_fraction: stall.map(|s| if epoch > 0.0 { s / epoch } else { 0.0 }),
    }
}

/// The three policies side by side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Policies {
    /// The kernel's page cache with the same memory (LRU).
    pub page_cache: Prediction,
    /// coorfs's MinIO cache.
    pub minio: Prediction,
    /// MinIO with remaining-set prefetch (an upper bound on its hit rate).
    pub prefetch: Prediction,
}

/// One simulated epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct EpochRow {
    pub epoch: u32,
    #[serde(flatten)]
    pub policies: Policies,
}

/// The simulated cache size.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CacheReport {
    /// Bytes.
    pub cache_bytes: u64,
    /// cache_bytes / dataset bytes.
    pub fraction: f64,
    pub epochs: Vec<EpochRow>,
    /// The mean of epochs 2 and later.
    pub steady: Policies,
}

/// One cache size of a sweep: the steady state (epochs 2+).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SweepPoint {
    pub cache_bytes: u64,
    pub fraction: f64,
    #[serde(flatten)]
    pub policies: Policies,
}

/// The smallest caches with no fetch stall from epoch 2 on (with --rate).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Recommendation {
    /// Bytes of coorfs MinIO cache; None if no size up to the whole dataset is enough (the
    /// hit path or the GPUs' rate is the limit then).
    pub minio_cache_bytes: Option<u64>,
    /// Bytes of page cache (memory for the kernel to cache in); None likewise.
    pub page_cache_bytes: Option<u64>,
}

/// The smallest capacity, a multiple of `step` bytes (or `max`), in [0, max] for which
/// `stalled` is false, assuming more cache never hurts; None if even `max` stalls.
pub fn smallest_unstalled(
    max: u64,
    step: u64,
    mut stalled: impl FnMut(u64) -> bool,
) -> Option<u64> {
    let step = step.max(1);
    let at = |k: u64| k.saturating_mul(step).min(max);
    let (mut lo, mut hi) = (0u64, max.div_ceil(step)); // in steps
    if stalled(at(hi)) {
        return None;
    }
    if !stalled(at(lo)) {
        return Some(0);
    }
    while hi - lo > 1 {
        // stalled(at(lo)), !stalled(at(hi))
        let mid = lo + (hi - lo) / 2;
        if stalled(at(mid)) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(at(hi))
}

/// What a live mount measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LiveCheck {
    pub mountpoint: String,
    pub policy: String,
    /// Bytes.
    pub cache_capacity: u64,
    /// The mount's dataset-wide epochs (the last complete ones).
    pub epochs: Vec<LiveEpoch>,
    /// Each job's last complete epochs, when the mount tracks jobs.
    pub jobs: Vec<LiveJob>,
    /// The simulator's epochs for the mount's policy and cache size (empty for policy none).
    pub predicted: Vec<Prediction>,
}

/// One epoch as a mount recorded it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LiveEpoch {
    pub epoch: u64,
    pub seconds: f64,
    /// Hits / reads, as the mount counts them (files).
    pub hit_rate: f64,
    /// bytes_from_cache / (bytes_from_cache + bytes_from_source).
    pub byte_hit_rate: f64,
    pub bytes_from_source: u64,
    /// Seconds readers waited for storage, if the mount reports it.
    pub fetch_stall_seconds: Option<f64>,
    /// The share of the readers' time they waited for data, if the mount reports it (see
    /// `stats::DataWait`).
    pub data_wait: Option<f64>,
}

/// One job's epochs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LiveJob {
    pub job: String,
    pub epochs: Vec<LiveEpoch>,
}

/// The last `keep` complete epochs of a list of epoch records (see `stats::EpochRecord`).
/// Fields are read as optional, so that older and newer daemons both work.
pub fn live_epochs(records: Option<&Json>, keep: usize) -> Vec<LiveEpoch> {
    let num = |r: &Json, k: &str| r.get(k).and_then(Json::as_f64);
    let mut done: Vec<LiveEpoch> = records
        .and_then(Json::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|r| r.get("complete").and_then(Json::as_bool) == Some(true))
        .map(|r| {
            let from_cache = num(r, "bytes_from_cache").unwrap_or(0.0);
            let from_source = num(r, "bytes_from_source").unwrap_or(0.0);
            let hit_rate = num(r, "hit_rate").unwrap_or(0.0);
            LiveEpoch {
                epoch: num(r, "epoch").unwrap_or(0.0) as u64,
                seconds: num(r, "seconds").unwrap_or(0.0),
                hit_rate,
                byte_hit_rate: if from_cache + from_source > 0.0 {
                    from_cache / (from_cache + from_source)
                } else {
                    hit_rate
                },
                bytes_from_source: from_source as u64,
                fetch_stall_seconds: num(r, "fetch_stall_seconds"),
                data_wait: crate::stats::DataWait::of_record(r).map(|d| d.share),
            }
        })
        .collect();
    let skip = done.len().saturating_sub(keep);
    done.drain(..skip);
    done
}

/// The jobs of a stats document, each with its last `keep` complete epochs.
pub fn live_jobs(doc: &Json, keep: usize) -> Vec<LiveJob> {
    doc.get("jobs")
        .and_then(Json::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|j| LiveJob {
            job: match j.get("job") {
                Some(Json::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => "?".into(),
            },
            epochs: live_epochs(j.get("epochs"), keep),
        })
        .collect()
}

/// Everything `coorfs analyze` found: what `--json` writes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub dataset: DatasetReport,
    pub storage: PathReport,
    /// Reads of cached files through a mount (`--mount`).
    pub hit_path: Option<PathReport>,
    /// Samples per second the GPUs consume (`--rate`).
    pub rate: Option<f64>,
    /// Seconds of GPU time per epoch: files / rate.
    pub compute_seconds: Option<f64>,
    pub epochs: u32,
    pub seed: u64,
    /// Bytes of the prefetcher's staging buffer.
    pub staging_bytes: u64,
    pub cache: CacheReport,
    /// Cache sizes from 0 to 100% of the dataset (`--sweep`, `--plot`).
    pub sweep: Vec<SweepPoint>,
    /// With --rate.
    pub recommendation: Option<Recommendation>,
    pub live: Option<LiveCheck>,
    /// What went wrong without stopping the analysis.
    pub warnings: Vec<String>,
}

impl Report {
    /// The predictions for `outcomes` (page cache, MinIO, prefetch) of an epoch.
    pub fn policies(&self, outcomes: [&Outcome; 3], rates: &Rates) -> Policies {
        let (files, bytes) = (self.dataset.files, self.dataset.bytes);
        Policies {
            page_cache: predict(files, bytes, outcomes[0], false, rates),
            minio: predict(files, bytes, outcomes[1], true, rates),
            prefetch: predict(files, bytes, outcomes[2], true, rates),
        }
    }

    /// The rows of simulated epochs of the three policies.
    pub fn epoch_rows(&self, sims: [&[EpochSim]; 3], rates: &Rates) -> Vec<EpochRow> {
        (0..sims[0].len())
            .map(|i| EpochRow {
                epoch: sims[0][i].epoch,
                policies: self.policies(
                    [
                        &sims[0][i].outcome(),
                        &sims[1][i].outcome(),
                        &sims[2][i].outcome(),
                    ],
                    rates,
                ),
            })
            .collect()
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn opt_rate(p: &Prediction) -> String {
    p.samples_per_sec
        .map(|r| format!("{r:.0}"))
        .unwrap_or_else(|| "unbounded".into())
}

fn stall(p: &Prediction) -> String {
    p.stall_seconds
        .map(|s| format!("{s:.2}"))
        .unwrap_or_else(|| "-".into())
}

fn path_table(p: &PathReport, out: &mut String) {
    let _ = writeln!(out, "  {:>6} {:>10} {:>10}", "depth", "files/s", "MiB/s");
    for d in &p.depths {
        let mark = if Some(d.depth) == p.best_depth {
            "  <- best useful depth (smallest within 10% of the fastest)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {:>6} {:>10.0} {:>10.1}{mark}",
            d.depth, d.files_per_sec, d.mib_per_sec
        );
    }
    if p.unreadable > 0 {
        let _ = writeln!(
            out,
            "  unreadable: {} of {} files, skipped (first: {})",
            p.unreadable,
            p.files,
            p.first_unreadable.as_deref().unwrap_or("?")
        );
    }
}

/// What the GPUs see from epoch 2 on with one policy, in words.
fn verdict(name: &str, p: &Prediction) -> String {
    match (p.stall_seconds, p.stall_fraction) {
        (Some(s), Some(f)) if s > 0.0 => format!(
            "{name}: fetch-stalled: GPUs wait {s:.2} s of every {:.2} s epoch ({}); storage \
             sustains {} samples/s",
            p.epoch_seconds,
            pct(f),
            opt_rate(p)
        ),
        (Some(_), _) => format!(
            "{name}: no fetch stall (storage and cache sustain {} samples/s)",
            opt_rate(p)
        ),
        (None, _) => format!("{name}: data-bound epoch {:.2} s", p.epoch_seconds),
    }
}

/// The report as text.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    dataset_section(r, &mut out);
    storage_section(r, &mut out);
    hit_rate_section(r, &mut out);
    epoch_time_section(r, &mut out);
    verdict_section(r, &mut out);
    recommendation_section(r, &mut out);
    sweep_section(r, &mut out);
    live_section(r, &mut out);
    for w in &r.warnings {
        let _ = writeln!(out, "\nwarning   {w}");
    }
    out
}

/// The dataset: its files, their sizes, what the scan could not read.
fn dataset_section(r: &Report, out: &mut String) {
    let d = &r.dataset;
    let s = &d.sizes;
    let _ = writeln!(
        out,
        "dataset   {}: {} files, {} ({} bytes)",
        d.path,
        d.files,
        format_size(d.bytes),
        d.bytes
    );
    let _ = writeln!(
        out,
        "  sizes: min {}, p10 {}, median {}, p90 {}, p99 {}, max {} (mean {})",
        format_size(s.min),
        format_size(s.p10),
        format_size(s.median),
        format_size(s.p90),
        format_size(s.p99),
        format_size(s.max),
        format_size(s.mean)
    );
    if d.scan_errors > 0 {
        let _ = writeln!(
            out,
            "  not scanned: {} entries (first: {})",
            d.scan_errors,
            d.first_scan_error.as_deref().unwrap_or("?")
        );
    }
}

/// The storage's measured reads, and the hit path's if a mount was read.
fn storage_section(r: &Report, out: &mut String) {
    let _ = writeln!(
        out,
        "\nstorage   random whole-file reads of {} sampled files, {}, {:.1} s per depth",
        r.storage.files, r.storage.what, r.storage.seconds_per_depth
    );
    path_table(&r.storage, out);
    if let Some(h) = &r.hit_path {
        let _ = writeln!(
            out,
            "\nhit path  {} ({} files), {:.1} s per depth",
            h.what, h.files, h.seconds_per_depth
        );
        path_table(h, out);
    }
}

/// Each epoch's hit rate under each policy.
fn hit_rate_section(r: &Report, out: &mut String) {
    let d = &r.dataset;
    let c = &r.cache;
    let _ = writeln!(
        out,
        "\nhit rate  cache {} = {} of the dataset; {} epochs, a fresh random order each (seed {}){}",
        format_size(c.cache_bytes),
        pct(c.fraction),
        r.epochs,
        r.seed,
        if d.simulated_files < d.files {
            format!("; simulated on a sample of {} files", d.simulated_files)
        } else {
            String::new()
        }
    );
    let prefetch = format!("minio + {} prefetch", format_size(r.staging_bytes));
    let _ = writeln!(
        out,
        "  {:>6} {:>17} {:>13} {:>25}",
        "epoch", "page cache (LRU)", "coorfs minio", prefetch
    );
    for e in &c.epochs {
        let p = &e.policies;
        let _ = writeln!(
            out,
            "  {:>6} {:>17.3} {:>13.3} {:>25.3}",
            e.epoch, p.page_cache.hit_rate, p.minio.hit_rate, p.prefetch.hit_rate
        );
    }
}

/// Each epoch's predicted time, throughput and stall under each policy.
fn epoch_time_section(r: &Report, out: &mut String) {
    let c = &r.cache;
    let _ = write!(
        out,
        "\npredicted storage {:.1} MiB/s at depth {}",
        r.storage.mib_per_sec,
        r.storage.best_depth.unwrap_or(0)
    );
    if let Some(h) = &r.hit_path {
        let _ = write!(out, "; coorfs hits {:.0} files/s", h.files_per_sec);
    }
    match (r.rate, r.compute_seconds) {
        (Some(rate), Some(cs)) => {
            let _ = writeln!(
                out,
                "; GPUs {rate:.0} samples/s = {cs:.2} s of compute per epoch"
            );
        }
        _ => {
            let _ = writeln!(out, "; no --rate: epochs as fast as data comes");
        }
    }
    let _ = writeln!(
        out,
        "  {:>6} | {:^29} | {:^29}",
        "", "page cache (LRU)", "coorfs minio"
    );
    let _ = writeln!(
        out,
        "  {:>6} | {:>9} {:>10} {:>8} | {:>9} {:>10} {:>8}",
        "epoch", "seconds", "samples/s", "stall s", "seconds", "samples/s", "stall s"
    );
    let row = |label: String, p: &Policies, out: &mut String| {
        let _ = writeln!(
            out,
            "  {:>6} | {:>9.2} {:>10} {:>8} | {:>9.2} {:>10} {:>8}",
            label,
            p.page_cache.epoch_seconds,
            opt_rate(&p.page_cache),
            stall(&p.page_cache),
            p.minio.epoch_seconds,
            opt_rate(&p.minio),
            stall(&p.minio)
        );
    };
    for e in &c.epochs {
        row(e.epoch.to_string(), &e.policies, out);
    }
    row("2+".into(), &c.steady, out);
}

/// Whether the GPUs wait from epoch 2 on, and in epoch 1.
fn verdict_section(r: &Report, out: &mut String) {
    let c = &r.cache;
    let _ = writeln!(
        out,
        "\nverdict   from epoch 2 on, with a cache of {}:",
        format_size(c.cache_bytes)
    );
    let _ = writeln!(out, "  {}", verdict("page cache", &c.steady.page_cache));
    let _ = writeln!(out, "  {}", verdict("coorfs minio", &c.steady.minio));
    if let Some(first) = c.epochs.first() {
        let p = &first.policies.minio;
        match p.stall_seconds {
            Some(st) if st > 0.0 => {
                let _ = writeln!(
                    out,
                    "  epoch 1 reads everything from storage: {:.2} s, GPUs wait {st:.2} s",
                    p.fetch_seconds
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "  epoch 1 reads everything from storage: {:.2} s",
                    p.fetch_seconds
                );
            }
        }
    }
}

/// The smallest cache with no fetch stall, or what it needs to say.
fn recommendation_section(r: &Report, out: &mut String) {
    let d = &r.dataset;
    match &r.recommendation {
        Some(rec) => {
            let size = |b: Option<u64>| match b {
                Some(0) => "0 B (storage alone keeps up)".into(),
                Some(b) => format!(
                    "{} ({} of the dataset)",
                    format_size(b),
                    pct(b as f64 / d.bytes.max(1) as f64)
                ),
                None => "more than the whole dataset".into(),
            };
            let _ = writeln!(
                out,
                "\nrecommend smallest coorfs cache with no fetch stall from epoch 2 on: {}",
                size(rec.minio_cache_bytes)
            );
            let _ = writeln!(
                out,
                "          the page cache would need {}",
                size(rec.page_cache_bytes)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "\nrecommend give --rate SAMPLES_PER_SEC (what the GPUs consume) for a verdict on stalls"
            );
        }
    }
}

/// The sweep over cache sizes, if asked for.
fn sweep_section(r: &Report, out: &mut String) {
    if !r.sweep.is_empty() {
        let _ = writeln!(
            out,
            "\nsweep     epochs 2+ (mean) for cache sizes from 0 to 100% of the dataset"
        );
        let _ = writeln!(
            out,
            "  {:>6} {:>10} | {:>8} {:>8} {:>9} | {:>9} {:>9} | {:>8} {:>8}",
            "cache",
            "bytes",
            "LRU hit",
            "MinIO",
            "+prefetch",
            "LRU s",
            "MinIO s",
            "LRU st",
            "MinIO st"
        );
        for p in &r.sweep {
            let q = &p.policies;
            let _ = writeln!(
                out,
                "  {:>6} {:>10} | {:>8.3} {:>8.3} {:>9.3} | {:>9.2} {:>9.2} | {:>8} {:>8}",
                format!("{:.0}%", p.fraction * 100.0),
                format_size(p.cache_bytes),
                q.page_cache.hit_rate,
                q.minio.hit_rate,
                q.prefetch.hit_rate,
                q.page_cache.epoch_seconds,
                q.minio.epoch_seconds,
                stall(&q.page_cache),
                stall(&q.minio)
            );
        }
    }
}

/// The live mount's epochs beside the prediction, if one was read.
fn live_section(r: &Report, out: &mut String) {
    if let Some(l) = &r.live {
        let _ = writeln!(
            out,
            "\nlive      {} (policy {}, cache {}): its last complete epochs beside the prediction",
            l.mountpoint,
            l.policy,
            format_size(l.cache_capacity)
        );
        live_table("dataset", &l.epochs, &l.predicted, out);
        for j in &l.jobs {
            live_table(&j.job, &j.epochs, &l.predicted, out);
        }
    }
}

fn live_table(who: &str, epochs: &[LiveEpoch], predicted: &[Prediction], out: &mut String) {
    if epochs.is_empty() {
        let _ = writeln!(out, "  {who}: no complete epoch yet");
        return;
    }
    let _ = writeln!(
        out,
        "  {who}\n  {:>6} {:>9} {:>10} {:>9} {:>10} {:>12} {:>12} {:>10}",
        "epoch",
        "seconds",
        "predicted",
        "hit rate",
        "predicted",
        "from source",
        "fetch stall",
        "data wait"
    );
    for e in epochs {
        // Epochs past the simulated ones are in the steady state: take the last simulated.
        let p = predicted
            .get((e.epoch.max(1) - 1) as usize)
            .or(predicted.last());
        let _ = writeln!(
            out,
            "  {:>6} {:>9.2} {:>10} {:>9.3} {:>10} {:>12} {:>12} {:>10}",
            e.epoch,
            e.seconds,
            p.map(|p| format!("{:.2}", p.epoch_seconds))
                .unwrap_or("-".into()),
            e.byte_hit_rate,
            p.map(|p| format!("{:.3}", p.hit_rate))
                .unwrap_or("-".into()),
            format_size(e.bytes_from_source),
            e.fetch_stall_seconds
                .map(|s| format!("{s:.2} s"))
                .unwrap_or("-".into()),
            e.data_wait
                .map(|w| format!("{:.0}%", w * 100.0))
                .unwrap_or("-".into())
        );
    }
    // The verdict of the last epoch long enough to tell: waiting on data or on compute?
    if let Some((epoch, share)) = epochs
        .iter()
        .rev()
        .find_map(|e| Some((e.epoch, e.data_wait?)))
    {
        let _ = writeln!(
            out,
            "  {who}: epoch {epoch}: {}",
            crate::stats::DataWait { share }.verdict()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(hit: f64) -> Outcome {
        Outcome {
            hit_rate: hit,
            file_hit_rate: hit,
            storage_fraction: 1.0 - hit,
        }
    }

    const MIB: f64 = (1u64 << 20) as f64;

    /// The bench-epochs setup: 20,000 files, 2.254 GB, 200 MiB/s.
    #[test]
    fn prediction_arithmetic() {
        let rates = Rates {
            storage_bytes_per_sec: 200.0 * MIB,
            hit_files_per_sec: None,
            rate: None,
        };
        let bytes = 2_254_000_000;
        let p = predict(20_000, bytes, &outcome(0.476), true, &rates);
        let fetch = 0.524 * bytes as f64 / (200.0 * MIB);
        assert!((p.fetch_seconds - fetch).abs() < 1e-9);
        assert!((p.fetch_seconds - 5.63).abs() < 0.01, "{p:?}");
        assert_eq!(p.epoch_seconds, p.fetch_seconds);
        assert_eq!(p.stall_seconds, None);
        assert!((p.samples_per_sec.unwrap() - 20_000.0 / fetch).abs() < 1e-6);

        // GPUs at 2500 samples/s need 8 s per epoch: no stall with MinIO, 3.0 s cold.
        let rates = Rates {
            rate: Some(2500.0),
            ..rates
        };
        let warm = predict(20_000, bytes, &outcome(0.476), true, &rates);
        assert_eq!((warm.epoch_seconds, warm.stall_seconds), (8.0, Some(0.0)));
        let cold = predict(20_000, bytes, &outcome(0.0), true, &rates);
        let want = bytes as f64 / (200.0 * MIB) - 8.0;
        assert!((cold.stall_seconds.unwrap() - want).abs() < 1e-9);
        assert!((cold.stall_fraction.unwrap() - want / (want + 8.0)).abs() < 1e-9);

        // A hit path of 1000 files/s bounds coorfs's hits, not the page cache's.
        let rates = Rates {
            hit_files_per_sec: Some(1000.0),
            ..rates
        };
        let all = predict(20_000, bytes, &outcome(1.0), true, &rates);
        assert_eq!((all.fetch_seconds, all.cache_seconds), (0.0, 20.0));
        assert_eq!(all.stall_seconds, Some(12.0));
        let native = predict(20_000, bytes, &outcome(1.0), false, &rates);
        assert_eq!(
            (native.epoch_seconds, native.stall_seconds),
            (8.0, Some(0.0))
        );
        let nothing = predict(
            20_000,
            bytes,
            &outcome(1.0),
            false,
            &Rates {
                rate: None,
                ..rates
            },
        );
        assert_eq!(nothing.samples_per_sec, None);
    }

    #[test]
    fn search_finds_the_smallest_cache_that_does_not_stall() {
        // Stalled below 700: found to within the step, rounded up to it.
        assert_eq!(smallest_unstalled(1000, 10, |c| c < 700), Some(700));
        assert_eq!(smallest_unstalled(1000, 16, |c| c < 700), Some(704));
        assert_eq!(smallest_unstalled(1000, 1, |c| c < 1), Some(1));
        assert_eq!(smallest_unstalled(1000, 10, |_| false), Some(0));
        assert_eq!(smallest_unstalled(1000, 10, |_| true), None);
        assert_eq!(smallest_unstalled(1000, 64, |c| c < 999), Some(1000));
    }

    #[test]
    fn size_distribution_percentiles_and_classes() {
        let sizes: Vec<u64> = (1..=100).collect();
        let d = size_distribution(&sizes);
        assert_eq!(
            (d.min, d.median, d.p90, d.p99, d.max, d.mean),
            (1, 51, 90, 99, 100, 50)
        );
        assert_eq!(d.histogram.iter().map(|b| b.files).sum::<u64>(), 100);
        assert_eq!(d.histogram.iter().map(|b| b.bytes).sum::<u64>(), 5050);
        assert_eq!(
            d.histogram.iter().map(|b| b.up_to).collect::<Vec<_>>(),
            [1, 2, 4, 8, 16, 32, 64, 128]
        );
        assert_eq!(size_distribution(&[]), SizeDistribution::default());
    }

    #[test]
    fn live_epochs_read_old_and_new_documents() {
        let doc: Json = serde_json::json!({
            "epochs": [
                {"epoch": 1, "seconds": 10.0, "complete": true, "hit_rate": 0.0,
                 "bytes_from_cache": 0, "bytes_from_source": 1000},
                {"epoch": 2, "seconds": 5.0, "complete": true, "hit_rate": 0.5,
                 "bytes_from_cache": 600, "bytes_from_source": 400, "fetch_stall_seconds": 1.5,
                 "readers": 2, "data_wait_seconds": 4.0},
                {"epoch": 3, "seconds": 1.0, "complete": false, "hit_rate": 0.5}
            ],
            "jobs": [{"job": "pgid 42", "epoch": 2, "epochs": [
                {"epoch": 1, "seconds": 9.0, "complete": true, "hit_rate": 0.25}
            ]}]
        });
        let e = live_epochs(doc.get("epochs"), 5);
        assert_eq!(e.len(), 2, "the running epoch is left out");
        assert_eq!(e[0].fetch_stall_seconds, None);
        assert_eq!(
            e[1],
            LiveEpoch {
                epoch: 2,
                seconds: 5.0,
                hit_rate: 0.5,
                byte_hit_rate: 0.6,
                bytes_from_source: 400,
                fetch_stall_seconds: Some(1.5),
                data_wait: Some(0.4),
            }
        );
        assert_eq!(e[0].data_wait, None, "an older daemon's record");
        assert_eq!(live_epochs(doc.get("epochs"), 1)[0].epoch, 2);
        let jobs = live_jobs(&doc, 3);
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].job, "pgid 42");
        assert_eq!(
            jobs[0].epochs[0].byte_hit_rate, 0.25,
            "falls back to hit_rate"
        );
        assert!(live_jobs(&serde_json::json!({}), 3).is_empty());
        assert!(live_epochs(None, 3).is_empty());
    }

    #[test]
    fn renders_the_verdict_and_the_recommendation() {
        let rates = Rates {
            storage_bytes_per_sec: 200.0 * MIB,
            hit_files_per_sec: None,
            rate: Some(2500.0),
        };
        let mut r = Report {
            dataset: DatasetReport {
                path: "/data".into(),
                files: 20_000,
                bytes: 2_254_000_000,
                simulated_files: 20_000,
                ..Default::default()
            },
            rate: Some(2500.0),
            compute_seconds: Some(8.0),
            epochs: 2,
            recommendation: Some(Recommendation {
                minio_cache_bytes: Some(600 << 20),
                page_cache_bytes: None,
            }),
            ..Default::default()
        };
        let lru = [outcome(0.0), outcome(0.13)];
        let minio = [outcome(0.0), outcome(0.476)];
        r.cache.cache_bytes = 1 << 30;
        r.cache.epochs = (0..2)
            .map(|i| EpochRow {
                epoch: i as u32 + 1,
                policies: r.policies([&lru[i], &minio[i], &minio[i]], &rates),
            })
            .collect();
        r.cache.steady = r.cache.epochs[1].policies;
        let text = render(&r);
        for want in [
            "dataset   /data: 20000 files, 2.1 GiB",
            "page cache: fetch-stalled: GPUs wait 1.35 s of every 9.35 s epoch (14.4%)",
            "coorfs minio: no fetch stall",
            "epoch 1 reads everything from storage: 10.75 s, GPUs wait 2.75 s",
            "smallest coorfs cache with no fetch stall from epoch 2 on: 600 MiB (27.9% of the dataset)",
            "the page cache would need more than the whole dataset",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
    }

    #[test]
    fn a_live_table_ends_with_the_verdict_of_its_last_epoch_that_tells() {
        let epoch = |epoch, data_wait| LiveEpoch {
            epoch,
            seconds: 2.0,
            data_wait,
            ..Default::default()
        };
        let mut out = String::new();
        live_table(
            "pgid 7",
            &[epoch(1, Some(0.8)), epoch(2, None)],
            &[],
            &mut out,
        );
        assert!(
            out.ends_with("  pgid 7: epoch 1: data-bound 80%: more cache or prefetch helps\n"),
            "{out}"
        );
        let mut out = String::new();
        live_table("pgid 7", &[epoch(1, None)], &[], &mut out);
        assert!(!out.contains("-bound"), "{out}");
        assert!(out.contains(" data wait"), "{out}");
    }
}
