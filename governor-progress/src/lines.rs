//! Splitting appended bytes into complete lines.
//!
//! A line ends at `\n` or at `\r`: CRLF and `\r\r\n` therefore end a line once (the empty
//! pieces between the terminators are dropped), and each tqdm/Keras `\r` refresh is a line of
//! its own, complete as soon as the next refresh starts. Bytes after the last terminator are
//! kept until their terminator arrives: nothing is parsed before it, except when the writer is
//! done ([`LineSplitter::finish`]). A line longer than [`MAX_LINE_BYTES`] is skipped whole and
//! counted, never buffered.
//!
//! Lines are handed out as raw bytes; [`clean_line`] removes terminal escapes and backspaces and
//! makes them valid UTF-8.

use std::borrow::Cow;

/// Longest line that is parsed (1 MiB); longer ones are skipped.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Incremental splitter of a byte stream into lines.
#[derive(Debug)]
pub struct LineSplitter {
    partial: Vec<u8>,
    /// Inside a line that is already too long: drop bytes until its terminator.
    skipping: bool,
    max_line: usize,
    skipped_lines: u64,
}

impl Default for LineSplitter {
    fn default() -> Self {
        LineSplitter::new()
    }
}

impl LineSplitter {
    /// A splitter with the 1 MiB limit.
    pub fn new() -> Self {
        LineSplitter::with_max_line(MAX_LINE_BYTES)
    }

    /// A splitter with another limit (tests).
    pub fn with_max_line(max_line: usize) -> Self {
        LineSplitter {
            partial: Vec::new(),
            skipping: false,
            max_line,
            skipped_lines: 0,
        }
    }

    /// Number of over-long lines skipped so far.
    pub fn skipped_lines(&self) -> u64 {
        self.skipped_lines
    }

    /// Bytes waiting for their terminator.
    pub fn pending_bytes(&self) -> usize {
        self.partial.len()
    }

    /// Feeds appended bytes; calls `on_line` for every line they complete (without its
    /// terminator, never empty).
    pub fn push(&mut self, mut chunk: &[u8], mut on_line: impl FnMut(&[u8])) {
        while let Some(pos) = memchr::memchr2(b'\n', b'\r', chunk) {
            let piece = &chunk[..pos];
            chunk = &chunk[pos + 1..];
            if self.skipping {
                self.skipping = false;
                continue;
            }
            if self.partial.is_empty() {
                if piece.len() > self.max_line {
                    self.skipped_lines += 1;
                } else if !piece.is_empty() {
                    on_line(piece);
                }
            } else if self.partial.len() + piece.len() > self.max_line {
                self.partial.clear();
                self.skipped_lines += 1;
            } else {
                self.partial.extend_from_slice(piece);
                on_line(&self.partial);
                self.partial.clear();
            }
        }
        if self.skipping || chunk.is_empty() {
            return;
        }
        if self.partial.len() + chunk.len() > self.max_line {
            self.partial = Vec::new();
            self.skipping = true;
            self.skipped_lines += 1;
        } else {
            self.partial.extend_from_slice(chunk);
        }
    }

    /// The writer is done: the bytes after the last terminator are a line too.
    pub fn finish(&mut self, mut on_line: impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            on_line(&self.partial);
        }
        self.partial.clear();
        self.skipping = false;
    }

    /// Forgets the unterminated bytes (the file was truncated or replaced).
    pub fn reset(&mut self) {
        self.partial.clear();
        self.skipping = false;
    }
}

