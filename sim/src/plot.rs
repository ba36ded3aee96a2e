//! Minimal SVG charts for `govsim compare` (the same approach as `xtask`'s demo plots: a few
//! hundred lines of SVG text beat a plotting dependency for two kinds of chart).
//!
//! - [`lines`]: stacked panels of line series with point markers sharing an x axis (per-job
//!   completion times by policy);
//! - [`stacked_steps`]: one panel per worker, each job's cores as a stacked step area (CPU share
//!   over time).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::evaluate::RunReport;

/// One line: a label and (x, y) points.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A panel: title, y-axis label, its series; `y_range` None fits the data.
#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub y_range: Option<(f64, f64)>,
}

const COLORS: [&str; 12] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78",
];
const WIDTH: f64 = 960.0;
const PANEL_HEIGHT: f64 = 240.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 170.0;
const MARGIN_TOP: f64 = 50.0;
const GAP: f64 = 64.0;
/// Legend entries drawn per panel (the rest are summarised).
const LEGEND_MAX: usize = 12;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A round tick step for a range.
fn tick_step(range: f64) -> f64 {
    if !(range.is_finite() && range > 0.0) {
        return 1.0;
    }
    let raw = range / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm < 1.5 {
        1.0
    } else if norm < 3.5 {
        2.0
    } else if norm < 7.5 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_tick(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else {
        let decimals = (-step.log10().floor()) as usize;
        format!("{v:.decimals$}")
    }
}

struct Frame {
    top: f64,
    x: (f64, f64),
    y: (f64, f64),
}

impl Frame {
    fn plot_w() -> f64 {
        WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    }
    fn sx(&self, x: f64) -> f64 {
        MARGIN_LEFT + (x - self.x.0) / (self.x.1 - self.x.0) * Self::plot_w()
    }
    fn sy(&self, y: f64) -> f64 {
        let y = y.clamp(self.y.0, self.y.1);
        self.top + PANEL_HEIGHT - (y - self.y.0) / (self.y.1 - self.y.0) * PANEL_HEIGHT
    }
}

fn header(svg: &mut String, title: &str, panels: usize) {
    let height = MARGIN_TOP + panels as f64 * (PANEL_HEIGHT + GAP) + 10.0;
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
}

/// Frame, grid, ticks and axis labels of one panel.
fn axes(svg: &mut String, f: &Frame, title: &str, x_label: &str, y_label: &str) {
    let plot_w = Frame::plot_w();
    let bottom = f.top + PANEL_HEIGHT;
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="14" text-anchor="middle">{}</text>"#,
        MARGIN_LEFT + plot_w / 2.0,
        f.top - 8.0,
        escape(title)
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{MARGIN_LEFT}" y="{}" width="{plot_w}" height="{PANEL_HEIGHT}" fill="none" stroke="#999"/>"##,
        f.top
    );
    let step = tick_step(f.y.1 - f.y.0);
    let mut t = (f.y.0 / step).ceil() * step;
    while t <= f.y.1 + 1e-12 {
        let y = f.sy(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{MARGIN_LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/>"##,
            MARGIN_LEFT + plot_w
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            MARGIN_LEFT - 6.0,
            y + 4.0,
            fmt_tick(t, step)
        );
        t += step;
    }
    let xstep = tick_step(f.x.1 - f.x.0);
    let mut t = (f.x.0 / xstep).ceil() * xstep;
    while t <= f.x.1 + 1e-12 {
        let x = f.sx(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{bottom}" y2="{}" stroke="#999"/>"##,
            bottom + 4.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            bottom + 18.0,
            fmt_tick(t, xstep)
        );
        t += xstep;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        MARGIN_LEFT + plot_w / 2.0,
        bottom + 34.0,
        escape(x_label)
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        f.top + PANEL_HEIGHT / 2.0,
        escape(y_label)
    );
}

fn legend(svg: &mut String, top: f64, labels: &[String]) {
    let lx = MARGIN_LEFT + Frame::plot_w() + 12.0;
    for (k, label) in labels.iter().enumerate().take(LEGEND_MAX) {
        let color = COLORS[k % COLORS.len()];
        let ly = top + 16.0 + k as f64 * 17.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{lx}" y="{}" width="14" height="10" fill="{color}"/>"#,
            ly - 9.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{ly}">{}</text>"#,
            lx + 20.0,
            escape(label)
        );
    }
    if labels.len() > LEGEND_MAX {
        let ly = top + 16.0 + LEGEND_MAX as f64 * 17.0;
        let _ = writeln!(
            svg,
            r#"<text x="{lx}" y="{ly}">… {} more</text>"#,
            labels.len() - LEGEND_MAX
        );
    }
}

