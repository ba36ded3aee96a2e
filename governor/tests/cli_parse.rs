//! `governor parse` and `governor formats` as other tools call them: output lines, exit
//! statuses, error messages.

#[path = "../../governor-progress/tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};

use common::fixtures_dir;

fn governor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_governor"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("governor runs")
}

fn stdout_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

fn fixture(rel: &str) -> String {
    fixtures_dir().join(rel).display().to_string()
}

#[test]
fn records_are_json_lines_with_fields_in_a_fixed_order() {
    let file = fixture("keras_csv/tomato-leaf-cnn_training_log.csv");
    let out = governor(&["parse", &file]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "{{\"file\":\"{file}\",\"record\":0,\"format\":\"keras_csv\",\"split\":\"train\",\"epoch\":0.0,\"step\":null,\"metrics\":{{\"accuracy\":0.3163749873638153,\"loss\":1.843022346496582,\"val_accuracy\":0.5389999747276306,\"val_loss\":1.3278529644012451}}}}"
        )
    );
    assert_eq!(stdout_lines(&out).len(), 29);
}

#[test]
fn summary_per_file() {
    let a = fixture("nanogpt_style/nanogpt-shakespeare-char-termux_train.log");
    let b = fixture("keras_csv/cat-classifier_training.log");
    let out = governor(&["parse", "--summary", &a, &b]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        vec![
            format!(
                "{{\"file\":\"{a}\",\"format\":\"nanogpt\",\"records\":96,\"train_records\":91,\"eval_records\":5,\"signal\":\"loss\",\"first\":4.2709,\"last\":3.5023,\"runs\":1}}"
            ),
            format!(
                "{{\"file\":\"{b}\",\"format\":\"keras_csv\",\"records\":50,\"train_records\":50,\"eval_records\":0,\"signal\":\"loss\",\"first\":7.258389949798584,\"last\":0.2605608403682709,\"runs\":2}}"
            ),
        ]
    );
}

#[test]
fn metric_selects_the_signal_and_filters_records() {
    let file = fixture("nanogpt_style/nanogpt-shakespeare-char-termux_train.log");
    let out = governor(&["parse", "--summary", "--metric", "val_loss", &file]);
    let s = &stdout_lines(&out)[0];
    assert_eq!(s["signal"], "val_loss");
    assert_eq!(s["first"], 4.2475);
    assert_eq!(s["last"], 3.3687);
    let out = governor(&["parse", "--metric", "val_loss", &file]);
    let recs = stdout_lines(&out);
    assert_eq!(recs.len(), 5);
    assert!(recs.iter().all(|r| r["split"] == "eval"));
}

#[test]
fn forced_format_and_custom_regex() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.log");
    std::fs::write(&path, "step=1 loss=0.5\nstep=2 loss=0.25\n").unwrap();
    let p = path.to_str().unwrap();
    let out = governor(&[
        "parse",
        "--regex",
        r"^step=(?P<step>\d+) loss=(?P<loss>\S+)$",
        p,
    ]);
    assert!(out.status.success(), "{out:?}");
    let recs = stdout_lines(&out);
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[1]["format"], "custom");
    assert_eq!(recs[1]["step"], 2);
    assert_eq!(recs[1]["metrics"]["loss"], 0.25);

    let out = governor(&["parse", "--format", "keras_csv", p]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        format!("governor parse: no keras_csv records recognised in {p}\n")
    );
    let out = governor(&["parse", "--format", "nope", p]);
    assert_eq!(out.status.code(), Some(2));
    let out = governor(&["parse", "--regex", "(?P<step>\\d+)", p]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn unknown_format_exits_3_without_echoing_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shadow");
    std::fs::write(&path, "root:$6$SECRETHASH:19000:0:99999:7:::\n").unwrap();
    let p = path.to_str().unwrap();
    let out = governor(&["parse", p]);
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        err,
        format!("governor parse: no known training-log format recognised in {p}\n")
    );
}

#[test]
fn unreadable_files_exit_non_zero_with_one_line_naming_them() {
    let missing = "/nonexistent/train.log";
    let out = governor(&["parse", missing]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("governor parse: cannot read /nonexistent/train.log: "),
        "{err}"
    );

    // A directory is a log directory: an empty one holds no log in a known format.
    let dir = tempfile::tempdir().unwrap();
    let out = governor(&["parse", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3));

    // Other files are still parsed; the status is the first failure's.
    let good = fixture("other_formats/caffe-lenet-mnist_train.log");
    let out = governor(&["parse", "--summary", missing, &good]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout_lines(&out).len(), 1);
}

#[test]
fn formats_lists_every_format_with_an_example() {
    let out = governor(&["formats"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), governor::progress::Format::ALL.len());
    for l in &lines {
        let cols: Vec<&str> = l.split('\t').collect();
        assert_eq!(cols.len(), 3, "{l}");
        assert!(
            governor::progress::Format::from_name(cols[0]).is_some(),
            "{l}"
        );
        assert!(!cols[2].is_empty());
    }
    assert!(lines[0].starts_with("hf_trainer_state\t"));
}

fn real_writer(rel: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../governor-progress/tests/data/real_writers")
        .join(rel)
        .display()
        .to_string()
}

#[test]
fn a_log_directory_is_one_summary_and_its_records_name_their_files() {
    let dir = real_writer("keras_tensorboard");
    let out = governor(&["parse", "--summary", &dir]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim_end(),
        format!(
            "{{\"file\":\"{dir}\",\"format\":\"tensorboard\",\"records\":42,\"train_records\":18,\"eval_records\":24,\"signal\":\"epoch_loss\",\"first\":0.7397449612617493,\"last\":0.6849231719970703,\"runs\":1}}"
        )
    );
    let out = governor(&["parse", "--metric", "validation/epoch_loss", &dir]);
    assert!(out.status.success(), "{out:?}");
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 6);
    assert!(
        lines[0]["file"]
            .as_str()
            .unwrap()
            .contains("/validation/events.out.tfevents."),
        "{}",
        lines[0]
    );
    assert_eq!(lines[0]["split"], "eval");
    assert_eq!(lines[0]["step"], 0);
}

#[test]
fn an_mlflow_database_and_a_file_store_parse_like_logs() {
    let db = real_writer("mlflow_sqlite/mlflow.db");
    let out = governor(&["parse", "--summary", &db]);
    assert!(out.status.success(), "{out:?}");
    let s = &stdout_lines(&out)[0];
    assert_eq!(s["format"], "mlflow_sqlite");
    assert_eq!(s["signal"], "loss");
    assert_eq!(s["records"], 12);
    let store = real_writer("mlflow_file/mlruns");
    let out = governor(&["parse", "--summary", &store]);
    assert!(out.status.success(), "{out:?}");
    let s = &stdout_lines(&out)[0];
    assert_eq!(
        (s["format"].as_str(), s["runs"].as_u64()),
        (Some("mlflow_file"), Some(2))
    );
}
