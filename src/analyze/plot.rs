//! The `--plot` figure: hit rate and predicted epoch time against cache size, for the page
//! cache (LRU), coorfs's MinIO and MinIO with prefetch, as SVG (plotters' SVG backend: no
//! fonts or bitmaps to link, any browser shows it).

use std::path::Path;

use plotters::prelude::*;

use super::report::SweepPoint;
use crate::units::format_size;

/// Pixels: wide enough for the legends, two panels stacked.
const SIZE: (u32, u32) = (900, 760);

/// What to draw besides the sweep.
#[derive(Clone, Copy, Debug)]
pub struct Marks {
    /// The dataset's bytes (for the axis caption).
    pub dataset_bytes: u64,
    /// The analysed cache size, bytes (a vertical line).
    pub cache_bytes: u64,
    /// Seconds of GPU compute per epoch (a horizontal line), with --rate.
    pub compute_seconds: Option<f64>,
}

/// A line: its legend, its colour, and the value it draws of each sweep point.
type Series = (&'static str, RGBColor, fn(&SweepPoint) -> f64);

const LRU: RGBColor = RGBColor(214, 39, 40);
const MINIO: RGBColor = RGBColor(31, 119, 180);
const PREFETCH: RGBColor = RGBColor(44, 160, 44);

/// Draws `sweep` to the SVG file `path`: hit rates above, epoch times below.
pub fn draw(path: &Path, sweep: &[SweepPoint], marks: &Marks) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|x| x.to_string())?;
    let (top, bottom) = root.split_vertically(SIZE.1 / 2);
    let panel = Panel {
        sweep,
        marks,
        x_caption: format!(
            "cache size, % of the dataset ({})",
            format_size(marks.dataset_bytes)
        ),
        cache_pct: marks.cache_bytes as f64 / marks.dataset_bytes.max(1) as f64 * 100.0,
    };
    draw_hit_rates(&top, &panel)?;
    draw_epoch_times(&bottom, &panel)?;
    root.present().map_err(|x| x.to_string())
}

/// What both panels draw from.
struct Panel<'a> {
    sweep: &'a [SweepPoint],
    marks: &'a Marks,
    x_caption: String,
    /// The analysed cache size, % of the dataset (a vertical line).
    cache_pct: f64,
}

impl Panel<'_> {
    /// The line of `f` over the sweep: (cache %, value).
    fn points(&self, f: fn(&SweepPoint) -> f64) -> Vec<(f64, f64)> {
        self.sweep
            .iter()
            .map(|p| (p.fraction * 100.0, f(p)))
            .collect()
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// The byte hit rate of epochs 2+ against cache size, per policy.
fn draw_hit_rates(top: &Area<'_>, panel: &Panel<'_>) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let (x_caption, cache_pct) = (&panel.x_caption, panel.cache_pct);
    let points = |f| panel.points(f);
    let mut hits = ChartBuilder::on(top)
        .caption("byte hit rate, epochs 2+", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..100.0, 0.0..1.0)
        .map_err(|x| e(&x))?;
    hits.configure_mesh()
        .x_desc(x_caption.as_str())
        .y_desc("hit rate")
        .draw()
        .map_err(|x| e(&x))?;
    let series: [Series; 3] = [
        ("page cache (LRU)", LRU, |p| p.policies.page_cache.hit_rate),
        ("coorfs minio", MINIO, |p| p.policies.minio.hit_rate),
        ("minio + prefetch", PREFETCH, |p| {
            p.policies.prefetch.hit_rate
        }),
    ];
    for (name, color, f) in series {
        hits.draw_series(LineSeries::new(points(f), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    hits.draw_series(LineSeries::new(
        [(cache_pct, 0.0), (cache_pct, 1.0)],
        BLACK.mix(0.4),
    ))
    .map_err(|x| e(&x))?;
    hits.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    Ok(())
}

/// The predicted epoch time of epochs 2+ against cache size, per policy, with the GPUs'
/// compute time if given.
fn draw_epoch_times(bottom: &Area<'_>, panel: &Panel<'_>) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let (sweep, marks) = (panel.sweep, panel.marks);
    let (x_caption, cache_pct) = (&panel.x_caption, panel.cache_pct);
    let points = |f| panel.points(f);
    let top_time = sweep
        .iter()
        .map(|p| {
            p.policies
                .page_cache
                .epoch_seconds
                .max(p.policies.minio.epoch_seconds)
        })
        .chain(marks.compute_seconds)
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.1;
    let mut times = ChartBuilder::on(bottom)
        .caption("predicted epoch time, epochs 2+", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..100.0, 0.0..top_time)
        .map_err(|x| e(&x))?;
    times
        .configure_mesh()
        .x_desc(x_caption.as_str())
        .y_desc("seconds")
        .draw()
        .map_err(|x| e(&x))?;
    let series: [Series; 2] = [
        ("page cache (LRU)", LRU, |p| {
            p.policies.page_cache.epoch_seconds
        }),
        ("coorfs minio", MINIO, |p| p.policies.minio.epoch_seconds),
    ];
    for (name, color, f) in series {
        times
            .draw_series(LineSeries::new(points(f), color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    if let Some(c) = marks.compute_seconds {
        times
            .draw_series(LineSeries::new(
                [(0.0, c), (100.0, c)],
                BLACK.stroke_width(1),
            ))
            .map_err(|x| e(&x))?
            .label("GPU compute per epoch (--rate)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    }
    times
        .draw_series(LineSeries::new(
            [(cache_pct, 0.0), (cache_pct, top_time)],
            BLACK.mix(0.4),
        ))
        .map_err(|x| e(&x))?;
    times
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::report::{Policies, Prediction};

    #[test]
    fn writes_an_svg_with_every_series() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        let sweep: Vec<SweepPoint> = (0..=4)
            .map(|i| {
                let f = i as f64 / 4.0;
                let p = |hit: f64| Prediction {
                    hit_rate: hit,
                    epoch_seconds: 10.0 * (1.0 - hit),
                    ..Default::default()
                };
                SweepPoint {
                    cache_bytes: i * 100,
                    fraction: f,
                    policies: Policies {
                        page_cache: p(f * f),
                        minio: p(f),
                        prefetch: p(f.sqrt()),
                    },
                }
            })
            .collect();
        let marks = Marks {
            dataset_bytes: 400,
            cache_bytes: 200,
            compute_seconds: Some(4.0),
        };
        draw(&path, &sweep, &marks).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for label in [
            "page cache (LRU)",
            "coorfs minio",
            "minio + prefetch",
            "GPU compute",
        ] {
            assert!(svg.contains(label), "{label}");
        }
        assert!(svg.matches("<polyline").count() >= 7);
    }
}