fn fit(values: impl Iterator<Item = f64>, pad: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if hi <= lo {
        hi = lo + 1.0;
    }
    if pad {
        let p = (hi - lo) * 0.05;
        (lo - p, hi + p)
    } else {
        (lo, hi)
    }
}

/// Panels of line series with markers, sharing the x axis.
pub fn lines(title: &str, x_label: &str, panels: &[Panel]) -> String {
    let charts: Vec<Chart<'_>> = panels.iter().map(Chart::Lines).collect();
    charts_svg(title, x_label, &charts)
}

/// One panel of a figure that mixes kinds of panel.
#[derive(Clone, Copy, Debug)]
pub enum Chart<'a> {
    /// Line series with markers.
    Lines(&'a Panel),
    /// Every job's cores stacked as step areas.
    Stacked(&'a StepPanel),
}

impl Chart<'_> {
    fn xs(&self) -> Vec<f64> {
        let series = match self {
            Chart::Lines(p) => &p.series,
            Chart::Stacked(p) => &p.jobs,
        };
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect()
    }
}

/// Panels of any kind, one above the other, sharing the x axis.
pub fn charts_svg(title: &str, x_label: &str, charts: &[Chart<'_>]) -> String {
    let mut svg = String::new();
    header(&mut svg, title, charts.len());
    let x = fit(charts.iter().flat_map(Chart::xs), false);
    for (i, chart) in charts.iter().enumerate() {
        let top = MARGIN_TOP + i as f64 * (PANEL_HEIGHT + GAP);
        match chart {
            Chart::Lines(p) => lines_panel(&mut svg, top, x, x_label, p),
            Chart::Stacked(p) => stacked_panel(&mut svg, top, x, x_label, p),
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn lines_panel(svg: &mut String, top: f64, x: (f64, f64), x_label: &str, p: &Panel) {
    let y = p.y_range.unwrap_or_else(|| {
        fit(
            p.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
            true,
        )
    });
    let f = Frame { top, x, y };
    axes(svg, &f, &p.title, x_label, &p.y_label);
    for (k, s) in p.series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| (f.sx(x), f.sy(y)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let text: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            text.join(" ")
        );
        for (x, y) in pts {
            let _ = writeln!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{color}"/>"#
            );
        }
    }
    let labels: Vec<String> = p.series.iter().map(|s| s.label.clone()).collect();
    legend(svg, f.top, &labels);
}

/// One worker's step functions: per job, `(time, cores)` at each change (held until the next).
#[derive(Clone, Debug)]
pub struct StepPanel {
    pub title: String,
    /// The worker's cores (the y range's top).
    pub capacity: f64,
    pub jobs: Vec<Series>,
}

/// Per panel, every job's cores stacked as step areas over time, sharing the x axis.
pub fn stacked_steps(title: &str, x_label: &str, panels: &[StepPanel]) -> String {
    let charts: Vec<Chart<'_>> = panels.iter().map(Chart::Stacked).collect();
    charts_svg(title, x_label, &charts)
}

fn stacked_panel(svg: &mut String, top: f64, x: (f64, f64), x_label: &str, p: &StepPanel) {
    let f = Frame {
        top,
        x,
        y: (0.0, p.capacity.max(1e-9)),
    };
    axes(svg, &f, &p.title, x_label, "cores");
    let mut times: Vec<f64> = p
        .jobs
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|t| t.is_finite())
        .collect();
    times.push(x.1);
    times.sort_by(f64::total_cmp);
    times.dedup();
    let mut below = vec![0.0; times.len()];
    for (k, s) in p.jobs.iter().enumerate() {
        let value_at = |t: f64| {
            s.points
                .iter()
                .take_while(|p| p.0 <= t)
                .last()
                .map_or(0.0, |p| p.1)
        };
        let above: Vec<f64> = times
            .iter()
            .zip(&below)
            .map(|(&t, &b)| b + value_at(t))
            .collect();
        if above.iter().zip(&below).all(|(a, b)| a - b <= 1e-12) {
            below = above;
            continue;
        }
        let mut pts = Vec::new();
        for w in 0..times.len().saturating_sub(1) {
            pts.push((times[w], above[w]));
            pts.push((times[w + 1], above[w]));
        }
        for w in (0..times.len().saturating_sub(1)).rev() {
            pts.push((times[w + 1], below[w]));
            pts.push((times[w], below[w]));
        }
        let text: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", f.sx(x), f.sy(y)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polygon fill="{}" fill-opacity="0.85" stroke="none" points="{}"/>"#,
            COLORS[k % COLORS.len()],
            text.join(" ")
        );
        below = above;
    }
    let labels: Vec<String> = p.jobs.iter().map(|s| s.label.clone()).collect();
    legend(svg, f.top, &labels);
}

