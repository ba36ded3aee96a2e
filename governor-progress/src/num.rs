//! Reading numbers the way training logs write them.

/// Parses a whole field as a number: surrounding whitespace is ignored, so are one pair of
/// quotes and a trailing `%` (the value is kept as printed: `91.2%` is 91.2). Accepts `nan`,
/// `inf`, `Infinity`, `-Infinity` in any case (Python and JSON writers use all of them).
pub fn parse_number(field: &str) -> Option<f64> {
    let mut s = field.trim();
    if s.len() >= 2
        && ((s.starts_with('"') && s.ends_with('"')) || (s.starts_with('\'') && s.ends_with('\'')))
    {
        s = s[1..s.len() - 1].trim();
    }
    if let Some(rest) = s.strip_suffix('%') {
        s = rest.trim_end();
    }
    parse_plain(s)
}

/// Parses exactly a number (no quotes, no `%`, no whitespace).
pub fn parse_plain(s: &str) -> Option<f64> {
    let first = *s.as_bytes().first()?;
    // Rust accepts "inf"/"infinity"/"nan" in any case; reject other words early so that
    // f64::from_str does not see every identifier.
    if !(first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'.' | b'n' | b'N' | b'i' | b'I'))
    {
        return None;
    }
    s.parse::<f64>().ok()
}

/// Length of the number token starting at `b[i]` (`-1.5e-3`, `.5`, `12`), or 0 if none.
/// `nan`/`inf` words are not matched here; callers that accept them check separately.
pub fn number_len(b: &[u8], i: usize) -> usize {
    let mut j = i;
    if j < b.len() && (b[j] == b'-' || b[j] == b'+') {
        j += 1;
    }
    let digits_start = j;
    while j < b.len() && b[j].is_ascii_digit() {
        j += 1;
    }
    let mut mantissa_digits = j - digits_start;
    if j < b.len() && b[j] == b'.' {
        let k = j + 1;
        let mut m = k;
        while m < b.len() && b[m].is_ascii_digit() {
            m += 1;
        }
        mantissa_digits += m - k;
        if mantissa_digits > 0 {
            j = m;
        }
    }
    if mantissa_digits == 0 {
        return 0;
    }
    if j < b.len() && (b[j] == b'e' || b[j] == b'E') {
        let mut k = j + 1;
        if k < b.len() && (b[k] == b'-' || b[k] == b'+') {
            k += 1;
        }
        let exp_start = k;
        while k < b.len() && b[k].is_ascii_digit() {
            k += 1;
        }
        if k > exp_start {
            j = k;
        }
    }
    j - i
}

/// Matches `nan`, `inf`, `infinity` (any case, optional sign) at `b[i]`; returns the value and
/// the length when the word is not followed by another letter.
pub fn non_finite_word_at(b: &[u8], i: usize) -> Option<(f64, usize)> {
    let (neg, start) = match b.get(i) {
        Some(b'-') => (true, i + 1),
        Some(b'+') => (false, i + 1),
        _ => (false, i),
    };
    let rest = &b[start.min(b.len())..];
    let word_len = rest.iter().take_while(|c| c.is_ascii_alphabetic()).count();
    let word = &rest[..word_len];
    let value = if word.eq_ignore_ascii_case(b"nan") {
        f64::NAN
    } else if word.eq_ignore_ascii_case(b"inf") || word.eq_ignore_ascii_case(b"infinity") {
        if neg {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        }
    } else {
        return None;
    };
    Some((value, start - i + word_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_as_logs_write_them() {
        assert_eq!(parse_number("  0.5 "), Some(0.5));
        assert_eq!(parse_number("'19.85'"), Some(19.85));
        assert_eq!(parse_number("91.2%"), Some(91.2));
        assert_eq!(parse_number("-2.79e-08"), Some(-2.79e-08));
        assert_eq!(
            parse_number("1.18478524985856e+17"),
            Some(1.18478524985856e+17)
        );
        assert!(parse_number("NaN").unwrap().is_nan());
        assert_eq!(parse_number("-Infinity"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_number("0G"), None);
        assert_eq!(parse_number(""), None);
        assert_eq!(parse_number("1,282,545.0"), None);
        assert_eq!(parse_number("infant"), None);
    }

    #[test]
    fn number_tokens() {
        assert_eq!(number_len(b"-1.5e-3,", 0), 7);
        assert_eq!(number_len(b".5x", 0), 2);
        assert_eq!(number_len(b"12.", 0), 3);
        assert_eq!(number_len(b"e5", 0), 0);
        assert_eq!(number_len(b"-", 0), 0);
        assert_eq!(number_len(b"3e", 0), 1);
    }

    #[test]
    fn non_finite_words() {
        assert!(non_finite_word_at(b"nan,", 0).unwrap().0.is_nan());
        assert_eq!(non_finite_word_at(b"-inf", 0), Some((f64::NEG_INFINITY, 4)));
        assert_eq!(non_finite_word_at(b"nano", 0), None);
    }
}
