//! Hugging Face Trainer: `trainer_state.json` and the console dicts.
//!
//! `trainer_state.json` is one JSON document that the Trainer rewrites whole at every save.
//! Each `log_history` entry is a record (`epoch`, `step`, and every numeric field as a metric;
//! entries whose metrics are all `eval_*` are eval records, the final `train_runtime`/
//! `train_loss` summary is a train record). When the document is read again after a rewrite,
//! only entries after the last one emitted are new; if that last entry is not where it was, the
//! document belongs to a new run and every entry is emitted again (the signal tracker sees the
//! counters restart).
//!
//! Console: the Trainer prints each log as a Python dict, `{'loss': 0.6899, 'epoch': 0.16}`;
//! recent versions quote every value (`{'loss': '19.85', 'epoch': '1'}`), numpy 2 prints
//! `np.float64(0.5)`. The dict may follow tqdm text on the same line when carriage returns were
//! lost.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use super::{LineParser, Names, Status, split_by_names};
use crate::json::{Scalar, scan_array_of_objects, scan_object};
use crate::num::parse_number;
use crate::record::{Metrics, RecordData, step_from_f64};

/// Largest document buffered while waiting for it to be complete.
const MAX_DOCUMENT_BYTES: usize = 64 << 20;

#[derive(Debug, PartialEq, Eq)]
enum DocState {
    /// Waiting for a line that opens a document.
    Idle,
    /// Between `{` and the end of the document.
    Collecting,
}

pub(crate) struct TrainerState {
    state: DocState,
    buf: String,
    seen_first_line: bool,
    rejected: bool,
    recognized: bool,
    /// Entries emitted from the current run's document, and a fingerprint of the last one.
    emitted: usize,
    last_fingerprint: Option<u64>,
    names: Names,
}

impl TrainerState {
    pub(crate) fn new() -> Self {
        TrainerState {
            state: DocState::Idle,
            buf: String::new(),
            seen_first_line: false,
            rejected: false,
            recognized: false,
            emitted: 0,
            last_fingerprint: None,
            names: Names::default(),
        }
    }

    /// Tries to read the buffered document; true when it was a complete trainer state.
    fn try_document(&mut self, out: &mut Vec<RecordData>) -> bool {
        let mut entries: Vec<RecordData> = Vec::new();
        let names = &mut self.names;
        let parsed = scan_array_of_objects(self.buf.as_bytes(), "log_history", &mut |i, k, v| {
            while entries.len() <= i {
                entries.push(RecordData::default());
            }
            let e = &mut entries[i];
            let value = match v {
                Scalar::Num(x) => x,
                Scalar::Str(s) => match parse_number(&s) {
                    Some(x) => x,
                    None => return,
                },
                _ => return,
            };
            match k {
                "epoch" => e.epoch = Some(value).filter(|v| v.is_finite()),
                "step" => e.step = step_from_f64(value),
                _ => e.metrics.insert(names.get(k), value),
            }
        });
        let Some(count) = parsed else { return false };
        // Elements that were not objects (or empty objects) yield default records: drop them
        // but keep positions so the fingerprint logic counts entries, not records.
        entries.resize_with(count, RecordData::default);
        self.recognized = true;
        let fingerprints: Vec<u64> = entries.iter().map(fingerprint).collect();
        let continues = self.emitted <= count
            && (self.emitted == 0 || Some(fingerprints[self.emitted - 1]) == self.last_fingerprint);
        let start = if continues { self.emitted } else { 0 };
        for mut e in entries.drain(..).skip(start) {
            if e.metrics.is_empty() {
                continue;
            }
            e.split = split_by_names(&e.metrics);
            out.push(e);
        }
        self.emitted = count;
        self.last_fingerprint = fingerprints.last().copied();
        true
    }
}

fn fingerprint(r: &RecordData) -> u64 {
    let mut h = DefaultHasher::new();
    r.epoch.map(f64::to_bits).hash(&mut h);
    r.step.hash(&mut h);
    for (k, v) in r.metrics.iter() {
        k.hash(&mut h);
        v.to_bits().hash(&mut h);
    }
    h.finish()
}

