//! `coorfs analyze`: measure and predict data stalls before training, DS-Analyzer's "what-if"
//! analysis (Mohan et al., VLDB 2021) in one command instead of three measurement runs.
//!
//! 1. [`scan`]: every file's size, and a random sample of files (fixed by `--seed`).
//! 2. [`measure`]: random whole-file reads of the sample that bypass the page cache, at queue
//!    depths 1, 4, 16 and 64, within `--time`; with `--mount`, reads of cached files through
//!    the mount too (the hit path).
//! 3. [`simulate`] (pure): the per-epoch hit rates of the page cache (LRU), coorfs's MinIO and
//!    MinIO with prefetch, for the real sizes, at one cache size or a sweep.
//! 4. [`report`]: epoch time = max(storage bytes / measured throughput, hits / hit path,
//!    compute), the stall against `--rate`, the smallest cache without a stall; as text, JSON
//!    and, through [`plot`], SVG.
//! 5. With `--mount`, the mount's own last epochs beside the prediction.
//!
//! Everything that can be checked is checked before the measurement starts (the dataset, the
//! output files, the mount), so that bad input costs no waiting. Progress goes to stderr:
//! a bar on a terminal, and one summary line per phase either way.

pub mod measure;
pub mod plot;
pub mod report;
pub mod scan;
pub mod simulate;

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value as Json;

use crate::cache::PolicyKind;
use crate::stats::view::StatsError;
use crate::units::format_size;
use measure::{DEPTHS, ReadPath};
use report::{
    CacheReport, DatasetReport, LiveCheck, PathReport, Policies, Rates, Recommendation, Report,
    SweepPoint,
};
use simulate::{EpochSim, Policy, Workload};

/// Files sampled for reading: enough distinct files for depth 64 and for seconds of a fast
/// disk (16,384 files of 110 KiB are 1.7 GiB); past that the sample is read again, from
/// storage again since its pages were dropped.
pub const SAMPLE_FILES: usize = 16_384;

/// Sampled files checked for being cached by a mount (one getxattr each through FUSE): plenty
/// to keep 64 readers busy.
const HIT_CANDIDATES: usize = 2048;

/// The sweep's step: 21 cache sizes from 0 to 100% of the dataset.
const SWEEP_STEPS: u64 = 20;

/// Epochs of a mount shown beside the prediction.
const LIVE_EPOCHS: usize = 5;

/// Epochs simulated while searching for the smallest cache: the first and two steady ones.
const SEARCH_EPOCHS: u32 = 3;

/// What to analyse and how. The CLI fills it in; every field says its unit.
#[derive(Clone, Debug)]
pub struct AnalyzeConfig {
    /// The dataset directory.
    pub dataset: PathBuf,
    /// Bytes of cache to analyse. None: the mount's with `mount`, else what `coorfs mount`'s
    /// elastic budget would start at here (`crate::elastic::default_capacity`), at most the
    /// dataset.
    pub cache_size: Option<u64>,
    /// Also simulate cache sizes from 0 to 100% of the dataset, in steps of 5%.
    pub sweep: bool,
    /// Samples (files) per second the GPUs consume; None: no verdict on stalls.
    pub rate: Option<f64>,
    /// Epochs to simulate (2 or more: epoch 1 is always cold).
    pub epochs: u32,
    /// Bytes of the prefetcher's staging buffer, beyond the cache.
    pub staging: u64,
    /// Wall-clock time of all read measurements together, split evenly across depths.
    pub time: Duration,
    /// Seed of the sample and of the simulated orders.
    pub seed: u64,
    /// A live coorfs mount of the dataset: read its cached files, show its epochs.
    pub mount: Option<PathBuf>,
    /// Where to write the JSON report; `-` writes it to stdout instead of the text.
    pub json: Option<PathBuf>,
    /// Where to write the SVG plot.
    pub plot: Option<PathBuf>,
}

