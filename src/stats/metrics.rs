//! Prometheus metrics (`--metrics-addr`): every statistic of the mount, as a scrape of
//! `GET /metrics` on the address given, encoded by the `prometheus-client` crate.
//!
//! Each statistic of the stats table is the gauge `coorfs_NAME` (the same name as its
//! attribute: `coorfs_hit_rate`, `coorfs_bytes_from_source`), read from the mount's snapshot
//! at each scrape. The dataset's last [`EPOCHS`] epochs are `coorfs_epoch_FIELD{epoch="N"}`
//! (hit rate, seconds, bytes from the cache, the source and peers, fetch stall, ...), and the
//! active jobs, at most [`JOBS`] of them, `coorfs_job_FIELD{job="..."}` for their current
//! epoch: the labels are bounded in number whatever the mount has seen. Statistics name no
//! file, as the `user.coorfs.*` attributes do not.
//!
//! The server listens only on the address given (127.0.0.1:9464, say), answers only
//! `GET /metrics` (404 otherwise), and serves at most [`MAX_SCRAPES`] scrapes at once (503
//! past that).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::stats::view::number;
use crate::stats::{Snapshot, Value};

/// The dataset's epochs exported, the most recent.
pub const EPOCHS: usize = 8;
/// The active jobs exported, the most recently active.
pub const JOBS: usize = 16;
/// Scrapes served at once.
pub const MAX_SCRAPES: usize = 4;

/// The epoch record fields exported per epoch and per job, with their help.
const EPOCH_FIELDS: &[(&str, &str)] = &[
    (
        "hit_rate",
        "Reads of files wholly in the cache when opened, of all reads.",
    ),
    (
        "seconds",
        "Seconds from the epoch's first open to its last.",
    ),
    ("files", "Distinct files read."),
    ("reads", "File reads (opens that read)."),
    ("bytes_from_cache", "Bytes served from the cache."),
    ("bytes_from_source", "Bytes read from the source."),
    (
        "bytes_from_peers",
        "Bytes read from other members of the cluster.",
    ),
    (
        "fetch_stall_seconds",
        "Seconds reads waited for the source.",
    ),
    (
        "data_wait_seconds",
        "Seconds reader processes waited for data, each process counted once.",
    ),
    ("readers", "Reader processes that opened files."),
    ("staging_hits", "Accesses served by prefetch."),
];

/// Takes the mount's statistics, at each scrape.
pub type Snapshots = Box<dyn Fn() -> Snapshot + Send + Sync>;

/// Reads the mount's statistics at each scrape.
struct Stats(Snapshots);

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stats")
    }
}

/// The gauge `name`: one value (with no labels), or one series per set of labels.
fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Vec<(&'static str, String)>, f64)],
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    if let [(labels, value)] = series
        && labels.is_empty()
    {
        return ConstGauge::new(*value).encode(metric);
    }
    for (labels, value) in series {
        ConstGauge::new(*value).encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for Stats {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot: Snapshot = (self.0)();
        for (stat, value) in &snapshot.values {
            let (labels, v) = match *value {
                Value::Count(n) => (Vec::new(), n as f64),
                Value::Ratio(r) => (Vec::new(), r),
                // A word: one series of 1, labelled with it (coorfs_transport{transport="io_uring"}).
                Value::Text(t) => (vec![(stat.name(), t.to_string())], 1.0),
            };
            gauge(&mut encoder, stat.name(), stat.help(), &[(labels, v)])?;
        }
        let epochs: Vec<serde_json::Value> = snapshot
            .epochs
            .iter()
            .rev()
            .take(EPOCHS)
            .map(|e| serde_json::to_value(e).unwrap_or_default())
            .collect();
        let jobs: Vec<&serde_json::Value> = snapshot
            .jobs
            .as_array()
            .into_iter()
            .flatten()
            .filter(|j| j.get("active").and_then(serde_json::Value::as_bool) == Some(true))
            .take(JOBS)
            .collect();
        for (field, help) in EPOCH_FIELDS {
            let series: Vec<_> = epochs
                .iter()
                .map(|e| {
                    let epoch = number(e, "epoch").to_string();
                    (vec![("epoch", epoch)], number(e, field))
                })
                .collect();
            gauge(&mut encoder, &format!("epoch_{field}"), help, &series)?;
            let series: Vec<_> = jobs
                .iter()
                .filter_map(|j| {
                    let name = j.get("job")?.as_str()?.to_string();
                    let current = j.get("epochs")?.as_array()?.last()?;
                    Some((vec![("job", name)], number(current, field)))
                })
                .collect();
            let help = format!("{help} Of the job's current epoch.");
            gauge(&mut encoder, &format!("job_{field}"), &help, &series)?;
        }
        Ok(())
    }
}

/// What the server holds.
struct Served {
    registry: Registry,
    slots: tokio::sync::Semaphore,
}

async fn scrape(State(s): State<Arc<Served>>) -> Response {
    let Ok(_slot) = s.slots.try_acquire() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response();
    };
    let served = s.clone();
    // The snapshot takes locks: off the runtime's one worker.
    let text = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &served.registry).map(|()| text)
    })
    .await;
    match text {
        Ok(Ok(text)) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        _ => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Serves the statistics that `snapshots` takes on `listener` (bound already), on the
/// runtime of `rt`.
pub fn serve(
    snapshots: Snapshots,
    listener: std::net::TcpListener,
    rt: &tokio::runtime::Handle,
) -> std::io::Result<()> {
    let mut registry = Registry::with_prefix("coorfs");
    registry.register_collector(Box::new(Stats(snapshots)));
    let served = Arc::new(Served {
        registry,
        slots: tokio::sync::Semaphore::new(MAX_SCRAPES),
    });
    let app = Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .with_state(served);
    listener.set_nonblocking(true)?;
    let _guard = rt.enter();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    rt.spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("the metrics server stopped: {e}");
        }
    });
    Ok(())
}
