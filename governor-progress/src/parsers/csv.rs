//! CSV loggers: PyTorch Lightning `CSVLogger`, Keras `CSVLogger`, Ultralytics `results.csv`.
//!
//! The header must be the first non-empty line. Cells are trimmed (Ultralytics pads every
//! field to a fixed width), empty cells are absent metrics (Lightning writes sparse rows), and
//! a later line that is a header again (a new run appending to the file, or a logger that
//! re-writes its header) replaces the column set. Rows are split with `memchr` and numbers read
//! by the standard library: no allocation per row beyond the record itself.
//!
//! Columns: `epoch` becomes the record's epoch; Lightning's `step` its step (the global step
//! Lightning logged); every other column a metric under its header name. Lightning rows whose
//! metrics are all `val*`/`test*` are eval records; Keras and Ultralytics rows carry train and
//! validation values of one epoch together and are train records.

use std::sync::Arc;

use super::{LineParser, Names, Status, split_by_names};
use crate::num::parse_plain;
use crate::record::{Metrics, RecordData, Split, step_from_f64};

/// Which CSV logger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    Lightning,
    Keras,
    Ultralytics,
}

#[derive(Clone, Debug)]
enum Column {
    Epoch,
    Step,
    Metric(Arc<str>),
}

pub(crate) struct CsvParser {
    dialect: Dialect,
    columns: Option<Vec<Column>>,
    seen_first_line: bool,
    rejected: bool,
    names: Names,
    fields: Vec<String>,
}

impl CsvParser {
    pub(crate) fn new(dialect: Dialect) -> Self {
        CsvParser {
            dialect,
            columns: None,
            seen_first_line: false,
            rejected: false,
            names: Names::default(),
            fields: Vec::new(),
        }
    }

    /// The column set if `line` is a header of this dialect.
    fn header(&mut self, line: &str) -> Option<Vec<Column>> {
        split_fields(line, &mut self.fields);
        let fields = &self.fields;
        if fields.len() < 2 {
            return None;
        }
        for f in fields {
            if f.is_empty() || parse_plain(f).is_some() {
                return None;
            }
            // Header cells are names, not sentences.
            if f.len() > 128 || f.chars().any(|c| c.is_control()) {
                return None;
            }
        }
        let has = |name: &str| fields.iter().any(|f| f == name);
        let ultralytics = has("epoch") && fields.iter().any(|f| f.starts_with("train/"));
        let ok = match self.dialect {
            Dialect::Ultralytics => ultralytics,
            Dialect::Lightning => !ultralytics && has("step"),
            Dialect::Keras => !ultralytics && !has("step") && fields[0] == "epoch",
        };
        if !ok {
            return None;
        }
        // Duplicate column names would make two metrics of one name.
        for (i, f) in fields.iter().enumerate() {
            if fields[..i].contains(f) {
                return None;
            }
        }
        let dialect = self.dialect;
        let cols = fields
            .iter()
            .map(|f| match f.as_str() {
                "epoch" => Column::Epoch,
                "step" if dialect == Dialect::Lightning => Column::Step,
                _ => Column::Metric(self.names.get(f)),
            })
            .collect();
        Some(cols)
    }
}

/// Splits a CSV line into trimmed fields (quoted fields are unquoted; `""` is a quote).
fn split_fields(line: &str, out: &mut Vec<String>) {
    out.clear();
    if !line.contains('"') {
        out.extend(line.split(',').map(|f| f.trim().to_owned()));
        return;
    }
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if in_quotes && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => in_quotes = !in_quotes,
            ',' if !in_quotes => out.push(std::mem::take(&mut cur).trim().to_owned()),
            _ => cur.push(c),
        }
    }
    out.push(cur.trim().to_owned());
}

