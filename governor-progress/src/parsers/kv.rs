//! Generic print/logging lines: whatever a training script prints with `print()` or
//! `logging`, as long as it names its numbers.
//!
//! ```text
//! epoch 3, loss 0.25, acc 91.2%
//! Epoch [50/500], Step [100/600], Loss: 0.1234
//! 2025-01-06 15:04:15,292 INFO: Epoch: 0/50, Iteration step: 1300, loss: 5.216
//! Epoch: 1| train loss: 0.5644293498992919
//! Epoch 1: Val acc is 86.0026235026235%
//!   Epoch 1/3 | Step 100/1000 | Loss: 2.1796 | Accuracy: 21.0%
//! ```
//!
//! Every number is paired with the name before it: after `:` the name may be several words
//! (`Iteration step`, `top 1 acc`, `Val acc is` — a trailing `is`/`of`/`was` is dropped), after
//! `=`, `[` or a plain space it is one word. Names are lower-cased with `_` for spaces.
//! `epoch`, `step`, `iter`, `iteration`, `iteration step`, `batch`... are counters (`3/50`
//! reads as 3); `N/M` after any other name is not a metric (`Accuracy: 9836/10000`). Numbers
//! glued to letters (`1.94s`, `0G`), dates and times are not values; `%` is dropped, the value
//! kept as printed.
//!
//! A line is a record when one of its names looks like a metric (loss, acc, perplexity, mAP,
//! F1, ...) and it also has a counter or a second metric: a lone `with loss weight 1` is not
//! progress. It is an eval record when all its metrics are named `val*`/`eval*`/`test*` or
//! the text before its first name says validation/eval/test (`Test set: Average loss: ...`).

use super::{KeyRole, LineParser, Names, generic_key_role, is_metric_like};
use crate::num::{non_finite_word_at, number_len};
use crate::record::{Metrics, RecordData, Split, is_eval_metric_name, step_from_f64};

pub(crate) struct PrintKv {
    names: Names,
}

impl PrintKv {
    pub(crate) fn new() -> Self {
        PrintKv {
            names: Names::default(),
        }
    }
}

#[derive(Debug)]
struct Pair {
    key_start: usize,
    value_start: usize,
    key: String,
    value: f64,
    /// Written `N/M`.
    fraction: bool,
}

fn is_key_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'/' | b'.' | b'@') || c >= 0x80
}

/// The name written before the value at `value_start`, with where it starts.
fn key_before(b: &[u8], value_start: usize) -> Option<(usize, String)> {
    let mut j = value_start;
    let skip_spaces = |j: &mut usize| {
        while *j > 0 && (b[*j - 1] == b' ' || b[*j - 1] == b'\t') {
            *j -= 1;
        }
    };
    skip_spaces(&mut j);
    let mut multi_word = false;
    // `Val acc is 86.0%`, `loss was 0.3`, `loss of 0.5`: the verb separates like `:`.
    let verb = [&b" is"[..], b" was", b" of"]
        .into_iter()
        .find(|v| j > v.len() && b[..j].ends_with(v));
    if let Some(v) = verb {
        multi_word = true;
        j -= v.len();
        skip_spaces(&mut j);
    } else if j > 0 && b[j - 1] == b':' {
        multi_word = true;
        j -= 1;
        skip_spaces(&mut j);
    } else if j > 0 && matches!(b[j - 1], b'=' | b'[' | b'#') {
        j -= 1;
        skip_spaces(&mut j);
    }
    let end = j;
    let mut words = 1;
    while j > 0 {
        let c = b[j - 1];
        if is_key_byte(c) {
            j -= 1;
        } else if c == b'-' && j >= 2 && is_key_byte(b[j - 2]) && j < end && is_key_byte(b[j]) {
            // `mAP50-95`, `top-1`; but ` - ` separates.
            j -= 1;
        } else if multi_word
            && c == b' '
            && j >= 2
            && is_key_byte(b[j - 2])
            && j < end
            && is_key_byte(b[j])
            && words < 4
        {
            words += 1;
            j -= 1;
        } else {
            break;
        }
    }
    if j == end {
        return None;
    }
    let raw = std::str::from_utf8(&b[j..end]).ok()?;
    let mut words: Vec<&str> = raw.split(' ').filter(|w| !w.is_empty()).collect();
    while words.len() > 1
        && matches!(
            words.last().map(|w| w.to_ascii_lowercase()).as_deref(),
            Some("is" | "of" | "was" | "are" | "at")
        )
    {
        words.pop();
    }
    let first = words.first()?;
    if !first.as_bytes()[0].is_ascii_alphabetic() || raw.len() > 64 {
        return None;
    }
    Some((j, words.join("_").to_ascii_lowercase()))
}