/// Why the analysis stopped. Each is one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("dataset {0}: no such file or directory")]
    Missing(PathBuf),
    #[error("dataset {0}: not a directory")]
    NotADirectory(PathBuf),
    #[error("dataset {0}: {1}")]
    Unreadable(PathBuf, io::Error),
    #[error("dataset {0} has no regular files")]
    Empty(PathBuf),
    #[error("dataset {path} holds no data: its {files} regular files are all empty")]
    NoData { path: PathBuf, files: u64 },
    #[error(
        "dataset {path} is on {fs}, a pseudo filesystem whose files the kernel makes up as they \
         are read: there is no storage to measure"
    )]
    PseudoFilesystem { path: PathBuf, fs: &'static str },
    #[error(
        "cache size {cache} is larger than the dataset ({dataset}): it all fits, there is nothing \
         to predict (give at most {dataset}, or --sweep)"
    )]
    CacheTooLarge { cache: String, dataset: String },
    #[error("--{flag} {path}: {err}")]
    Output {
        flag: &'static str,
        path: PathBuf,
        err: io::Error,
    },
    #[error("--mount: {0}")]
    Mount(StatsError),
    #[error("--mount {mount} serves {served}, not {dataset}")]
    OtherDataset {
        mount: PathBuf,
        served: String,
        dataset: PathBuf,
    },
    #[error("none of the {tried} sampled files of {dataset} could be read (first: {first})")]
    NothingReadable {
        dataset: PathBuf,
        tried: u64,
        first: String,
    },
    #[error("writing {0}: {1}")]
    Write(String, io::Error),
    #[error("drawing {0}: {1}")]
    Plot(PathBuf, String),
}

/// Progress on stderr: a bar while a phase runs (on a terminal), a summary line when it ends.
struct Phase {
    bar: Option<ProgressBar>,
    name: &'static str,
    started: Instant,
}

