//! Byte sizes as operators write them, with the same rules everywhere: the daemon's
//! configuration and job files, `govctl submit --memory`, and every table that prints one.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// A byte count written as an integer or with a unit: `512MiB`, `2G`, `1.5GiB`, `65536`.
/// K, M, G and T are binary multiples (with or without `i`/`B`), as in cgroupfs, Docker and
/// systemd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

/// A size that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("{0:?} is not a size (examples: 65536, 512MiB, 2G)")]
    NotANumber(String),
    #[error("unknown size unit {unit:?} in {text:?} (use K, M, G or T)")]
    Unit { unit: String, text: String },
    #[error("{0:?} is out of range")]
    Range(String),
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

impl ByteSize {
    /// Parse `512MiB`, `2G`, `1.5GiB`, `65536`.
    pub fn parse(s: &str) -> Result<ByteSize, ByteSizeError> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num
            .parse()
            .map_err(|_| ByteSizeError::NotANumber(s.to_owned()))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => KIB,
            "m" | "mb" | "mib" => MIB,
            "g" | "gb" | "gib" => GIB,
            "t" | "tb" | "tib" => TIB,
            other => {
                return Err(ByteSizeError::Unit {
                    unit: other.to_owned(),
                    text: s.to_owned(),
                });
            }
        };
        let bytes = n * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(ByteSizeError::Range(s.to_owned()));
        }
        Ok(ByteSize(bytes as u64))
    }

    /// Rounded for a table, to one decimal in the largest unit that fits: `1.5GiB`, `300.0MiB`,
    /// `512B`.
    pub fn human(self) -> String {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u < UNITS.len() - 1 {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            format!("{}B", self.0)
        } else {
            format!("{v:.1}{}", UNITS[u])
        }
    }
}

/// Exact, in the largest unit that divides it: `512MiB`, `3GiB`, `1000` (parses back to itself).
impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, size) in [("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)] {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{name}", self.0 / size);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for ByteSize {
    type Err = ByteSizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ByteSize::parse(s)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(s) => ByteSize::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units_and_print_back() {
        for (text, bytes) in [
            ("65536", 65536),
            ("512MiB", 512 << 20),
            ("512M", 512 << 20),
            ("2G", 2 << 30),
            ("1.5GiB", 3 << 29),
            (" 4 kb ", 4096),
            ("1T", 1 << 40),
        ] {
            assert_eq!(ByteSize::parse(text), Ok(ByteSize(bytes)), "{text}");
            assert_eq!(
                ByteSize::parse(&ByteSize(bytes).to_string()),
                Ok(ByteSize(bytes))
            );
        }
        assert!(matches!(
            ByteSize::parse("2X"),
            Err(ByteSizeError::Unit { .. })
        ));
        assert!(matches!(
            ByteSize::parse("lots"),
            Err(ByteSizeError::NotANumber(_))
        ));
        assert_eq!(ByteSize(300 << 20).human(), "300.0MiB");
        assert_eq!(ByteSize(512).human(), "512B");
    }
}