fn pairs(line: &str) -> Vec<Pair> {
    let b = line.as_bytes();
    let mut out: Vec<Pair> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let prev_ok = i == 0 || !(is_key_byte(b[i - 1]) || b[i - 1] == b'-' || b[i - 1] == b'+');
        let starts = c.is_ascii_digit()
            || ((c == b'-' || c == b'+' || c == b'.')
                && b.get(i + 1)
                    .is_some_and(|d| d.is_ascii_digit() || *d == b'.'))
            || matches!(c, b'n' | b'N' | b'i' | b'I' | b'-');
        if !prev_ok || !starts {
            i += 1;
            continue;
        }
        let (value, mut end) = match number_len(b, i) {
            0 => match non_finite_word_at(b, i) {
                Some((v, n)) => (v, i + n),
                None => {
                    i += 1;
                    continue;
                }
            },
            n => match std::str::from_utf8(&b[i..i + n])
                .ok()
                .and_then(|s| s.parse().ok())
            {
                Some(v) => (v, i + n),
                None => {
                    i += n;
                    continue;
                }
            },
        };
        let mut fraction = false;
        match b.get(end) {
            Some(b'%') => end += 1,
            Some(b'/') if b.get(end + 1).is_some_and(u8::is_ascii_digit) => {
                fraction = true;
                end += 1;
                while end < b.len() && b[end].is_ascii_digit() {
                    end += 1;
                }
            }
            Some(&d)
                if d.is_ascii_alphabetic()
                    || d == b'_'
                    || ((d == b'-' || d == b':' || d == b'.')
                        && b.get(end + 1).is_some_and(u8::is_ascii_digit)) =>
            {
                // A unit (`1.94s`), an identifier (`0G`), a date or a time: not a value.
                while end < b.len() && !b[end].is_ascii_whitespace() && b[end] != b',' {
                    end += 1;
                }
                i = end;
                continue;
            }
            _ => {}
        }
        if let Some((key_start, key)) = key_before(b, i) {
            out.push(Pair {
                key_start,
                value_start: i,
                key,
                value,
                fraction,
            });
        }
        i = end;
    }
    // A number inside a later multi-word name (`top 1 acc: 0.03`) is part of that name.
    let mut keep = vec![true; out.len()];
    for q in 0..out.len() {
        for p in 0..q {
            if out[q].key_start <= out[p].value_start {
                keep[p] = false;
            }
        }
    }
    let mut k = keep.into_iter();
    out.retain(|_| k.next().unwrap_or(true));
    out
}

