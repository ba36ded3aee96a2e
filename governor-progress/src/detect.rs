//! Format detection and the per-file incremental parser.
//!
//! Auto-detection runs every format's parser side by side over the lines seen so far and
//! decides as soon as the evidence is enough, so that a file is parsed the same way whether it
//! is read whole (`governor parse`) or line by line as it grows (the watcher):
//!
//! 1. a *strong* format decides as soon as it recognises its structure (a CSV header, a
//!    complete `trainer_state.json`) or produces a record: those shapes are specific to one
//!    program. Ties on the same line go to the earlier format of [`Format::ALL`];
//! 2. a *weak* format (generic JSON lines, generic print lines) decides once it has produced
//!    [`WEAK_RECORDS`] records with no strong format recognised;
//! 3. at the end of the input, an undecided file takes the strong format that recognised
//!    something, else the weak format with the most records; none means the file is in no
//!    known format.
//!
//! Until the decision the candidates' records are held back; then the winner's are released
//! in order and the others are dropped. Formats that reject the input (a CSV dialect whose first
//! line is not its header) leave the race at once, so detection costs little after the first
//! lines.

use super::ProgressError;
use super::format::{Format, FormatChoice, Strength};
use super::lines::clean_line;
use super::parsers::custom::CustomFormat;
use super::parsers::{LineParser, Status, parser_for};
use super::record::RecordData;

/// Records a weak format must produce before it is believed.
pub const WEAK_RECORDS: usize = 3;

struct Candidate {
    format: Format,
    parser: Box<dyn LineParser>,
    pending: Vec<RecordData>,
}

enum Mode {
    Detecting(Vec<Candidate>),
    Decided {
        format: Format,
        parser: Box<dyn LineParser>,
    },
}

/// The incremental parser of one file: fed complete lines, it detects (or is told) the format
/// and turns lines into records.
pub struct LogParser {
    mode: Mode,
    /// The format was chosen by the caller rather than detected.
    fixed: bool,
    records: u64,
}

impl LogParser {
    /// A parser for `choice`; a custom format, when given, is used whatever the choice.
    pub fn new(choice: FormatChoice, custom: Option<&CustomFormat>) -> Result<Self, ProgressError> {
        if let Some(custom) = custom {
            return Ok(LogParser::decided(
                Format::Custom,
                Box::new(custom.compile()?),
                true,
            ));
        }
        match choice {
            FormatChoice::Fixed(Format::Custom) => Err(ProgressError::CustomMissing),
            FormatChoice::Fixed(format) => {
                let parser = parser_for(format).ok_or(ProgressError::NotLines { format })?;
                Ok(LogParser::decided(format, parser, true))
            }
            FormatChoice::Auto => {
                let candidates = Format::ALL
                    .into_iter()
                    .filter(|f| f.is_line_format())
                    .filter_map(|format| {
                        parser_for(format).map(|parser| Candidate {
                            format,
                            parser,
                            pending: Vec::new(),
                        })
                    })
                    .collect();
                Ok(LogParser {
                    mode: Mode::Detecting(candidates),
                    fixed: false,
                    records: 0,
                })
            }
        }
    }

    /// A parser of `format` built by the caller (MLflow's metric files are named by their path).
    pub(crate) fn with_parser(format: Format, parser: Box<dyn LineParser>) -> Self {
        LogParser::decided(format, parser, true)
    }

    fn decided(format: Format, parser: Box<dyn LineParser>, fixed: bool) -> Self {
        LogParser {
            mode: Mode::Decided { format, parser },
            fixed,
            records: 0,
        }
    }

    /// The format, once known.
    pub fn format(&self) -> Option<Format> {
        match &self.mode {
            Mode::Decided { format, .. } => Some(*format),
            Mode::Detecting(_) => None,
        }
    }

    /// True when the input is known to be in the format: detected, or (for a format fixed by
    /// the caller) its structure was seen or it produced a record.
    pub fn recognized(&self) -> bool {
        match &self.mode {
            Mode::Decided { parser, .. } => {
                !self.fixed || self.records > 0 || parser.status() == Status::Recognized
            }
            Mode::Detecting(_) => false,
        }
    }

    /// True when the file is (or may still turn out to be) a document rewritten in place.
    pub fn is_document(&self) -> bool {
        match &self.mode {
            Mode::Decided { format, .. } => format.is_document(),
            Mode::Detecting(cands) => cands.iter().any(|c| c.format.is_document()),
        }
    }

    /// Records produced so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Feeds one complete raw line (terminal escapes and invalid UTF-8 are dealt with here).
    pub fn line(&mut self, raw: &[u8], out: &mut Vec<RecordData>) {
        let line = clean_line(raw);
        if line.trim().is_empty() {
            return;
        }
        let before = out.len();
        match &mut self.mode {
            Mode::Decided { parser, .. } => parser.line(&line, out),
            Mode::Detecting(cands) => {
                for c in cands.iter_mut() {
                    c.parser.line(&line, &mut c.pending);
                }
                cands.retain(|c| c.parser.status() != Status::Rejected);
                self.try_decide(false, out);
            }
        }
        self.records += (out.len() - before) as u64;
    }

