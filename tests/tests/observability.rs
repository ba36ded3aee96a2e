//! Observability against real tools, on the host: a real `governor daemon` joined to a real
//! coordinator, one training job running through them, then
//! - Debian's `prometheus` scrapes the daemon's `/metrics` and the coordinator's, and the series
//!   are checked through Prometheus's HTTP API (not by parsing the text here);
//! - every metric the Grafana dashboard (`deploy/grafana/governor-dashboard.json`) queries is
//!   one Prometheus found in a scrape;
//! - Debian's headless `chromium` loads the live cluster page, runs its script, and the page
//!   shows the job, its node and its loss sparkline; a screenshot is written
//!   (`GOVERNOR_PAGE_SCREENSHOT=PATH` keeps it, e.g. for the README);
//! - the dashboard's panels are drawn from Prometheus's answers to their own queries (Grafana is
//!   not installable here) and rendered by Chromium (`GOVERNOR_DASHBOARD_SCREENSHOT=PATH` keeps
//!   the picture, after waiting for 45 s of data).
//!
//! The daemon runs `--dry-run` on a fake cgroup root (never the host's cgroups). Needs the
//! `governor` binary (`cargo build -p governor`) and the two Debian packages, which
//! `cargo xtask setup` installs; without them the test says so and passes vacuously (outside
//! `cargo xtask test`, which sets `GOVERNOR_REQUIRE_TOOLS=1` and makes a missing tool fail).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use coordinator::cli::Client;
use coordinator::server::{self, ServerConfig, web::WebConfig};
use governor::cgroup::fake::FakeCgroupRoot;
use governor_integration_tests::daemon::Daemon;
use governor_integration_tests::free_port;
use governor_proto::control::{JobSpec, NodeState};

/// A plain `GET` (the body), or `None` if nothing answers.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    // Prometheus answers chunked; its JSON bodies are small: keep the chunk payloads only.
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut rest = body;
        let mut joined = String::new();
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                break;
            }
            joined.push_str(tail.get(..n)?);
            rest = tail.get(n + 2..)?;
        }
        return Some(joined);
    }
    Some(body.to_owned())
}

/// A Prometheus API call's `data`, once its status is `success`.
fn prom(port: u16, path: &str) -> Option<serde_json::Value> {
    let body = get(port, path)?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    (v["status"] == "success").then(|| v["data"].clone())
}

fn wait_for<T>(what: &str, within: Duration, f: impl FnMut() -> Option<T>) -> T {
    governor_integration_tests::poll_until(what, within, Duration::from_millis(250), f, String::new)
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Metric names a PromQL expression uses (`governor_...` identifiers).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("governor_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let before_ok =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        if before_ok {
            names.push(expr[start..end].to_owned());
        }
        i = end;
    }
    names
}

fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                if (k == "expr" || k == "query")
                    && let Some(s) = x.as_str()
                {
                    out.push(s.to_owned());
                }
                dashboard_exprs(x, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| dashboard_exprs(x, out)),
        _ => {}
    }
}

