//! A small, lenient JSON reader for training logs.
//!
//! Python's `json.dump` writes `NaN`, `Infinity` and `-Infinity` (Detectron2's merged eval
//! records, a diverged Hugging Face run), which strict JSON parsers reject; serde_json also
//! allocates a tree per line. This reader walks one object and reports its scalar leaves
//! (nested objects flattened with `/`, arrays skipped) without building anything, borrowing
//! keys and strings from the input when they have no escapes. Nesting is bounded so hostile
//! input cannot exhaust the stack.

use std::borrow::Cow;

use super::num::number_len;

/// Deepest nesting followed before giving up on a document.
const MAX_DEPTH: usize = 64;

/// A scalar leaf of a JSON object.
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar<'a> {
    Num(f64),
    Str(Cow<'a, str>),
    Bool(bool),
    Null,
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Some(())
        } else {
            None
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Some(())
        } else {
            None
        }
    }

    /// A string starting at `"`.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        self.eat(b'"')?;
        let start = self.i;
        let rest = &self.b[start..];
        let end = memchr::memchr2(b'"', b'\\', rest)?;
        if rest[end] == b'"' {
            self.i = start + end + 1;
            let raw = &rest[..end];
            return Some(match std::str::from_utf8(raw) {
                Ok(s) => Cow::Borrowed(s),
                Err(_) => Cow::Owned(String::from_utf8_lossy(raw).into_owned()),
            });
        }
        // Slow path: escapes.
        let mut out: Vec<u8> = Vec::with_capacity(end + 16);
        let mut j = start;
        loop {
            let c = *self.b.get(j)?;
            match c {
                b'"' => {
                    self.i = j + 1;
                    return Some(Cow::Owned(String::from_utf8_lossy(&out).into_owned()));
                }
                b'\\' => {
                    let e = *self.b.get(j + 1)?;
                    j += 2;
                    match e {
                        b'"' => out.push(b'"'),
                        b'\\' => out.push(b'\\'),
                        b'/' => out.push(b'/'),
                        b'b' => out.push(0x08),
                        b'f' => out.push(0x0c),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => {
                            let hex = self.b.get(j..j + 4)?;
                            let hex = std::str::from_utf8(hex).ok()?;
                            let unit = u32::from_str_radix(hex, 16).ok()?;
                            j += 4;
                            let ch = char::from_u32(unit).unwrap_or('\u{fffd}');
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                        _ => return None,
                    }
                }
                _ => {
                    out.push(c);
                    j += 1;
                }
            }
        }
    }

    /// A number, or one of Python's non-finite words.
    fn number(&mut self) -> Option<f64> {
        match self.peek()? {
            b'N' => {
                self.literal(b"NaN")?;
                return Some(f64::NAN);
            }
            b'I' => {
                self.literal(b"Infinity")?;
                return Some(f64::INFINITY);
            }
            b'-' if self.b.get(self.i + 1) == Some(&b'I') => {
                self.i += 1;
                self.literal(b"Infinity")?;
                return Some(f64::NEG_INFINITY);
            }
            _ => {}
        }
        let len = number_len(self.b, self.i);
        if len == 0 {
            return None;
        }
        let text = &self.b[self.i..self.i + len];
        self.i += len;
        // The token is ASCII by construction.
        std::str::from_utf8(text).ok()?.parse::<f64>().ok()
    }

    /// Any value; scalar leaves of objects are reported under `path`, arrays are skipped.
    fn value(
        &mut self,
        path: &mut String,
        depth: usize,
        visit: &mut dyn FnMut(&str, Scalar<'a>),
    ) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(path, depth + 1, visit),
            b'[' => self.skip(depth + 1),
            b'"' => {
                let s = self.string()?;
                visit(path, Scalar::Str(s));
                Some(())
            }
            b't' => {
                self.literal(b"true")?;
                visit(path, Scalar::Bool(true));
                Some(())
            }
            b'f' => {
                self.literal(b"false")?;
                visit(path, Scalar::Bool(false));
                Some(())
            }
            b'n' => {
                self.literal(b"null")?;
                visit(path, Scalar::Null);
                Some(())
            }
            _ => {
                let v = self.number()?;
                visit(path, Scalar::Num(v));
                Some(())
            }
        }
    }

    fn object(
        &mut self,
        path: &mut String,
        depth: usize,
        visit: &mut dyn FnMut(&str, Scalar<'a>),
    ) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        self.ws();
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            self.ws();
            let key = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            let mark = path.len();
            if mark > 0 {
                path.push('/');
            }
            path.push_str(&key);
            let r = self.value(path, depth, visit);
            path.truncate(mark);
            r?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Skips any value.
    fn skip(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'[' => {
                self.i += 1;
                self.ws();
                if self.eat(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.ws();
                    self.skip(depth + 1)?;
                    self.ws();
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b'{' => {
                self.i += 1;
                self.ws();
                if self.eat(b'}').is_some() {
                    return Some(());
                }
                loop {
                    self.ws();
                    self.string()?;
                    self.ws();
                    self.eat(b':')?;
                    self.ws();
                    self.skip(depth + 1)?;
                    self.ws();
                    match self.peek()? {
                        b',' => self.i += 1,
                        b'}' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b'"' => self.string().map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(drop),
        }
    }
}

/// Walks the JSON object that is the whole of `b` (surrounding whitespace allowed) and calls
/// `visit(path, leaf)` for each scalar leaf. Returns `None`, possibly after some visits, when
/// `b` is not exactly one well-formed object: callers collect first and commit on success.
pub fn scan_object<'a>(
    b: &'a [u8],
    path: &mut String,
    visit: &mut dyn FnMut(&str, Scalar<'a>),
) -> Option<()> {
    path.clear();
    let mut c = Cursor { b, i: 0 };
    c.ws();
    if c.peek() != Some(b'{') {
        return None;
    }
    c.object(path, 0, visit)?;
    c.ws();
    if c.i == b.len() { Some(()) } else { None }
}

/// In the JSON object `b`, finds the top-level `key` holding an array and walks each object
/// element of it, calling `visit(element_index, path, leaf)`. Returns the number of elements,
/// or `None` when `b` is not well-formed or has no such array.
pub fn scan_array_of_objects<'a>(
    b: &'a [u8],
    key: &str,
    visit: &mut dyn FnMut(usize, &str, Scalar<'a>),
) -> Option<usize> {
    let mut c = Cursor { b, i: 0 };
    let mut path = String::new();
    let mut found = None;
    c.ws();
    c.eat(b'{')?;
    c.ws();
    if c.eat(b'}').is_some() {
        return None;
    }
    loop {
        c.ws();
        let k = c.string()?;
        c.ws();
        c.eat(b':')?;
        c.ws();
        if k == key && c.peek() == Some(b'[') && found.is_none() {
            c.i += 1;
            let mut n = 0usize;
            c.ws();
            if c.eat(b']').is_none() {
                loop {
                    c.ws();
                    if c.peek() == Some(b'{') {
                        let idx = n;
                        path.clear();
                        c.object(&mut path, 1, &mut |p, v| visit(idx, p, v))?;
                    } else {
                        c.skip(1)?;
                    }
                    n += 1;
                    c.ws();
                    match c.peek()? {
                        b',' => c.i += 1,
                        b']' => {
                            c.i += 1;
                            break;
                        }
                        _ => return None,
                    }
                }
            }
            found = Some(n);
        } else {
            c.skip(1)?;
        }
        c.ws();
        match c.peek()? {
            b',' => c.i += 1,
            b'}' => {
                c.i += 1;
                break;
            }
            _ => return None,
        }
    }
    c.ws();
    if c.i != b.len() {
        return None;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(s: &str) -> Option<Vec<(String, Scalar<'_>)>> {
        let mut out = Vec::new();
        let mut path = String::new();
        scan_object(s.as_bytes(), &mut path, &mut |p, v| {
            out.push((p.to_owned(), v))
        })?;
        Some(out)
    }

    #[test]
    fn flat_objects_with_python_non_finite_numbers() {
        let got = leaves(r#"{"a": 1.5, "b": NaN, "c": -Infinity, "d": "x", "e": null, "f": true}"#)
            .unwrap();
        assert_eq!(got[0], ("a".into(), Scalar::Num(1.5)));
        assert!(matches!(got[1].1, Scalar::Num(v) if v.is_nan()));
        assert_eq!(got[2].1, Scalar::Num(f64::NEG_INFINITY));
        assert_eq!(got[3].1, Scalar::Str("x".into()));
        assert_eq!(got[4].1, Scalar::Null);
        assert_eq!(got[5].1, Scalar::Bool(true));
    }

    #[test]
    fn nested_objects_flatten_and_arrays_are_skipped() {
        let got = leaves(r#"{"train": {"loss": 0.5, "x": [1, {"y": 2}]}, "n": 3}"#).unwrap();
        assert_eq!(
            got,
            vec![
                ("train/loss".into(), Scalar::Num(0.5)),
                ("n".into(), Scalar::Num(3.0))
            ]
        );
    }

    #[test]
    fn escapes_in_keys_are_decoded() {
        let got = leaves(r#"{"a\"b\u00e9": 1}"#).unwrap();
        assert_eq!(got[0].0, "a\"bé");
    }

    #[test]
    fn malformed_or_trailing_input_is_rejected() {
        for bad in [
            r#"{"a": 1"#,
            r#"{"a" 1}"#,
            r#"{"a": 1} x"#,
            r#"["a"]"#,
            r#"{"a": nul}"#,
            r#"{"a": 1,}"#,
            "",
            "{",
        ] {
            assert!(leaves(bad).is_none(), "accepted {bad:?}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_without_overflow() {
        let deep = format!("{}{}", "{\"a\":".repeat(10_000), "}".repeat(10_000));
        assert!(leaves(&deep).is_none());
        let arr = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(leaves(&arr).is_none());
    }

    #[test]
    fn array_of_objects_under_a_top_level_key() {
        let doc = br#"{"x": {"y": [1]}, "log_history": [{"loss": 1, "step": 2}, {"eval_loss": NaN}], "z": 1}"#;
        let mut got = Vec::new();
        let n = scan_array_of_objects(doc, "log_history", &mut |i, p, v| {
            got.push((i, p.to_owned(), v))
        });
        assert_eq!(n, Some(2));
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], (0, "loss".into(), Scalar::Num(1.0)));
        assert_eq!(got[2].0, 1);
        assert!(scan_array_of_objects(br#"{"a": []}"#, "log_history", &mut |_, _, _| {}).is_none());
    }
}
