//! Keras `fit()` console output, Keras 1 to 3.
//!
//! ```text
//! Epoch 2/40
//! 127/127 [==============================] - 7s - loss: 0.2349 - val_loss: 0.1870          (Keras 1)
//! 313/313 [==============================] - 351s 1s/step - loss: 0.6855 - acc: 0.5609   (Keras 2)
//! 1875/1875 ━━━━━━━━━━━━━━━━━━━━ 5s 2ms/step - accuracy: 0.8765 - loss: 0.4321           (Keras 3)
//!  - 10s - loss: 0.2 - acc: 0.9                                                           (verbose=2)
//! ```
//!
//! Every progress-bar state with metrics is a train record (in a terminal each `\r` refresh is
//! one, with the running averages of the epoch so far; `val_*` values arrive on the epoch's
//! last state). Epoch: from the latest `Epoch N/M` line, as printed (1-based). Step: the
//! bar's counter (batches, or samples for Keras 1).

use super::{LineParser, Names};
use crate::num::parse_number;
use crate::record::{Metrics, RecordData, Split};

pub(crate) struct KerasConsole {
    epoch: Option<f64>,
    names: Names,
}

impl KerasConsole {
    pub(crate) fn new() -> Self {
        KerasConsole {
            epoch: None,
            names: Names::default(),
        }
    }
}

/// `N/M` at the start of `s`: returns (N, rest).
fn counter(s: &str) -> Option<(u64, &str)> {
    let slash = s.find('/')?;
    let n: u64 = s[..slash].parse().ok()?;
    let rest = &s[slash + 1..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    Some((n, &rest[digits..]))
}

impl LineParser for KerasConsole {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("Epoch ")
            && let Some((n, tail)) = counter(rest)
            && tail.trim().is_empty()
        {
            self.epoch = Some(n as f64);
            return;
        }
        // The bar: `N/M [===...]`, `N/M ━━━`, or (verbose=2) nothing before ` - `.
        let (step, rest) = match counter(t) {
            Some((n, rest)) => {
                let r = rest.trim_start();
                let has_bar = r.starts_with('[') || r.starts_with('━') || r.starts_with('─');
                if !has_bar && self.epoch.is_none() {
                    return;
                }
                (Some(n), rest)
            }
            None if t.starts_with("- ") && self.epoch.is_some() => (None, t),
            None => return,
        };
        let mut metrics = Metrics::with_capacity(8);
        for seg in rest.split(" - ").skip(1) {
            let Some((k, v)) = seg.split_once(": ") else {
                continue;
            };
            let k = k.trim();
            if k.is_empty()
                || k == "ETA"
                || !k
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'/' | b'.' | b'-'))
            {
                continue;
            }
            if let Some(v) = parse_number(v) {
                metrics.insert(self.names.get(k), v);
            }
        }
        if metrics.is_empty() {
            return;
        }
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
        let mut p = KerasConsole::new();
        let mut out = Vec::new();
        for l in text.lines() {
            p.line(l, &mut out);
        }
        out
    }

    #[test]
    fn keras_1_2_3_and_verbose_2() {
        let recs = feed(
            "Epoch 1/40\n\
             127/127 [==============================] - 10s - loss: 194.3781 - val_loss: 0.3296\n\
             Epoch 2/40\n\
             313/313 [==============================] - 351s 1s/step - loss: 0.6855 - acc: 0.5609\n\
             Epoch 3/40\n\
             1875/1875 ━━━━━━━━━━━━━━━━━━━━ 5s 2ms/step - accuracy: 0.8765 - loss: 0.4321\n\
             Epoch 4/40\n\
              - 10s - loss: 0.2 - acc: 0.9\n\
              32/127 [======>.......] - ETA: 3s - loss: 0.1500\n",
        );
        assert_eq!(recs.len(), 5, "{recs:?}");
        assert_eq!(recs[0].epoch, Some(1.0));
        assert_eq!(recs[0].step, Some(127));
        assert_eq!(recs[0].metrics.get("val_loss"), Some(0.3296));
        assert_eq!(recs[1].metrics.get("acc"), Some(0.5609));
        assert_eq!(recs[2].metrics.get("loss"), Some(0.4321));
        assert_eq!(recs[3].step, None);
        assert_eq!(recs[3].epoch, Some(4.0));
        assert_eq!(recs[4].step, Some(32));
        assert!(!recs[4].metrics.contains("ETA"));
    }

    #[test]
    fn other_lines_are_not_records() {
        assert!(feed("Total params: 1,282,545.0\n0.0279299\n3/5 files - loss: 1\n").is_empty());
    }
}