/// Makes a raw line parseable: removes ANSI escape sequences (Keras 3, coloured loggers),
/// backspaces (Keras 2 progress bars) and, in such lines, other C0 controls except tab; replaces
/// invalid UTF-8. Borrows when there is nothing to change (the common case, found with one
/// `memchr2` scan and one UTF-8 validation).
pub fn clean_line(raw: &[u8]) -> Cow<'_, str> {
    if memchr::memchr2(0x1b, 0x08, raw).is_none() {
        return match std::str::from_utf8(raw) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => Cow::Owned(String::from_utf8_lossy(raw).into_owned()),
        };
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b == 0x1b {
            i += 1;
            match raw.get(i) {
                // CSI: ESC [ parameters intermediates final-byte(0x40..=0x7e)
                Some(b'[') => {
                    i += 1;
                    while i < raw.len() && !(0x40..=0x7e).contains(&raw[i]) {
                        i += 1;
                    }
                    i += 1;
                }
                // OSC: ESC ] ... BEL or ESC \
                Some(b']') => {
                    i += 1;
                    while i < raw.len() {
                        if raw[i] == 0x07 {
                            i += 1;
                            break;
                        }
                        if raw[i] == 0x1b && raw.get(i + 1) == Some(&b'\\') {
                            i += 2;
                            break;
                        }
                        i += 1;
                    }
                }
                // Two-byte escapes (ESC 7, ESC M...).
                Some(_) => i += 1,
                None => {}
            }
            continue;
        }
        if (b < 0x20 && b != b'\t') || b == 0x7f {
            i += 1;
            continue;
        }
        out.push(b);
        i += 1;
    }
    match String::from_utf8(out) {
        Ok(s) => Cow::Owned(s),
        Err(e) => Cow::Owned(String::from_utf8_lossy(e.as_bytes()).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(chunks: &[&[u8]], finish: bool) -> Vec<String> {
        let mut s = LineSplitter::new();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, |l| out.push(String::from_utf8_lossy(l).into_owned()));
        }
        if finish {
            s.finish(|l| out.push(String::from_utf8_lossy(l).into_owned()));
        }
        out
    }

    #[test]
    fn lf_crlf_crcrlf_and_cr_refreshes_end_lines() {
        assert_eq!(
            split_all(&[b"a\nb\r\nc\r\r\nd\re\n"], false),
            ["a", "b", "c", "d", "e"]
        );
    }

    #[test]
    fn a_line_is_not_emitted_before_its_terminator() {
        let mut s = LineSplitter::new();
        let mut out: Vec<Vec<u8>> = Vec::new();
        s.push(b"loss: 0.5", |l| out.push(l.to_vec()));
        assert!(out.is_empty(), "partial line was emitted");
        s.push(b"123\n", |l| out.push(l.to_vec()));
        assert_eq!(out, vec![b"loss: 0.5123".to_vec()]);
    }

    #[test]
    fn finish_flushes_the_unterminated_last_line() {
        assert_eq!(split_all(&[b"a\nlast"], true), ["a", "last"]);
        assert_eq!(split_all(&[b"a\nlast"], false), ["a"]);
    }

    #[test]
    fn crlf_split_across_chunks_gives_one_line() {
        assert_eq!(
            split_all(&[b"a\r", b"\nb\r", b"\r", b"\n"], false),
            ["a", "b"]
        );
    }

    #[test]
    fn over_long_lines_are_skipped_and_counted() {
        let mut s = LineSplitter::with_max_line(8);
        let mut out = Vec::new();
        s.push(b"short\n0123456789", |l| out.push(l.to_vec()));
        s.push(b"abcdef\nok\n", |l| out.push(l.to_vec()));
        s.push(b"0123456789abc\nfine\n", |l| out.push(l.to_vec()));
        assert_eq!(
            out,
            vec![b"short".to_vec(), b"ok".to_vec(), b"fine".to_vec()]
        );
        assert_eq!(s.skipped_lines(), 2);
        assert_eq!(s.pending_bytes(), 0);
    }

    #[test]
    fn clean_line_strips_escapes_and_backspaces() {
        let raw = b"\x1b[1m1875/1875\x1b[0m \x1b[32m\xe2\x94\x81\x1b[0m - loss: 0.4\x08\x08";
        assert_eq!(clean_line(raw), "1875/1875 ━ - loss: 0.4");
        assert!(matches!(clean_line(b"plain"), Cow::Borrowed("plain")));
        assert_eq!(clean_line(b"bad \xff utf8"), "bad \u{fffd} utf8");
    }
}