/// Most workers drawn in the CPU-share plot.
const PLOTTED_WORKERS: usize = 4;

/// Write `{prefix}jct.svg` and `{prefix}cpu-POLICY.svg` (for fair and the last policy) under
/// `dir`; returns the paths.
pub fn write_report_plots(dir: &Path, prefix: &str, reports: &[RunReport]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let series: Vec<Series> = reports
        .iter()
        .map(|r| Series {
            label: r.policy.clone(),
            points: r
                .jobs
                .iter()
                .enumerate()
                .map(|(k, j)| ((k + 1) as f64, j.jct.unwrap_or(f64::NAN)))
                .collect(),
        })
        .collect();
    let slowdowns: Vec<Series> = reports
        .iter()
        .map(|r| Series {
            label: r.policy.clone(),
            points: r
                .jobs
                .iter()
                .enumerate()
                .map(|(k, j)| ((k + 1) as f64, j.slowdown_vs_fair.unwrap_or(f64::NAN)))
                .collect(),
        })
        .collect();
    let svg = lines(
        "Per-job completion time by policy",
        "job (in submission order)",
        &[
            Panel {
                title: "JCT".into(),
                y_label: "seconds".into(),
                series,
                y_range: None,
            },
            Panel {
                title: "JCT / JCT under fair".into(),
                y_label: "ratio".into(),
                series: slowdowns,
                y_range: None,
            },
        ],
    );
    let path = dir.join(format!("{prefix}jct.svg"));
    std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    let mut plotted: Vec<&RunReport> = reports.iter().filter(|r| r.policy == "fair").collect();
    if let Some(last) = reports.last()
        && last.policy != "fair"
    {
        plotted.push(last);
    }
    for r in plotted {
        let Some(run) = &r.run else { continue };
        if run.timelines.is_empty() {
            continue;
        }
        let panels: Vec<StepPanel> = run
            .timelines
            .iter()
            .take(PLOTTED_WORKERS)
            .map(|w| StepPanel {
                title: format!("{} ({} cores)", w.worker, w.cores),
                capacity: w.cores,
                jobs: w
                    .jobs
                    .iter()
                    .map(|(id, pts)| Series {
                        label: id.clone(),
                        points: pts.clone(),
                    })
                    .collect(),
            })
            .collect();
        let svg = stacked_steps(
            &format!("CPU share over time per worker: {}", r.policy),
            "seconds",
            &panels,
        );
        let safe: String = r
            .policy
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = dir.join(format!("{prefix}cpu-{safe}.svg"));
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_panels_draw_every_series_and_escape_labels() {
        let svg = lines(
            "t",
            "job",
            &[Panel {
                title: "JCT".into(),
                y_label: "s".into(),
                y_range: None,
                series: vec![
                    Series {
                        label: "a<b>".into(),
                        points: vec![(0.0, 1.0), (1.0, 2.0)],
                    },
                    Series {
                        label: "empty".into(),
                        points: vec![(0.0, f64::NAN)],
                    },
                ],
            }],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<polyline").count(),
            1,
            "a series of NaN draws nothing"
        );
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("a&lt;b&gt;"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn stacked_steps_stack_jobs_up_to_the_capacity() {
        // Two jobs on 2 cores: a has 2 cores on [0, 10), then 1; b has 1 from 10. The top of b's
        // area at t = 10..20 is at 2 cores, the top of the frame.
        let svg = stacked_steps(
            "cpu",
            "s",
            &[StepPanel {
                title: "w01".into(),
                capacity: 2.0,
                jobs: vec![
                    Series {
                        label: "a".into(),
                        points: vec![(0.0, 2.0), (10.0, 1.0), (20.0, 0.0)],
                    },
                    Series {
                        label: "b".into(),
                        points: vec![(10.0, 1.0), (20.0, 0.0)],
                    },
                ],
            }],
        );
        assert_eq!(svg.matches("<polygon").count(), 2);
        let f = Frame {
            top: MARGIN_TOP,
            x: (0.0, 20.0),
            y: (0.0, 2.0),
        };
        let top_of_b = format!("{:.1},{:.1}", f.sx(10.0), f.sy(2.0));
        let b = svg
            .lines()
            .filter(|l| l.contains("<polygon"))
            .nth(1)
            .unwrap();
        assert!(b.contains(&top_of_b), "{b}");
    }

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(tick_step(10.0), 2.0);
        assert_eq!(tick_step(300.0), 50.0);
        assert_eq!(tick_step(0.0), 1.0);
    }
}
