//! Minimal SVG line charts for the demo (no plotting dependency needed for two panels).

use std::fmt::Write as _;

/// One line: a label and (x, y) points.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A panel: title, y-axis label and its series, drawn against a shared x axis.
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Fixed y range; `None` fits the data.
    pub y_range: Option<(f64, f64)>,
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];
const WIDTH: f64 = 900.0;
const PANEL_HEIGHT: f64 = 260.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 150.0;
const MARGIN_TOP: f64 = 50.0;
const GAP: f64 = 60.0;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" tick step for a range.
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

/// Render stacked panels sharing the x axis (seconds).
pub fn render(title: &str, x_label: &str, panels: &[Panel]) -> String {
    let height = MARGIN_TOP + panels.len() as f64 * (PANEL_HEIGHT + GAP) + 10.0;
    let (mut x_min, mut x_max) = (f64::INFINITY, f64::NEG_INFINITY);
    for p in panels {
        for s in &p.series {
            for &(x, _) in &s.points {
                x_min = x_min.min(x);
                x_max = x_max.max(x);
            }
        }
    }
    if !x_min.is_finite() {
        (x_min, x_max) = (0.0, 1.0);
    }
    if x_max <= x_min {
        x_max = x_min + 1.0;
    }
    let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let sx = |x: f64| MARGIN_LEFT + (x - x_min) / (x_max - x_min) * plot_w;

    let mut svg = String::new();
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
    for (i, p) in panels.iter().enumerate() {
        let top = MARGIN_TOP + i as f64 * (PANEL_HEIGHT + GAP);
        let bottom = top + PANEL_HEIGHT;
        let (mut y_min, mut y_max) = p.y_range.unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
        if p.y_range.is_none() {
            for s in &p.series {
                for &(_, y) in &s.points {
                    if y.is_finite() {
                        y_min = y_min.min(y);
                        y_max = y_max.max(y);
                    }
                }
            }
            if !y_min.is_finite() {
                (y_min, y_max) = (0.0, 1.0);
            }
            let pad = ((y_max - y_min) * 0.05).max(1e-9);
            y_min -= pad;
            y_max += pad;
        }
        let sy = |y: f64| bottom - (y - y_min) / (y_max - y_min) * PANEL_HEIGHT;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="14" text-anchor="middle">{}</text>"#,
            MARGIN_LEFT + plot_w / 2.0,
            top - 8.0,
            escape(&p.title)
        );
        let _ = writeln!(
            svg,
            r##"<rect x="{MARGIN_LEFT}" y="{top}" width="{plot_w}" height="{PANEL_HEIGHT}" fill="none" stroke="#999"/>"##
        );
        // Y ticks and grid.
        let step = tick_step(y_max - y_min);
        let mut t = (y_min / step).ceil() * step;
        while t <= y_max + 1e-12 {
            let y = sy(t);
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
        // X ticks.
        let xstep = tick_step(x_max - x_min);
        let mut t = (x_min / xstep).ceil() * xstep;
        while t <= x_max + 1e-12 {
            let x = sx(t);
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
            top + PANEL_HEIGHT / 2.0,
            escape(&p.y_label)
        );
        for (k, s) in p.series.iter().enumerate() {
            let color = COLORS[k % COLORS.len()];
            let pts: Vec<String> = s
                .points
                .iter()
                .filter(|(_, y)| y.is_finite())
                .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y.clamp(y_min, y_max))))
                .collect();
            if !pts.is_empty() {
                let _ = writeln!(
                    svg,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
                    pts.join(" ")
                );
            }
            let ly = top + 16.0 + k as f64 * 18.0;
            let lx = MARGIN_LEFT + plot_w + 12.0;
            let _ = writeln!(
                svg,
                r#"<line x1="{lx}" x2="{}" y1="{}" y2="{}" stroke="{color}" stroke-width="3"/>"#,
                lx + 18.0,
                ly - 4.0,
                ly - 4.0
            );
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{ly}">{}</text>"#,
                lx + 24.0,
                escape(&s.label)
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn fmt_tick(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else {
        let decimals = (-step.log10().floor()) as usize;
        format!("{v:.decimals$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series_with_its_label() {
        let panels = [
            Panel {
                title: "CPU".into(),
                y_label: "cores".into(),
                y_range: Some((0.0, 2.0)),
                series: vec![
                    Series {
                        label: "job<1>".into(),
                        points: vec![(0.0, 0.5), (10.0, 1.5)],
                    },
                    Series {
                        label: "job2".into(),
                        points: vec![(5.0, 1.0), (8.0, f64::NAN)],
                    },
                ],
            },
            Panel {
                title: "loss".into(),
                y_label: "loss".into(),
                y_range: None,
                series: vec![Series {
                    label: "job1".into(),
                    points: vec![],
                }],
            },
        ];
        let svg = render("demo", "seconds", &panels);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<polyline").count(),
            2,
            "empty series draws no line"
        );
        assert!(svg.contains("job&lt;1&gt;"), "labels are escaped");
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(tick_step(10.0), 2.0);
        assert_eq!(tick_step(1.0), 0.2);
        assert_eq!(tick_step(300.0), 50.0);
        assert_eq!(tick_step(0.0), 1.0);
    }
}