impl LineParser for CsvParser {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        if self.rejected {
            return;
        }
        if !self.seen_first_line {
            self.seen_first_line = true;
            match self.header(line) {
                Some(cols) => self.columns = Some(cols),
                None => self.rejected = true,
            }
            return;
        }
        let quoted = memchr::memchr(b'"', line.as_bytes()).is_some();
        let first = line.split(',').next().unwrap_or("").trim();
        if !first.is_empty() && !quoted && parse_plain(first).is_none() {
            // Not a data row: a repeated or new header, or noise.
            if let Some(cols) = self.header(line) {
                self.columns = Some(cols);
            }
            return;
        }
        let Some(columns) = &self.columns else { return };
        let mut rec = RecordData {
            metrics: Metrics::with_capacity(columns.len()),
            ..RecordData::default()
        };
        let mut handle = |col: &Column, cell: &str| {
            if cell.is_empty() {
                return;
            }
            let Some(v) = parse_plain(cell) else { return };
            match col {
                Column::Epoch => rec.epoch = Some(v).filter(|v| v.is_finite()),
                Column::Step => rec.step = step_from_f64(v),
                Column::Metric(name) => rec.metrics.push_unique(name.clone(), v),
            }
        };
        if quoted {
            split_fields(line, &mut self.fields);
            for (col, cell) in columns.iter().zip(self.fields.iter()) {
                handle(col, cell);
            }
        } else {
            for (col, cell) in columns.iter().zip(line.split(',')) {
                handle(col, cell.trim());
            }
        }
        if rec.metrics.is_empty() {
            return;
        }
        rec.split = match self.dialect {
            Dialect::Lightning => split_by_names(&rec.metrics),
            Dialect::Keras | Dialect::Ultralytics => Split::Train,
        };
        out.push(rec);
    }

    fn status(&self) -> Status {
        if self.rejected {
            Status::Rejected
        } else if self.columns.is_some() {
            Status::Recognized
        } else {
            Status::Undetermined
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(dialect: Dialect, text: &str) -> (Vec<RecordData>, Status) {
        let mut p = CsvParser::new(dialect);
        let mut out = Vec::new();
        for l in text.lines() {
            p.line(l, &mut out);
        }
        (out, p.status())
    }

    #[test]
    fn lightning_sparse_rows_and_eval_split() {
        let (recs, st) = parse(
            Dialect::Lightning,
            "epoch,step,train_loss,val_loss\n0,49,0.5,\n0,99,,0.7\n",
        );
        assert_eq!(st, Status::Recognized);
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].step, Some(49));
        assert_eq!(recs[0].epoch, Some(0.0));
        assert_eq!(recs[0].metrics.get("train_loss"), Some(0.5));
        assert!(!recs[0].metrics.contains("val_loss"));
        assert_eq!(recs[0].split, Split::Train);
        assert_eq!(recs[1].split, Split::Eval);
    }

    #[test]
    fn ultralytics_padded_fields() {
        let (recs, _) = parse(
            Dialect::Ultralytics,
            "   epoch,   train/box_loss,metrics/mAP_0.5:0.95\n       0,    0.067453,   0.39306\n",
        );
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].metrics.get("train/box_loss"), Some(0.067453));
        assert_eq!(recs[0].metrics.get("metrics/mAP_0.5:0.95"), Some(0.39306));
    }

    #[test]
    fn dialects_reject_each_others_headers() {
        assert_eq!(
            parse(Dialect::Keras, "epoch,step,loss\n").1,
            Status::Rejected
        );
        assert_eq!(
            parse(Dialect::Lightning, "epoch,loss\n").1,
            Status::Rejected
        );
        assert_eq!(
            parse(Dialect::Keras, "epoch,train/box_loss\n").1,
            Status::Rejected
        );
        assert_eq!(
            parse(Dialect::Keras, "hello world\nepoch,loss\n").1,
            Status::Rejected
        );
        assert_eq!(parse(Dialect::Keras, "1,2\n").1, Status::Rejected);
    }

    #[test]
    fn repeated_header_is_not_a_record_and_quoted_cells_work() {
        let (recs, _) = parse(
            Dialect::Keras,
            "epoch,loss,acc\n0,1.0,0.5\nepoch,loss,acc\n0,\"0.9\",0.6\n",
        );
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].metrics.get("loss"), Some(0.9));
    }
}
