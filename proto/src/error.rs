//! The error for a message that breaks the protocol's rules, and the field checks that make it.
// The field checks serve the wire conversions, which only the `grpc` feature builds.
#![cfg_attr(not(feature = "grpc"), allow(dead_code))]

use std::fmt::Display;

/// A message broke a rule of the protocol. `field` is the path to the offending field
/// (`jobs[2].cpu_cores`), `problem` what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {problem}")]
pub struct InvalidMessage {
    pub field: String,
    pub problem: String,
}

impl InvalidMessage {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        InvalidMessage {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// A required field (a sub-message or a oneof) is absent.
    pub fn missing(field: impl Into<String>) -> Self {
        Self::new(field, "is missing")
    }

    /// Prefix the field path with the field that contains it: `cpu_cores` within `jobs[2]`
    /// becomes `jobs[2].cpu_cores`.
    pub fn within(mut self, parent: impl Display) -> Self {
        self.field = format!("{parent}.{}", self.field);
        self
    }
}

#[cfg(feature = "grpc")]
impl From<InvalidMessage> for tonic::Status {
    fn from(e: InvalidMessage) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// `v` must be a finite number >= 0.
pub(crate) fn non_negative(field: &str, v: f64) -> Result<f64, InvalidMessage> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(InvalidMessage::new(
            field,
            format!("must be finite and >= 0, got {v}"),
        ))
    }
}

/// `v` must be a finite number > 0.
pub(crate) fn positive(field: &str, v: f64) -> Result<f64, InvalidMessage> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(InvalidMessage::new(
            field,
            format!("must be finite and > 0, got {v}"),
        ))
    }
}

/// `v` must be finite (any sign).
pub(crate) fn finite(field: &str, v: f64) -> Result<f64, InvalidMessage> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(InvalidMessage::new(
            field,
            format!("must be finite, got {v}"),
        ))
    }
}

pub(crate) fn opt<T>(
    v: Option<T>,
    check: impl FnOnce(T) -> Result<T, InvalidMessage>,
) -> Result<Option<T>, InvalidMessage> {
    v.map(check).transpose()
}

/// `s` must not be empty or only whitespace, and at most `max` bytes.
pub(crate) fn text(field: &str, s: String, max: usize) -> Result<String, InvalidMessage> {
    if s.trim().is_empty() {
        return Err(InvalidMessage::new(field, "must not be empty"));
    }
    if s.len() > max {
        return Err(InvalidMessage::new(
            field,
            format!("is {} bytes long, at most {max} allowed", s.len()),
        ));
    }
    Ok(s)
}

/// A user a job runs as: empty (root), or a name as Debian's `adduser` accepts one by default
/// and `useradd` at most: 1-32 bytes of ASCII letters, digits, `_`, `-` and `.`, not starting
/// with `-` (no `/`, `:` or whitespace to smuggle into a path or a passwd lookup).
pub fn check_user_name(field: &str, s: String) -> Result<String, InvalidMessage> {
    if s.is_empty() {
        return Ok(s);
    }
    let ok = s.len() <= 32
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(s)
    } else {
        Err(InvalidMessage::new(
            field,
            format!(
                "{s:?} is not a user name (1-32 of a-z, A-Z, 0-9, '_', '-', '.'; not starting with '-')"
            ),
        ))
    }
}

/// At most `max` bytes (may be empty).
pub(crate) fn short(field: &str, s: String, max: usize) -> Result<String, InvalidMessage> {
    if s.len() > max {
        return Err(InvalidMessage::new(
            field,
            format!("is {} bytes long, at most {max} allowed", s.len()),
        ));
    }
    Ok(s)
}

/// GPU indices must be distinct.
pub(crate) fn distinct_gpus(field: &str, gpus: &[u32]) -> Result<(), InvalidMessage> {
    let mut seen = gpus.to_vec();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(InvalidMessage::new(
            field,
            format!("lists GPU {} twice", w[0]),
        ));
    }
    Ok(())
}

/// A node name is a DNS label: 1..=63 of `a-z`, `0-9` and `-`, not starting or ending with `-`.
/// (It names the node's certificate, so it must be a valid DNS name.)
pub fn check_node_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err(format!(
            "node name {name:?} must be 1 to 63 characters long"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        || name.starts_with('-')
        || name.ends_with('-')
    {
        return Err(format!(
            "node name {name:?} may use only a-z, 0-9 and '-' (not first or last)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_builds_a_field_path() {
        let e = InvalidMessage::new("cpu_cores", "bad")
            .within("jobs[2]")
            .within("report");
        assert_eq!(e.to_string(), "invalid report.jobs[2].cpu_cores: bad");
    }

    #[test]
    #[cfg(feature = "grpc")]
    fn invalid_message_becomes_invalid_argument() {
        let status: tonic::Status = InvalidMessage::missing("hello.capacity").into();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "invalid hello.capacity: is missing");
    }

    #[test]
    fn node_names_are_dns_labels() {
        for ok in ["node1", "gpu-a-07", "a"] {
            assert!(check_node_name(ok).is_ok(), "{ok} should be accepted");
        }
        for bad in ["", "Node1", "node_1", "-a", "a-", &"x".repeat(64), "a.b"] {
            assert!(check_node_name(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn number_checks_reject_nan_and_negatives() {
        assert!(non_negative("x", f64::NAN).is_err());
        assert!(non_negative("x", -1.0).is_err());
        assert!(non_negative("x", 0.0).is_ok());
        assert!(positive("x", 0.0).is_err());
        assert!(finite("x", f64::INFINITY).is_err());
        assert!(finite("x", -3.0).is_ok());
    }
}