impl LineParser for PrintKv {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        // Cheap precondition: a record needs a digit and a name.
        if !line.bytes().any(|c| c.is_ascii_digit()) && !line.contains("nan") {
            return;
        }
        let found = pairs(line);
        if found.is_empty() {
            return;
        }
        let mut rec = RecordData {
            metrics: Metrics::with_capacity(found.len()),
            ..RecordData::default()
        };
        let mut counters = 0;
        let mut metric_like = false;
        for p in &found {
            match generic_key_role(&p.key) {
                KeyRole::Epoch => {
                    if rec.epoch.is_none() && p.value.is_finite() {
                        rec.epoch = Some(p.value);
                        counters += 1;
                    }
                }
                KeyRole::Step => {
                    if rec.step.is_none()
                        && let Some(s) = step_from_f64(p.value)
                    {
                        rec.step = Some(s);
                        counters += 1;
                    }
                }
                KeyRole::Metric => {
                    if p.fraction {
                        continue;
                    }
                    metric_like |= is_metric_like(&p.key);
                    rec.metrics.insert(self.names.get(&p.key), p.value);
                }
            }
        }
        if !metric_like || (counters == 0 && rec.metrics.len() < 2) {
            return;
        }
        let prefix = &line[..found[0].key_start];
        let prefix_says_eval = prefix
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| Split::from_word(w) == Some(Split::Eval));
        rec.split = if prefix_says_eval || rec.metrics.iter().all(|(k, _)| is_eval_metric_name(k)) {
            Split::Eval
        } else {
            Split::Train
        };
        out.push(rec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(line: &str) -> Option<RecordData> {
        let mut p = PrintKv::new();
        let mut out = Vec::new();
        p.line(line, &mut out);
        assert!(out.len() <= 1);
        out.pop()
    }

    fn metrics(r: &RecordData) -> Vec<(String, f64)> {
        r.metrics.iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }

    #[test]
    fn common_print_styles() {
        let r = one("epoch 3, loss 0.25, acc 91.2%").unwrap();
        assert_eq!(r.epoch, Some(3.0));
        assert_eq!(
            metrics(&r),
            vec![("loss".into(), 0.25), ("acc".into(), 91.2)]
        );

        let r = one("Epoch [50/500], Step [100/600], Loss: 0.1234").unwrap();
        assert_eq!((r.epoch, r.step), (Some(50.0), Some(100)));
        assert_eq!(metrics(&r), vec![("loss".into(), 0.1234)]);

        let r = one("2025-01-06 15:04:15,292 INFO: Epoch: 0/50, Iteration step: 1300, loss: 5.216")
            .unwrap();
        assert_eq!((r.epoch, r.step), (Some(0.0), Some(1300)));
        assert_eq!(metrics(&r), vec![("loss".into(), 5.216)]);

        let r = one("Epoch: 1| train loss: 0.5644293498992919").unwrap();
        assert_eq!(metrics(&r), vec![("train_loss".into(), 0.5644293498992919)]);

        let r = one("Epoch 1: Val acc is 86.0026235026235%").unwrap();
        assert_eq!(metrics(&r), vec![("val_acc".into(), 86.0026235026235)]);
        assert_eq!(r.split, Split::Eval);

        let r = one("  Epoch 1/3 | Step 100/1000 | Loss: 2.1796 | Accuracy: 21.0%").unwrap();
        assert_eq!((r.epoch, r.step), (Some(1.0), Some(100)));
        assert_eq!(
            metrics(&r),
            vec![("loss".into(), 2.1796), ("accuracy".into(), 21.0)]
        );

        let r = one("==============Epoch: 0/50,top 1 acc: 0.0354==============").unwrap();
        assert_eq!(metrics(&r), vec![("top_1_acc".into(), 0.0354)]);

        let r = one("  Epoch 1 Complete - Avg Loss: 1.2973, Accuracy: 54.9%").unwrap();
        assert_eq!(r.epoch, Some(1.0));
        assert_eq!(
            metrics(&r),
            vec![("avg_loss".into(), 1.2973), ("accuracy".into(), 54.9)]
        );

        let r = one("step 12 loss=nan lr=1e-4").unwrap();
        assert!(r.metrics.get("loss").unwrap().is_nan());
        assert_eq!(r.metrics.get("lr"), Some(1e-4));

        let r = one("Test set: Average loss: 0.0494, top5 err: 1.2").unwrap();
        assert_eq!(r.split, Split::Eval);
    }

    #[test]
    fn noise_is_not_a_record() {
        for line in [
            "total sample is 93858, postive sample is 39370, negative sample is 54488",
            "I0728 23:55:38.866894  4259 net.cpp:132]     with loss weight 1",
            "Epochs: 3, Learning Rate: 0.005, Samples/Epoch: 1000",
            "HTTP Error 403: Forbidden",
            "Accuracy: 9836/10000 (98%)",
            "time 1431.27ms, 10.99s/it, 2.61G",
            "  Overall Accuracy: 77.20% (386/500)",
            "no digits here",
        ] {
            assert!(one(line).is_none(), "{line:?} gave {:?}", one(line));
        }
    }
}