impl LineParser for TrainerState {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        if self.rejected {
            return;
        }
        let trimmed = line.trim();
        if trimmed.is_empty() {
            return;
        }
        if !self.seen_first_line {
            self.seen_first_line = true;
            if !trimmed.starts_with('{') {
                self.rejected = true;
                return;
            }
        }
        if self.state == DocState::Idle {
            if !(line.starts_with('{')) {
                return;
            }
            self.state = DocState::Collecting;
            self.buf.clear();
        }
        if self.buf.len() + line.len() + 1 > MAX_DOCUMENT_BYTES {
            self.buf = String::new();
            self.state = DocState::Idle;
            if !self.recognized {
                self.rejected = true;
            }
            return;
        }
        self.buf.push_str(line);
        self.buf.push('\n');
        // A pretty-printed document ends with `}` in column 0; a compact one is one line.
        if line.starts_with('}') || (line.starts_with('{') && line.trim_end().ends_with('}')) {
            if self.try_document(out) {
                self.buf.clear();
                self.state = DocState::Idle;
            } else if scan_object(self.buf.as_bytes(), &mut String::new(), &mut |_, _| {}).is_some()
            {
                // A complete object that is not a trainer state (a JSON line, some other
                // document): before recognition this is not the format; after, skip it.
                self.buf.clear();
                self.state = DocState::Idle;
                if !self.recognized {
                    self.rejected = true;
                }
            }
        }
    }

    fn flush(&mut self, out: &mut Vec<RecordData>) {
        if self.state == DocState::Collecting && self.try_document(out) {
            self.buf.clear();
            self.state = DocState::Idle;
        }
    }

    fn status(&self) -> Status {
        if self.recognized {
            Status::Recognized
        } else if self.rejected {
            Status::Rejected
        } else {
            Status::Undetermined
        }
    }

    fn restart(&mut self) {
        self.buf.clear();
        self.state = DocState::Idle;
    }
}

/// Console dicts.
pub(crate) struct ConsoleDicts {
    names: Names,
}

impl ConsoleDicts {
    pub(crate) fn new() -> Self {
        ConsoleDicts {
            names: Names::default(),
        }
    }
}

/// Reads a Python dict literal starting at `b[i] == '{'`; calls `visit(key, value_text)` for
/// each entry and returns whether the dict closed properly.
fn python_dict(s: &str, visit: &mut dyn FnMut(&str, &str)) -> bool {
    let b = s.as_bytes();
    let mut i = 1;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let quoted = |i: &mut usize| -> Option<(usize, usize)> {
        let q = *b.get(*i)?;
        if q != b'\'' && q != b'"' {
            return None;
        }
        let start = *i + 1;
        let end = start + memchr::memchr(q, &b[start..])?;
        *i = end + 1;
        Some((start, end))
    };
    loop {
        ws(&mut i);
        match b.get(i) {
            Some(b'}') => return true,
            None => return false,
            _ => {}
        }
        let Some((ks, ke)) = quoted(&mut i) else {
            return false;
        };
        ws(&mut i);
        if b.get(i) != Some(&b':') {
            return false;
        }
        i += 1;
        ws(&mut i);
        let (vs, ve) = match b.get(i) {
            Some(b'\'') | Some(b'"') => match quoted(&mut i) {
                Some(r) => r,
                None => return false,
            },
            Some(_) => {
                // Up to the next ',' or '}' outside parentheses (np.float64(0.5), tensor(...)).
                let start = i;
                let mut depth = 0usize;
                while i < b.len() {
                    match b[i] {
                        b'(' | b'[' => depth += 1,
                        b')' | b']' => depth = depth.saturating_sub(1),
                        b',' | b'}' if depth == 0 => break,
                        _ => {}
                    }
                    i += 1;
                }
                (start, i)
            }
            None => return false,
        };
        visit(&s[ks..ke], &s[vs..ve]);
        ws(&mut i);
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return true,
            _ => return false,
        }
    }
}

/// A Python value repr as a number: `0.5`, `'0.5'`, `nan`, `np.float64(0.5)`, `tensor(0.5, ...)`.
fn python_number(text: &str) -> Option<f64> {
    let t = text.trim();
    if let Some(open) = t.find('(') {
        let name = &t[..open];
        if !name.is_empty()
            && name
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'_')
        {
            let inner = &t[open + 1..t.rfind(')')?];
            let first = inner.split(',').next()?;
            return parse_number(first);
        }
        return None;
    }
    parse_number(t)
}