    /// End of the input (or the writer closed the file): releases held-back records and, if
    /// still detecting, decides with what was seen.
    pub fn finish(&mut self, out: &mut Vec<RecordData>) {
        let before = out.len();
        match &mut self.mode {
            Mode::Decided { parser, .. } => parser.flush(out),
            Mode::Detecting(cands) => {
                for c in cands.iter_mut() {
                    c.parser.flush(&mut c.pending);
                }
                self.try_decide(true, out);
            }
        }
        self.records += (out.len() - before) as u64;
    }

    /// The writer closed the file but may come back: records a parser holds back (Caffe's
    /// test outputs) are released; an undecided format stays undecided (weak evidence is not
    /// forced into a decision as it is at the end of the input).
    pub fn flush_pending(&mut self, out: &mut Vec<RecordData>) {
        let before = out.len();
        match &mut self.mode {
            Mode::Decided { parser, .. } => parser.flush(out),
            Mode::Detecting(cands) => {
                for c in cands.iter_mut() {
                    c.parser.flush(&mut c.pending);
                }
                self.try_decide(false, out);
            }
        }
        self.records += (out.len() - before) as u64;
    }

    /// The file was truncated or replaced: a document format starts over, line formats keep
    /// their state (a logger that copytruncates goes on under the same CSV header).
    pub fn restart(&mut self) {
        match &mut self.mode {
            Mode::Decided { parser, .. } => parser.restart(),
            Mode::Detecting(cands) => cands.iter_mut().for_each(|c| c.parser.restart()),
        }
    }

    fn try_decide(&mut self, at_end: bool, out: &mut Vec<RecordData>) {
        let Mode::Detecting(cands) = &mut self.mode else {
            return;
        };
        let strong = cands.iter().position(|c| {
            c.format.strength() == Strength::Strong
                && (c.parser.status() == Status::Recognized || !c.pending.is_empty())
        });
        let chosen = strong.or_else(|| {
            let threshold = if at_end { 1 } else { WEAK_RECORDS };
            let mut best: Option<usize> = None;
            for (i, c) in cands.iter().enumerate() {
                if c.pending.len() >= threshold
                    && best.is_none_or(|b| c.pending.len() > cands[b].pending.len())
                {
                    best = Some(i);
                }
            }
            best
        });
        if let Some(i) = chosen {
            let c = cands.swap_remove(i);
            out.extend(c.pending);
            self.mode = Mode::Decided {
                format: c.format,
                parser: c.parser,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> (Option<Format>, usize) {
        let mut p = LogParser::new(FormatChoice::Auto, None).unwrap();
        let mut out = Vec::new();
        for l in text.lines() {
            p.line(l.as_bytes(), &mut out);
        }
        p.finish(&mut out);
        (p.format(), out.len())
    }

    #[test]
    fn csv_header_decides_on_the_first_line() {
        let mut p = LogParser::new(FormatChoice::Auto, None).unwrap();
        let mut out = Vec::new();
        p.line(b"epoch,accuracy,loss,val_accuracy,val_loss", &mut out);
        assert_eq!(p.format(), Some(Format::KerasCsv));
        assert!(p.recognized());
    }

    #[test]
    fn strong_format_beats_earlier_weak_records() {
        let text = "epoch 1 loss 0.5 acc 0.1\nepoch 2 loss 0.4 acc 0.2\n\
                    iter 0: loss 4.2709, time 10268.08ms, mfu -100.00%\n";
        assert_eq!(run(text), (Some(Format::Nanogpt), 1));
    }

    #[test]
    fn weak_format_needs_several_records() {
        let mut p = LogParser::new(FormatChoice::Auto, None).unwrap();
        let mut out = Vec::new();
        for (i, l) in [
            "epoch 1, loss 0.5",
            "epoch 2, loss 0.4",
            "epoch 3, loss 0.3",
        ]
        .iter()
        .enumerate()
        {
            p.line(l.as_bytes(), &mut out);
            assert_eq!(p.format().is_some(), i == 2, "after line {i}");
        }
        assert_eq!(p.format(), Some(Format::PrintKv));
        assert_eq!(out.len(), 3);
        // At the end of the input one record is enough.
        assert_eq!(run("epoch 1, loss 0.5\n"), (Some(Format::PrintKv), 1));
    }

    #[test]
    fn nothing_known_stays_undecided() {
        assert_eq!(run("hello\nworld 42\n"), (None, 0));
    }

    #[test]
    fn fixed_format_reports_whether_it_matched() {
        let mut p = LogParser::new(FormatChoice::Fixed(Format::KerasCsv), None).unwrap();
        let mut out = Vec::new();
        p.line(b"hello", &mut out);
        assert!(!p.recognized());
        assert!(matches!(
            LogParser::new(FormatChoice::Fixed(Format::Custom), None),
            Err(ProgressError::CustomMissing)
        ));
    }
}
