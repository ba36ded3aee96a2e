//! Ultralytics YOLO console tables (YOLOv5, v8, 11).
//!
//! ```text
//!      Epoch   gpu_mem       box       obj       cls    labels  img_size
//!        0/9        0G   0.05812   0.02423   0.09789        54       640: 100%|██████████| 401/401 [1:13:28<00:00, 10.99s/it]
//!                Class     Images     Labels          P          R     mAP@.5 mAP@.5:.95: 100%|██████████| 60/60 [06:55<00:00]
//!                  all       3796       4416      0.006      0.793     0.0166    0.00834
//! ```
//!
//! A row under the `Epoch ...` header is a train record: epoch as printed (`0/9`: 0-based in
//! v5, 1-based in v8+), step = the bar's batch counter, metrics = the numeric columns under
//! their header names (`box`, `obj`, `cls`, `labels`, `img_size` in v5; `box_loss`,
//! `cls_loss`, `dfl_loss`, `Instances`, `Size` in v8+). Every `\r` refresh of the bar is one.
//! The `all` row under a `Class Images ...` header is an eval record with the header's metric
//! names (`Box(P R mAP50 mAP50-95)` become `box/P`, `box/R`...), at the latest train epoch.

use std::sync::Arc;

use super::{LineParser, Names};
use crate::num::parse_plain;
use crate::record::{Metrics, RecordData, Split};

pub(crate) struct Console {
    train_cols: Option<Vec<Arc<str>>>,
    val_cols: Option<Vec<Arc<str>>>,
    epoch: Option<f64>,
    names: Names,
}

impl Console {
    pub(crate) fn new() -> Self {
        Console {
            train_cols: None,
            val_cols: None,
            epoch: None,
            names: Names::default(),
        }
    }
}

/// Splits a table cell row at the tqdm bar: `... 640: 100%|███| 401/401 [..]` gives the cells
/// before `: NN%` and the batch counter after the bar.
fn split_bar(line: &str) -> (&str, Option<u64>) {
    let Some(pipe) = line.find('|') else {
        return (line, None);
    };
    let head = &line[..pipe];
    // head ends with `: 100%` (v5/v8) or `100%` alone.
    let cells_end = head.rfind(": ").unwrap_or_else(|| {
        head.trim_end()
            .rfind(char::is_whitespace)
            .map_or(head.len(), |i| i)
    });
    let after = &line[pipe + 1..];
    let step = after.rfind('|').and_then(|p| {
        let s = after[p + 1..].trim_start();
        let slash = s.find('/')?;
        s[..slash].trim().parse::<u64>().ok()
    });
    (&line[..cells_end], step)
}

impl LineParser for Console {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        let (cells, step) = split_bar(line);
        let mut tokens = cells.split_whitespace();
        let Some(first) = tokens.next() else { return };
        if first == "Epoch" {
            let rest: Vec<&str> = tokens.collect();
            if rest.iter().any(|t| t.eq_ignore_ascii_case("gpu_mem")) {
                let mut cols = vec![self.names.get("Epoch")];
                cols.extend(rest.iter().map(|t| self.names.get(t)));
                self.train_cols = Some(cols);
            }
            return;
        }
        if first == "Class" {
            let mut cols = vec![self.names.get("Class")];
            let mut prefix: Option<String> = None;
            for raw in tokens {
                let mut t = raw.trim_end_matches(':');
                if let Some(open) = t.find('(') {
                    prefix = Some(t[..open].to_ascii_lowercase());
                    t = &t[open + 1..];
                }
                let closes = t.ends_with(')');
                let name = t.trim_end_matches(')');
                let full = match &prefix {
                    Some(p) if !p.is_empty() => format!("{p}/{name}"),
                    _ => name.to_owned(),
                };
                cols.push(self.names.get(&full));
                if closes {
                    prefix = None;
                }
            }
            if cols.len() >= 3 && cols.iter().any(|c| &**c == "Images") {
                self.val_cols = Some(cols);
            }
            return;
        }
        if first == "all" {
            let Some(cols) = &self.val_cols else { return };
            let mut metrics = Metrics::with_capacity(cols.len());
            for (col, tok) in cols.iter().skip(1).zip(tokens) {
                if let Some(v) = parse_plain(tok) {
                    metrics.insert(col.clone(), v);
                }
            }
            if !metrics.is_empty() {
                out.push(RecordData {
                    epoch: self.epoch,
                    step: None,
                    split: Split::Eval,
                    metrics,
                });
            }
            return;
        }
        let Some(cols) = &self.train_cols else { return };
        let Some((e, total)) = first.split_once('/') else {
            return;
        };
        let (Ok(epoch), Ok(_)) = (e.parse::<u64>(), total.parse::<u64>()) else {
            return;
        };
        let mut metrics = Metrics::with_capacity(cols.len());
        for (col, tok) in cols.iter().skip(1).zip(tokens) {
            if let Some(v) = parse_plain(tok.trim_end_matches(':')) {
                metrics.insert(col.clone(), v);
            }
        }
        if metrics.is_empty() {
            return;
        }
        self.epoch = Some(epoch as f64);
        out.push(RecordData {
            epoch: self.epoch,
            step,
            split: Split::Train,
            metrics,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(text: &str) -> Vec<RecordData> {
        let mut p = Console::new();
        let mut out = Vec::new();
        for l in text.lines() {
            p.line(l, &mut out);
        }
        out
    }

    #[test]
    fn yolov5_table() {
        let recs = feed(
            "     Epoch   gpu_mem       box       obj       cls    labels  img_size\n\
             \x20      0/9        0G   0.05812   0.02423   0.09789        54       640: 100%|██████████| 401/401 [1:13:28<00:00, 10.99s/it]      \n\
             \x20              Class     Images     Labels          P          R     mAP@.5 mAP@.5:.95: 100%|██████████| 60/60 [06:55<00:00,  6.92s/it]\n\
             \x20                all       3796       4416      0.006      0.793     0.0166    0.00834\n\
             \x20   rice leaf roller       3796         39      0.236      0.385      0.271      0.145\n",
        );
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert_eq!(recs[0].epoch, Some(0.0));
        assert_eq!(recs[0].step, Some(401));
        assert_eq!(recs[0].metrics.get("box"), Some(0.05812));
        assert_eq!(recs[0].metrics.get("img_size"), Some(640.0));
        assert!(!recs[0].metrics.contains("gpu_mem"));
        assert_eq!(recs[1].split, Split::Eval);
        assert_eq!(recs[1].metrics.get("mAP@.5:.95"), Some(0.00834));
        assert_eq!(recs[1].epoch, Some(0.0));
    }

    #[test]
    fn yolov8_table_with_refreshes() {
        let recs = feed(
            "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\n\
             \x20     1/100      2.61G      1.234      2.345      1.456         12        640:  45%|████▌     | 45/100 [00:10<00:12,  4.50it/s]\n\
             \x20     1/100      2.61G      1.200      2.300      1.400         10        640: 100%|██████████| 100/100 [00:20<00:00,  4.50it/s]\n\
             \x20                Class     Images  Instances      Box(P          R      mAP50  mAP50-95): 100%|██████████| 5/5 [00:01<00:00]\n\
             \x20                  all        100        200      0.512      0.433      0.401      0.250\n",
        );
        assert_eq!(recs.len(), 3, "{recs:?}");
        assert_eq!(recs[0].step, Some(45));
        assert_eq!(recs[1].metrics.get("box_loss"), Some(1.2));
        assert_eq!(recs[2].metrics.get("box/mAP50-95"), Some(0.25));
        assert_eq!(recs[2].metrics.get("Instances"), Some(200.0));
    }
}