impl LineParser for ConsoleDicts {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        // Python prints dicts with single-quoted keys; `{"` lines are JSON, not this format.
        let Some(start) = line.find("{'") else {
            return;
        };
        let dict = &line[start..];
        let mut rec = RecordData::default();
        let mut has_loss_or_epoch = false;
        let mut metrics = Metrics::with_capacity(8);
        let names = &mut self.names;
        let closed = python_dict(dict, &mut |k, v| {
            let Some(value) = python_number(v) else {
                return;
            };
            match k {
                "epoch" => {
                    rec.epoch = Some(value).filter(|v| v.is_finite());
                    has_loss_or_epoch = true;
                }
                "step" | "global_step" => rec.step = step_from_f64(value),
                _ => {
                    if k.contains("loss") {
                        has_loss_or_epoch = true;
                    }
                    metrics.insert(names.get(k), value);
                }
            }
        });
        if !closed || !has_loss_or_epoch || metrics.is_empty() {
            return;
        }
        // Sanity: the keys of a Trainer dict are identifiers.
        if metrics
            .iter()
            .any(|(k, _)| k.is_empty() || k.contains(char::is_whitespace))
        {
            return;
        }
        rec.split = split_by_names(&metrics);
        rec.metrics = metrics;
        out.push(rec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Split;

    fn feed(p: &mut dyn LineParser, text: &str) -> Vec<RecordData> {
        let mut out = Vec::new();
        for l in text.lines() {
            p.line(l, &mut out);
        }
        out
    }

    const DOC: &str = "{\n  \"epoch\": 1.0,\n  \"log_history\": [\n    {\n      \"epoch\": 0.5,\n      \"loss\": 0.7,\n      \"step\": 10\n    },\n    {\n      \"epoch\": 1.0,\n      \"eval_loss\": NaN,\n      \"step\": 20\n    }\n  ],\n  \"max_steps\": 20\n}\n";

    #[test]
    fn trainer_state_document() {
        let mut p = TrainerState::new();
        let recs = feed(&mut p, DOC);
        assert_eq!(p.status(), Status::Recognized);
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].step, Some(10));
        assert_eq!(recs[0].metrics.get("loss"), Some(0.7));
        assert_eq!(recs[1].split, Split::Eval);
        assert!(recs[1].metrics.get("eval_loss").unwrap().is_nan());
    }

    #[test]
    fn rewritten_document_emits_only_new_entries() {
        let mut p = TrainerState::new();
        assert_eq!(feed(&mut p, DOC).len(), 2);
        p.restart();
        let grown = DOC.replace(
            "  ],",
            "    ,{\n      \"epoch\": 1.5,\n      \"loss\": 0.5,\n      \"step\": 30\n    }\n  ],",
        );
        let recs = feed(&mut p, &grown);
        assert_eq!(recs.len(), 1, "{recs:?}");
        assert_eq!(recs[0].step, Some(30));
        // A different document (new run) is emitted whole.
        p.restart();
        let other = DOC.replace("0.7", "0.9");
        assert_eq!(feed(&mut p, &other).len(), 2);
    }

    #[test]
    fn json_lines_are_not_a_trainer_state() {
        let mut p = TrainerState::new();
        feed(&mut p, "{\"iteration\": 19, \"total_loss\": 2.0}\n");
        assert_eq!(p.status(), Status::Rejected);
    }

    #[test]
    fn console_dicts_plain_quoted_and_numpy() {
        let mut p = ConsoleDicts::new();
        let recs = feed(
            &mut p,
            "{'loss': 0.6899, 'grad_norm': 0.74, 'epoch': 0.16}\n\
             {'loss': '19.85', 'grad_norm': '0.05444', 'epoch': '0.2941'}\n\
             {'eval_loss': np.float64(0.5), 'epoch': 1.0}\n\
              13%|██ | 10/75 [00:32<03:30,  3.24s/it]{'loss': nan, 'epoch': 0.4}\n\
             {'train_runtime': 303.7, 'train_loss': 1.16, 'epoch': 3.0}\n\
             {'a': 1}\n\
             {'loss': 0.5, 'epoch'",
        );
        assert_eq!(recs.len(), 5, "{recs:?}");
        assert_eq!(recs[1].metrics.get("loss"), Some(19.85));
        assert_eq!(recs[1].epoch, Some(0.2941));
        assert_eq!(recs[2].split, Split::Eval);
        assert_eq!(recs[2].metrics.get("eval_loss"), Some(0.5));
        assert!(recs[3].metrics.get("loss").unwrap().is_nan());
        assert_eq!(recs[4].split, Split::Train);
    }
}