impl Phase {
    /// A phase of `len` steps (None: a spinner).
    fn start(name: &'static str, len: Option<u64>) -> Phase {
        let bar = io::stderr().is_terminal().then(|| {
            let (bar, template) = match len {
                Some(n) => (
                    ProgressBar::new(n),
                    "{prefix:>9} [{bar:30}] {percent:>3}% {msg}",
                ),
                None => (ProgressBar::new_spinner(), "{prefix:>9} {spinner} {msg}"),
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(name);
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Phase {
            bar,
            name,
            started: Instant::now(),
        }
    }

    fn update(&self, pos: u64, msg: impl FnOnce() -> String) {
        if let Some(bar) = &self.bar {
            bar.set_position(pos);
            bar.set_message(msg());
        }
    }

    fn finish(self, summary: &str) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        eprintln!(
            "coorfs analyze: {}: {summary} ({:.1} s)",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
    }

    /// Ends the phase without a summary (it failed).
    fn abandon(self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Output files created up front (to fail before measuring), removed again if the analysis
/// fails.
struct Outputs {
    created: Vec<PathBuf>,
    done: bool,
}

impl Outputs {
    fn create(&mut self, flag: &'static str, path: &Path) -> Result<(), AnalyzeError> {
        std::fs::File::create(path).map_err(|err| AnalyzeError::Output {
            flag,
            path: path.to_path_buf(),
            err,
        })?;
        self.created.push(path.to_path_buf());
        Ok(())
    }
}

impl Drop for Outputs {
    fn drop(&mut self) {
        if !self.done {
            for p in &self.created {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

fn check_dataset(dir: &Path) -> Result<PathBuf, AnalyzeError> {
    let meta = std::fs::metadata(dir).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => AnalyzeError::Missing(dir.to_path_buf()),
        _ => AnalyzeError::Unreadable(dir.to_path_buf(), e),
    })?;
    if !meta.is_dir() {
        return Err(AnalyzeError::NotADirectory(dir.to_path_buf()));
    }
    if let Some(fs) = scan::pseudo_filesystem(dir) {
        return Err(AnalyzeError::PseudoFilesystem {
            path: dir.to_path_buf(),
            fs,
        });
    }
    std::fs::read_dir(dir).map_err(|e| AnalyzeError::Unreadable(dir.to_path_buf(), e))?;
    std::fs::canonicalize(dir).map_err(|e| AnalyzeError::Unreadable(dir.to_path_buf(), e))
}

/// The stats document of the mount, checked to serve `dataset`.
fn check_mount(mnt: &Path, dataset: &Path) -> Result<(PathBuf, Json), AnalyzeError> {
    let doc = crate::stats::view::fetch(mnt).map_err(AnalyzeError::Mount)?;
    let mnt = std::path::absolute(mnt).unwrap_or_else(|_| mnt.to_path_buf());
    let source = doc.get("source").and_then(Json::as_str).unwrap_or("?");
    if Path::new(source) != dataset {
        return Err(AnalyzeError::OtherDataset {
            mount: mnt,
            served: source.to_string(),
            dataset: dataset.to_path_buf(),
        });
    }
    Ok((mnt, doc))
}

/// Sampled files that the mount holds whole in its cache, as paths inside the mount, with
/// their sizes.
fn cached_through(mnt: &Path, sample: &[scan::SampledFile]) -> Vec<(PathBuf, u64)> {
    sample
        .iter()
        .take(HIT_CANDIDATES)
        .filter(|f| {
            xattr::get(mnt.join(&f.rel), crate::stats::CACHED_XATTR)
                .ok()
                .flatten()
                .and_then(|v| String::from_utf8(v).ok()?.trim().parse::<u64>().ok())
                == Some(f.size)
        })
        .map(|f| (mnt.join(&f.rel), f.size))
        .collect()
}

fn measure_path(
    name: &'static str,
    what: String,
    files: &[(PathBuf, u64)],
    per_depth: Duration,
    path: ReadPath,
) -> PathReport {
    let total = per_depth.as_secs_f64() * DEPTHS.len() as f64;
    let phase = Phase::start(name, Some(1000));
    let m = measure::measure(files, &DEPTHS, per_depth, path, &|t| {
        let done = (t.as_secs_f64() / total).min(1.0);
        phase.update((done * 1000.0) as u64, || {
            format!("{:.0} s", t.as_secs_f64())
        });
    });
    let best = measure::best_useful(&m.depths).cloned();
    let report = PathReport {
        what,
        files: files.len() as u64,
        seconds_per_depth: per_depth.as_secs_f64(),
        best_depth: best.as_ref().map(|b| b.depth),
        mib_per_sec: best.as_ref().map_or(0.0, |b| b.mib_per_sec),
        files_per_sec: best.as_ref().map_or(0.0, |b| b.files_per_sec),
        depths: m.depths,
        unreadable: m.unreadable,
        first_unreadable: m.first_error,
    };
    match report.best_depth {
        Some(depth) => phase.finish(&format!(
            "{:.1} MiB/s, {:.0} files/s at depth {depth}",
            report.mib_per_sec, report.files_per_sec
        )),
        None => phase.abandon(),
    }
    report
}

/// The three policies at one cache size.
struct CacheSims {
    lru: Vec<EpochSim>,
    minio: Vec<EpochSim>,
    prefetch: Vec<EpochSim>,
}

fn simulate_cache(work: &Workload, capacity: u64, staging: u64) -> CacheSims {
    std::thread::scope(|s| {
        let lru = s.spawn(|| work.run(Policy::Lru, capacity));
        let prefetch = s.spawn(|| work.run(Policy::MinIoPrefetch { staging }, capacity));
        let minio = work.run(Policy::MinIo, capacity);
        CacheSims {
            lru: lru.join().unwrap_or_default(),
            minio,
            prefetch: prefetch.join().unwrap_or_default(),
        }
    })
}

/// Runs the analysis and writes its report to `out` (text, or JSON with `--json -`) and to
/// the files the config names.
pub fn run(config: &AnalyzeConfig, out: &mut dyn Write) -> Result<Report, AnalyzeError> {
    let dataset = check_dataset(&config.dataset)?;
    let mut outputs = Outputs {
        created: Vec::new(),
        done: false,
    };
    if let Some(p) = json_file(config) {
        outputs.create("json", p)?;
    }
    if let Some(p) = &config.plot {
        outputs.create("plot", p)?;
    }
    let live = match &config.mount {
        Some(mnt) => Some(check_mount(mnt, &dataset)?),
        None => None,
    };
    let scan = scan_dataset(&dataset, config)?;
    let mut warnings = Vec::new();
    if scan.errors > 0 {
        warnings.push(format!(
            "could not scan {} of the dataset's entries; they are left out (first: {})",
            scan.errors,
            scan.first_error.as_deref().unwrap_or("?")
        ));
    }
    let (storage, hit_path) = measure_paths(&dataset, &scan, live.as_ref(), config, &mut warnings)?;
    for w in &warnings {
        eprintln!("coorfs: warning: {w}");
    }

    let files = scan.sizes.len() as u64;
    let rates = Rates {
        storage_bytes_per_sec: storage.mib_per_sec * (1u64 << 20) as f64,
        hit_files_per_sec: hit_path.as_ref().map(|h| h.files_per_sec),
        rate: config.rate,
    };
    let mut report = Report {
        dataset: DatasetReport {
            path: dataset.display().to_string(),
            files,
            bytes: scan.bytes,
            sizes: report::size_distribution(&scan.sizes),
            scan_errors: scan.errors,
            first_scan_error: scan.first_error.clone(),
            simulated_files: files.min(simulate::SIM_FILES as u64),
        },
        storage,
        hit_path,
        rate: config.rate,
        compute_seconds: config.rate.map(|r| files as f64 / r),
        epochs: config.epochs,
        seed: config.seed,
        staging_bytes: config.staging,
        warnings,
        ..Default::default()
    };
    predict_all(&mut report, &scan.sizes, config, live.as_ref(), &rates);
    write_outputs(&report, config, out)?;
    outputs.done = true;
    Ok(report)
}

/// The JSON file to write, unless it is stdout.
fn json_file(config: &AnalyzeConfig) -> Option<&Path> {
    config.json.as_deref().filter(|p| *p != Path::new("-"))
}

/// Scans the dataset and checks what needs its size.
fn scan_dataset(dataset: &Path, config: &AnalyzeConfig) -> Result<scan::Scan, AnalyzeError> {
    let phase = Phase::start("scan", None);
    let scan = scan::scan(
        dataset,
        SAMPLE_FILES,
        config.seed,
        scan::SCAN_THREADS,
        &|f, b| phase.update(f, || format!("{f} files, {}", format_size(b))),
    );
    if scan.sizes.is_empty() {
        phase.abandon();
        return Err(AnalyzeError::Empty(dataset.to_path_buf()));
    }
    // Nothing to read: every throughput, hit rate and epoch time would be 0/0.
    if scan.bytes == 0 {
        phase.abandon();
        return Err(AnalyzeError::NoData {
            path: dataset.to_path_buf(),
            files: scan.sizes.len() as u64,
        });
    }
    if let Some(c) = config.cache_size.filter(|&c| c > scan.bytes) {
        phase.abandon();
        return Err(AnalyzeError::CacheTooLarge {
            cache: format_size(c),
            dataset: format_size(scan.bytes),
        });
    }
    phase.finish(&format!(
        "{} files, {}",
        scan.sizes.len(),
        format_size(scan.bytes)
    ));
    Ok(scan)
}

/// Measures the storage and, with a live mount that has cached files, the hit path; the
/// time is split evenly across every depth of both.
fn measure_paths(
    dataset: &Path,
    scan: &scan::Scan,
    live: Option<&(PathBuf, Json)>,
    config: &AnalyzeConfig,
    warnings: &mut Vec<String>,
) -> Result<(PathReport, Option<PathReport>), AnalyzeError> {
    let hit_files = live
        .map(|(mnt, _)| cached_through(mnt, &scan.sample))
        .unwrap_or_default();
    let paths = if hit_files.is_empty() { 1 } else { 2 };
    let per_depth = config.time / (DEPTHS.len() as u32 * paths);
    let storage_files: Vec<(PathBuf, u64)> = scan
        .sample
        .iter()
        .map(|f| (dataset.join(&f.rel), f.size))
        .collect();
    let storage = measure_path(
        "storage",
        "page cache bypassed".into(),
        &storage_files,
        per_depth,
        ReadPath::Storage,
    );
    if storage.best_depth.is_none() {
        return Err(AnalyzeError::NothingReadable {
            dataset: dataset.to_path_buf(),
            tried: storage.files,
            first: storage.first_unreadable.unwrap_or_else(|| "?".into()),
        });
    }
    if storage.unreadable > 0 {
        warnings.push(format!(
            "{} of {} sampled files could not be read and were skipped (first: {})",
            storage.unreadable,
            storage.files,
            storage.first_unreadable.as_deref().unwrap_or("?")
        ));
    }
    let hit_path = match live {
        Some((mnt, _)) if !hit_files.is_empty() => Some(measure_path(
            "hit path",
            format!("cached files through {}", mnt.display()),
            &hit_files,
            per_depth,
            ReadPath::Cached,
        )),
        Some((mnt, _)) => {
            warnings.push(format!(
                "{} has none of the sampled files cached: read an epoch through it to measure \
                 its hit path",
                mnt.display()
            ));
            None
        }
        None => None,
    };
    Ok((storage, hit_path))
}

/// Simulates and predicts: the analysed cache size, the sweep, the smallest caches without
/// a stall (with a rate), and the live mount's cache.
fn predict_all(
    report: &mut Report,
    sizes: &[u64],
    config: &AnalyzeConfig,
    live: Option<&(PathBuf, Json)>,
    rates: &Rates,
) {
    let (files, bytes) = (report.dataset.files, report.dataset.bytes);
    let live_capacity = live
        .and_then(|(_, doc)| doc.get("cache_capacity").and_then(Json::as_u64))
        .filter(|&c| c > 0);
    let cache_bytes = config
        .cache_size
        .or(live_capacity)
        .unwrap_or_else(crate::elastic::default_capacity)
        .min(bytes);
    let sweep = config.sweep || config.plot.is_some();
    // A binary search takes about log2(1000) + 2 simulations per policy (the step is 1/1000
    // of the dataset); the bar is a guide, not a promise.
    let searches = if config.rate.is_some() { 2 * 12 } else { 0 };
    let phase = Phase::start(
        "simulate",
        Some(1 + if sweep { SWEEP_STEPS + 1 } else { 0 } + searches),
    );
    let work = Workload::new(sizes, config.epochs, config.seed);
    let sims = simulate_cache(&work, cache_bytes, config.staging);
    report.cache = CacheReport {
        cache_bytes,
        fraction: cache_bytes as f64 / bytes as f64,
        epochs: report.epoch_rows([&sims.lru, &sims.minio, &sims.prefetch], rates),
        steady: steady_policies(report, &sims, rates),
    };
    let mut done = 1;
    phase.update(done, String::new);
    if sweep {
        for step in 0..=SWEEP_STEPS {
            let capacity = bytes * step / SWEEP_STEPS;
            let sims = simulate_cache(&work, capacity, config.staging);
            let policies = steady_policies(report, &sims, rates);
            report.sweep.push(SweepPoint {
                cache_bytes: capacity,
                fraction: step as f64 / SWEEP_STEPS as f64,
                policies,
            });
            done += 1;
            phase.update(done, || format!("cache {}", format_size(capacity)));
        }
    }
    if config.rate.is_some() {
        let search = Workload {
            epochs: config.epochs.min(SEARCH_EPOCHS),
            ..work.clone()
        };
        let step = (bytes / 1000).max(1 << 20);
        let mut smallest = |policy: Policy| {
            let max = sizes
                .iter()
                .map(|&s| simulate::footprint(s, policy.align()))
                .sum();
            report::smallest_unstalled(max, step, |capacity| {
                done += 1;
                phase.update(done, || format!("search, cache {}", format_size(capacity)));
                let outcome = simulate::steady(&search.run(policy, capacity));
                let coorfs = policy != Policy::Lru;
                let p = report::predict(files, bytes, &outcome, coorfs, rates);
                p.stall_seconds.unwrap_or(0.0) > 1e-6
            })
        };
        report.recommendation = Some(Recommendation {
            minio_cache_bytes: smallest(Policy::MinIo),
            page_cache_bytes: smallest(Policy::Lru),
        });
    }
    if let Some((mnt, doc)) = live {
        report.live = Some(live_check(mnt, doc, &work, report, rates));
    }
    phase.finish(&format!(
        "{} epochs of {} files{}",
        config.epochs,
        report.dataset.simulated_files,
        if sweep { ", 21 cache sizes" } else { "" }
    ));
}

/// The text or JSON to `out`, the JSON file, the plot.
fn write_outputs(
    report: &Report,
    config: &AnalyzeConfig,
    out: &mut dyn Write,
) -> Result<(), AnalyzeError> {
    let json = serde_json::to_string_pretty(report).unwrap_or_default();
    let text = if config.json.as_deref() == Some(Path::new("-")) {
        format!("{json}\n")
    } else {
        report::render(report)
    };
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| AnalyzeError::Write("stdout".into(), e))?;
    if let Some(p) = json_file(config) {
        std::fs::write(p, format!("{json}\n"))
            .map_err(|e| AnalyzeError::Write(p.display().to_string(), e))?;
    }
    if let Some(p) = &config.plot {
        let marks = plot::Marks {
            dataset_bytes: report.dataset.bytes,
            cache_bytes: report.cache.cache_bytes,
            compute_seconds: report.compute_seconds,
        };
        plot::draw(p, &report.sweep, &marks).map_err(|e| AnalyzeError::Plot(p.clone(), e))?;
    }
    Ok(())
}

fn steady_policies(report: &Report, sims: &CacheSims, rates: &Rates) -> Policies {
    report.policies(
        [
            &simulate::steady(&sims.lru),
            &simulate::steady(&sims.minio),
            &simulate::steady(&sims.prefetch),
        ],
        rates,
    )
}

/// The mount's last epochs and what the simulator predicts for its policy and cache size.
fn live_check(mnt: &Path, doc: &Json, work: &Workload, r: &Report, rates: &Rates) -> LiveCheck {
    let policy = doc.get("policy").and_then(Json::as_str).unwrap_or("?");
    let capacity = doc
        .get("cache_capacity")
        .and_then(Json::as_u64)
        .unwrap_or(0);
    let sim_policy = match PolicyKind::from_name(policy) {
        Some(PolicyKind::MinIo) => Some(Policy::MinIo),
        Some(PolicyKind::Lru) => Some(Policy::Lru),
        Some(PolicyKind::None) | None => None,
    };
    let predicted = sim_policy
        .map(|p| {
            work.run(p, capacity.min(r.dataset.bytes))
                .iter()
                .map(|e| {
                    report::predict(r.dataset.files, r.dataset.bytes, &e.outcome(), true, rates)
                })
                .collect()
        })
        .unwrap_or_default();
    LiveCheck {
        mountpoint: mnt.display().to_string(),
        policy: policy.to_string(),
        cache_capacity: capacity,
        epochs: report::live_epochs(doc.get("epochs"), LIVE_EPOCHS),
        jobs: report::live_jobs(doc, LIVE_EPOCHS),
        predicted,
    }
}