#[test]
fn prometheus_scrapes_both_the_dashboard_matches_and_chromium_renders_the_page() {
    let (Some(prometheus), Some(chromium)) = (
        governor_integration_tests::tool(&["prometheus"]),
        governor_integration_tests::tool(&["chromium", "chromium-browser"]),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt
        .block_on(server::start(ServerConfig {
            listen: "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
            store: dir.path().join("coordinator.redb"),
            tls: None,
            policy: "first-fit".into(),
            state: Default::default(),
            web: WebConfig {
                listen: Some("127.0.0.1:0".parse().unwrap()),
                tls: None,
            },
        }))
        .expect("the coordinator starts");
    let web_port = server.web_addr.expect("[web] is served").port();
    let address = server.addr.to_string();
    let mut govctl = rt
        .block_on(Client::connect(&address, None))
        .expect("govctl connects");

    let root = dir.path().join("cgroup");
    std::fs::create_dir(&root).unwrap();
    FakeCgroupRoot::unified(&root).add_group("governor.slice/jobs/train-j1");
    let metrics_port = free_port();
    let mut daemon = Daemon::configure(
        "shortest-left",
        &format!(
            "cgroup_root = \"{}\"\n[discovery]\nenvironment = false\n[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n[coordinator]\naddress = \"{address}\"\ninsecure = true\nallow_root_jobs = true\njob_output_dir = \"{}\"\n",
            root.display(),
            dir.path().join("out").display()
        ),
    );
    daemon.extra_args = vec!["--dry-run".into(), "--node-name".into(), "node-a".into()];
    daemon.spawn();
    wait_for("node-a to be ready", Duration::from_secs(30), || {
        let nodes = rt.block_on(govctl.nodes()).ok()?;
        (nodes.iter().find(|n| n.name == "node-a")?.status == NodeState::Ready).then_some(())
    });

    // A job that learns for a minute: a falling loss, one line every 0.5 s.
    let log = dir.path().join("train.log");
    let script = format!(
        "i=0; l=4.0; while [ $i -lt 120 ]; do i=$((i+1)); l=$(awk -v l=$l 'BEGIN {{ print l*0.97 }}'); \
         echo \"step $i loss=$l\" >> {}; sleep 0.5; done",
        log.display()
    );
    let mut spec = JobSpec::new(
        "train",
        vec!["/bin/sh".into(), "-c".into(), script],
        log.display().to_string(),
    );
    spec.metric = "loss".into();
    assert_eq!(rt.block_on(govctl.submit(spec)).unwrap().id, "j1");
    wait_for(
        "the daemon to govern train",
        Duration::from_secs(20),
        || daemon.job("train"),
    );

    // A real Prometheus scraping both every second.
    let prom_port = free_port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: governor\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n  - job_name: coordinator\n    static_configs:\n      - targets: ['127.0.0.1:{web_port}']\n"
        ),
    )
    .unwrap();
    let prometheus_started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let _prometheus = Killed(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("prometheus.log")).unwrap(),
            ))
            .spawn()
            .expect("prometheus starts"),
    );
    let value = |q: &str| -> Option<f64> {
        let data = prom(prom_port, &format!("/api/v1/query?query={q}"))?;
        data["result"].as_array()?.first()?["value"][1]
            .as_str()?
            .parse()
            .ok()
    };
    // Both targets up, then the series through PromQL.
    wait_for(
        "both targets up in Prometheus",
        Duration::from_secs(60),
        || (value("sum(up)")? >= 2.0).then_some(()),
    );
    if std::env::var_os("OBS_DEBUG").is_some() {
        std::thread::sleep(Duration::from_secs(3));
        eprintln!("{}", get(metrics_port, "/metrics").unwrap_or_default());
    }
    let progress = wait_for("the job's series", Duration::from_secs(30), || {
        value("governor_job_progress_value%7Bjob_name%3D%22train%22%7D")
    });
    assert!(
        progress > 0.0 && progress < 4.0,
        "progress {progress}; /metrics:\n{}",
        get(metrics_port, "/metrics").unwrap_or_default()
    );
    wait_for("log records counted", Duration::from_secs(30), || {
        value("sum(governor_log_records_total)").filter(|v| *v > 0.0)
    });
    assert!(value("sum(governor_decisions_total)").unwrap_or(0.0) > 0.0);
    assert_eq!(
        value("governor_cluster_nodes%7Bstate%3D%22ready%22%7D"),
        Some(1.0)
    );
    wait_for(
        "the coordinator's job series",
        Duration::from_secs(30),
        || value("governor_cluster_job_progress_value%7Bjob_id%3D%22j1%22%7D"),
    );
    assert_eq!(value("governor_cluster_queue_length"), Some(0.0));
    assert!(value("governor_cluster_placement_duration_seconds_count").unwrap_or(0.0) >= 1.0);

    // The dashboard queries only metrics Prometheus has seen (series or metadata).
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/governor-dashboard.json"),
        )
        .expect("the dashboard JSON"),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 8, "{exprs:?}");
    let series: Vec<String> = prom(prom_port, "/api/v1/label/__name__/values")
        .and_then(|d| serde_json::from_value(d).ok())
        .expect("metric names");
    let metadata = prom(prom_port, "/api/v1/metadata").expect("metadata");
    let bases = |name: &str| {
        [
            name.to_owned(),
            name.trim_end_matches("_bucket").to_owned(),
            name.trim_end_matches("_total").to_owned(),
        ]
    };
    let seen = |name: &str| {
        bases(name)
            .iter()
            .any(|b| series.iter().any(|s| s == b) || metadata.get(b).is_some())
    };
    // Families with no sample in this set-up (no GPU, no moves, dry run: no cgroup writes)
    // are not written to a scrape at all: those are checked against every family the two
    // endpoints can show (`# TYPE` lines of their renderings with every field set).
    let declared: Vec<String> = [
        governor::metrics::every_family(),
        coordinator::server::web::every_family(),
    ]
    .iter()
    .flat_map(|text| {
        text.lines()
            .filter_map(|l| {
                l.strip_prefix("# TYPE ")?
                    .split_whitespace()
                    .next()
                    .map(str::to_owned)
            })
            .collect::<Vec<_>>()
    })
    .collect();
    let known = |name: &str| seen(name) || bases(name).iter().any(|b| declared.contains(b));
    let names: Vec<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    let by_prometheus = names.iter().filter(|n| seen(n)).count();
    assert!(
        by_prometheus >= 12,
        "only {by_prometheus} of the dashboard's metrics have series"
    );
    for e in &exprs {
        for name in metric_names(e) {
            assert!(
                known(&name),
                "the dashboard queries {name} ({e}), which no scrape has; metadata: {:?}",
                metadata.as_object().map(|m| m.keys().collect::<Vec<_>>())
            );
        }
    }

    // The live page in a real headless browser, after its script ran (once the job has two
    // points of history: its sparkline).
    wait_for(
        "two points of the job's history",
        Duration::from_secs(30),
        || {
            let c: serde_json::Value =
                serde_json::from_str(&get(web_port, "/api/cluster")?).ok()?;
            (c["history"]["j1"].as_array()?.len() >= 2).then_some(())
        },
    );
    // The node's decision about the job and why, as the page shows it in its row.
    let decision = wait_for(
        "the job's decision from its node",
        Duration::from_secs(30),
        || {
            let c: serde_json::Value =
                serde_json::from_str(&get(web_port, "/api/cluster")?).ok()?;
            let d = c["jobs"].as_array()?.iter().find(|j| j["id"] == "j1")?["decision"]
                .as_str()?
                .to_owned();
            (!d.is_empty()).then_some(d)
        },
    );
    let decision_start: String = decision
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == ' ')
        .collect();
    let url = format!("http://127.0.0.1:{web_port}/");
    let chrome = |args: &[String]| {
        Command::new(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--virtual-time-budget=6000",
                "--window-size=1280,720",
            ])
            .arg(format!(
                "--user-data-dir={}",
                dir.path().join("chromium").display()
            ))
            .args(args)
            .arg(&url)
            .stderr(Stdio::null())
            .output()
            .expect("chromium runs")
    };
    let dom = String::from_utf8_lossy(&chrome(&["--dump-dom".into()]).stdout).into_owned();
    for needle in [
        "data-job=\"j1\"",
        ">train<",
        ">node-a<",
        "class=\"spark\"",
        "policy first-fit",
        "class=\"why\"",
        decision_start.as_str(),
    ] {
        assert!(
            dom.contains(needle),
            "{needle} missing in the rendered page:\n{dom}"
        );
    }
    let shot = std::env::var_os("GOVERNOR_PAGE_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().join("page.png"));
    chrome(&[format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );

    // The dashboard previewed: each panel drawn from Prometheus's answers to its own queries
    // (Grafana itself is not installable here); most panels must have data. For the README's
    // screenshot, over most of the job's minute rather than the first seconds.
    if std::env::var_os("GOVERNOR_DASHBOARD_SCREENSHOT").is_some() {
        let since = |t: f64| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64()
                - t
        };
        while since(prometheus_started) < 45.0 {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    // Rates need two scrapes inside their window: on a loaded machine the first seconds may
    // not have them yet, so the preview is drawn again (up to 30 s) until they do.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (preview, with_data) = loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let (preview, with_data) =
            dashboard_preview(prom_port, &dashboard, prometheus_started, now);
        if with_data >= 12 || Instant::now() > deadline {
            break (preview, with_data);
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    assert!(
        with_data >= 12,
        "only {with_data} of the dashboard's panels have data after 30 s"
    );
    let preview_file = dir.path().join("dashboard.html");
    std::fs::write(&preview_file, preview).unwrap();
    let shot = std::env::var_os("GOVERNOR_DASHBOARD_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().join("dashboard.png"));
    let status = Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,2120",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("chromium").display()
        ))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", preview_file.display()))
        .stderr(Stdio::null())
        .status()
        .expect("chromium runs");
    assert!(status.success());
    assert!(
        std::fs::read(&shot)
            .expect("a screenshot")
            .starts_with(b"\x89PNG")
    );

    // A node's jobs outlive its daemon by design: cancelled here, so that the job does not run
    // on for the rest of its minute after the test.
    rt.block_on(govctl.cancel("j1")).expect("cancel");
    wait_for("the daemon to stop train", Duration::from_secs(20), || {
        daemon.job("train").is_none().then_some(())
    });
    drop(daemon);
    rt.block_on(server.stop());
}

/// `s` percent-encoded for a URL query value.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Text for HTML.
fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One curve of a panel: its legend and points (unix seconds, value).
type Curve = (String, Vec<(f64, f64)>);

/// A panel's curves: each of its queries over `[start, end]` (Prometheus `query_range`, 1 s
/// steps), `$node` meaning every node.
fn panel_curves(prom_port: u16, panel: &serde_json::Value, start: f64, end: f64) -> Vec<Curve> {
    let mut curves = Vec::new();
    for target in panel["targets"].as_array().into_iter().flatten() {
        let Some(expr) = target["expr"].as_str() else {
            continue;
        };
        let expr = expr.replace("$node", ".*");
        let path = format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
            url_encode(&expr)
        );
        let Some(data) = prom(prom_port, &path) else {
            continue;
        };
        for series in data["result"].as_array().into_iter().flatten() {
            let legend = series["metric"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| !matches!(k.as_str(), "__name__" | "instance" | "job"))
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            let points: Vec<(f64, f64)> = series["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| Some((p[0].as_f64()?, p[1].as_str()?.parse::<f64>().ok()?)))
                .filter(|(_, v)| v.is_finite())
                .collect();
            if !points.is_empty() {
                curves.push((
                    if legend.is_empty() {
                        expr.clone()
                    } else {
                        legend
                    },
                    points,
                ));
            }
        }
    }
    curves
}

/// A panel as an SVG line chart (every panel type drawn as lines over time).
fn panel_svg(curves: &[Curve], start: f64, end: f64) -> String {
    const W: f64 = 590.0;
    const H: f64 = 150.0;
    const COLOURS: [&str; 6] = [
        "#4a7bd0", "#d0764a", "#3a9a5b", "#9a4ad0", "#c9a227", "#5bb8c9",
    ];
    if curves.is_empty() {
        return format!(
            "<svg width=\"{W}\" height=\"{H}\"><text x=\"{}\" y=\"{}\" fill=\"#999\" text-anchor=\"middle\">no data in this test run</text></svg>",
            W / 2.0,
            H / 2.0
        );
    }
    let values = curves.iter().flat_map(|c| c.1.iter().map(|p| p.1));
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (lo, hi) = if hi - lo < 1e-12 {
        (lo - 1.0, hi + 1.0)
    } else {
        (lo, hi)
    };
    let x = |t: f64| 40.0 + (t - start) / (end - start).max(1.0) * (W - 50.0);
    let y = |v: f64| 10.0 + (hi - v) / (hi - lo) * (H - 30.0);
    let mut svg = format!("<svg width=\"{W}\" height=\"{H}\">");
    for (v, label) in [(hi, hi), (lo, lo)] {
        svg.push_str(&format!(
            "<line x1=\"40\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e4e4e4\"/><text x=\"36\" y=\"{:.1}\" font-size=\"10\" fill=\"#777\" text-anchor=\"end\">{}</text>",
            W - 10.0,
            y(v) + 3.0,
            format_value(label),
            y = y(v)
        ));
    }
    for (i, (_, points)) in curves.iter().enumerate() {
        let d: Vec<String> = points
            .iter()
            .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
            .collect();
        svg.push_str(&format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\"/>",
            d.join(" "),
            COLOURS[i % COLOURS.len()]
        ));
    }
    svg.push_str(&format!(
        "<text x=\"40\" y=\"{}\" font-size=\"10\" fill=\"#777\">{:.0} s</text></svg>",
        H - 4.0,
        end - start
    ));
    svg
}

fn format_value(v: f64) -> String {
    if v.abs() >= 1000.0 || (v != 0.0 && v.abs() < 0.01) {
        format!("{v:.2e}")
    } else {
        format!("{v:.2}")
    }
}

/// The dashboard (`deploy/grafana/governor-dashboard.json`) previewed as an HTML page: its rows
/// and panels in order, each drawn from Prometheus's answers to the panel's own queries.
/// Returns the page and how many panels have data.
fn dashboard_preview(
    prom_port: u16,
    dashboard: &serde_json::Value,
    start: f64,
    end: f64,
) -> (String, usize) {
    const COLOURS: [&str; 6] = [
        "#4a7bd0", "#d0764a", "#3a9a5b", "#9a4ad0", "#c9a227", "#5bb8c9",
    ];
    let mut body = String::new();
    let mut with_data = 0;
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let title = html_escape(panel["title"].as_str().unwrap_or(""));
        if panel["type"] == "row" {
            body.push_str(&format!("<h2>{title}</h2>"));
            continue;
        }
        let curves = panel_curves(prom_port, panel, start, end);
        with_data += usize::from(!curves.is_empty());
        let legend: String = curves
            .iter()
            .take(6)
            .enumerate()
            .map(|(i, (l, _))| {
                format!(
                    "<span><i style=\"background:{}\"></i>{}</span>",
                    COLOURS[i % COLOURS.len()],
                    html_escape(l)
                )
            })
            .collect();
        body.push_str(&format!(
            "<div class=\"panel\"><h3>{title}</h3>{}<div class=\"legend\">{legend}</div></div>",
            panel_svg(&curves, start, end)
        ));
    }
    let page = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><style>\
         body{{font:13px system-ui,sans-serif;margin:1em;background:#111217;color:#ccc}}\
         h1{{font-size:1.2em}} h2{{font-size:1.05em;clear:both;margin:.8em 0 .3em}}\
         .panel{{float:left;width:596px;margin:0 6px 6px 0;background:#181b1f;border:1px solid #2a2d33;padding:4px}}\
         h3{{font-size:.95em;margin:.2em .3em}} .legend span{{margin-right:1em;font-size:11px}}\
         .legend i{{display:inline-block;width:10px;height:3px;margin-right:4px;vertical-align:middle}}\
         </style></head><body><h1>Governor dashboard: deploy/grafana/governor-dashboard.json, each panel drawn \
         from a real Prometheus's answers to its own queries (a preview; not Grafana)</h1>{body}</body></html>"
    );
    (page, with_data)
}
