//! The one grammar of a policy as written on a command line or in a benchmark's list:
//! `NODE[/PLACEMENT][+FLAG[=VALUE]]...`, where `NODE` is a node policy spec for [`by_spec`]
//! (`NAME[:KEY=VALUE]...`, e.g. `shortest-left:floor=0.5`), `PLACEMENT` a placement policy's name
//! (govsim), and each flag a switch or option of whoever runs the policy: govsim's
//! `+no-move` or `+preempt`, the real-job benchmark's `+finish=5:0.001` or `+sweep=lr:3:5`.
//!
//! This module only splits the text; what a placement or a flag means is its reader's. Values
//! may hold `:` and `=`, not `+` or `/`.
//!
//! [`by_spec`]: crate::by_spec

use std::fmt;
use std::str::FromStr;

/// A policy spec split into its parts (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecText {
    /// The node policy spec (`NAME[:KEY=VALUE]...`), as written.
    pub node: String,
    /// The placement policy's name, when one is written.
    pub placement: Option<String>,
    /// The flags in the order written: (name, value after `=`).
    pub flags: Vec<(String, Option<String>)>,
}

/// Why a spec could not be split.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecTextError {
    #[error("empty policy spec")]
    Empty,
    #[error("{0:?}: a flag after `+` has no name")]
    EmptyFlag(String),
    #[error("{0:?}: the placement after `/` has no name")]
    EmptyPlacement(String),
}

impl FromStr for SpecText {
    type Err = SpecTextError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.trim().split('+');
        let head = parts.next().unwrap_or_default().trim();
        if head.is_empty() {
            return Err(SpecTextError::Empty);
        }
        let (node, placement) = match head.split_once('/') {
            Some((n, p)) => {
                if p.trim().is_empty() {
                    return Err(SpecTextError::EmptyPlacement(s.to_owned()));
                }
                (n.trim(), Some(p.trim().to_owned()))
            }
            None => (head, None),
        };
        if node.is_empty() {
            return Err(SpecTextError::Empty);
        }
        let flags = parts
            .map(|f| {
                let (name, value) = match f.split_once('=') {
                    Some((n, v)) => (n.trim(), Some(v.trim().to_owned())),
                    None => (f.trim(), None),
                };
                if name.is_empty() {
                    Err(SpecTextError::EmptyFlag(s.to_owned()))
                } else {
                    Ok((name.to_owned(), value))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(SpecText {
            node: node.to_owned(),
            placement,
            flags,
        })
    }
}

impl SpecText {
    /// The value of the last `+name=VALUE` flag, if one is written.
    pub fn option(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(n, v)| n == name && v.is_some())
            .and_then(|(_, v)| v.as_deref())
    }

    /// The node policy's name (the spec's `NAME`, without parameters).
    pub fn node_name(&self) -> &str {
        self.node.split(':').next().unwrap_or_default().trim()
    }
}

impl fmt::Display for SpecText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.node)?;
        if let Some(p) = &self.placement {
            write!(f, "/{p}")?;
        }
        for (name, value) in &self.flags {
            match value {
                Some(v) => write!(f, "+{name}={v}")?,
                None => write!(f, "+{name}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> SpecText {
        s.parse().unwrap()
    }

    #[test]
    fn node_placement_and_flags_are_split_whatever_they_hold() {
        let s = spec("shortest-left:probe_offer=1.5+finish=5:0.001+sweep=lr:3:5");
        assert_eq!(s.node, "shortest-left:probe_offer=1.5");
        assert_eq!(s.node_name(), "shortest-left");
        assert_eq!(s.placement, None);
        assert_eq!(s.option("finish"), Some("5:0.001"));
        assert_eq!(s.option("sweep"), Some("lr:3:5"));
        assert_eq!(
            s.option("probe_offer"),
            None,
            "a node parameter is not a flag"
        );

        let s = spec(" specon:alpha=0.1 / first-fit +no-move+preempt ");
        assert_eq!(s.node, "specon:alpha=0.1");
        assert_eq!(s.placement.as_deref(), Some("first-fit"));
        assert_eq!(
            s.flags,
            vec![("no-move".to_owned(), None), ("preempt".to_owned(), None)]
        );
        assert_eq!(s.to_string(), "specon:alpha=0.1/first-fit+no-move+preempt");
        assert_eq!(spec(&s.to_string()), s, "written back, it reads the same");
    }

    #[test]
    fn empty_parts_are_errors() {
        for bad in ["", " +x", "/spread", "fair/", "fair++x", "fair+=1"] {
            assert!(bad.parse::<SpecText>().is_err(), "{bad:?}");
        }
    }
}
