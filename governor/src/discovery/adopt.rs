//! Who may have the daemon move their processes into a cgroup of the governor's
//! (`[discovery] adopt`).
//!
//! Adoption is done by root on a process's own say-so (`GOVERNOR_LOG` in its environment), so
//! it is a privilege the operator grants: by default to processes of root and of the group
//! `governor` (when that group exists). Governing a job *in place* (its cgroup holds only its own
//! processes: a container, a pod, a service) moves nothing and needs no grant.

use std::fmt;

use super::procfs::Credentials;

/// The default grant: root's processes and those of the `governor` group.
pub const DEFAULT_ADOPT: &str = "root,group:governor";

/// One grantee.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grantee {
    /// Processes whose real uid is 0.
    Root,
    /// Processes of this user (name or numeric id).
    User(String),
    /// Processes holding this group (name or numeric id), primary or supplementary.
    Group(String),
}

/// The parsed `adopt` setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdoptRule {
    /// Never move a process.
    None,
    /// Move any process (the behaviour before this setting existed; for single-user machines).
    Any,
    /// Move processes of these grantees only.
    Only(Vec<Grantee>),
}

/// A malformed `adopt` setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "adopt: {0:?} is not understood (use \"none\", \"any\", or a comma-separated list of \"root\", \"user:NAME\", \"group:NAME\")"
)]
pub struct AdoptParseError(pub String);

impl AdoptRule {
    /// Parse `none`, `any`, or a comma-separated list of `root`, `user:NAME`, `group:NAME`.
    pub fn parse(text: &str) -> Result<AdoptRule, AdoptParseError> {
        let text = text.trim();
        match text {
            "none" | "" => return Ok(AdoptRule::None),
            "any" => return Ok(AdoptRule::Any),
            _ => {}
        }
        let mut out = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let grantee = if item == "root" {
                Grantee::Root
            } else if let Some(name) = item.strip_prefix("user:").filter(|n| !n.is_empty()) {
                Grantee::User(name.to_owned())
            } else if let Some(name) = item.strip_prefix("group:").filter(|n| !n.is_empty()) {
                Grantee::Group(name.to_owned())
            } else {
                return Err(AdoptParseError(item.to_owned()));
            };
            out.push(grantee);
        }
        Ok(AdoptRule::Only(out))
    }

    /// Resolve names to ids with `lookup` (user or group name to id; numeric names are ids).
    /// Names that do not exist on this node grant nothing (the default names a `governor`
    /// group that many nodes do not have); they are returned for one warning.
    pub fn resolve(
        &self,
        user: impl Fn(&str) -> Option<u32>,
        group: impl Fn(&str) -> Option<u32>,
    ) -> (AdoptGrant, Vec<String>) {
        let mut grant = AdoptGrant::default();
        let mut unknown = Vec::new();
        match self {
            AdoptRule::None => {}
            AdoptRule::Any => grant.any = true,
            AdoptRule::Only(list) => {
                for g in list {
                    match g {
                        Grantee::Root => grant.uids.push(0),
                        Grantee::User(n) => match n.parse().ok().or_else(|| user(n)) {
                            Some(id) => grant.uids.push(id),
                            None => unknown.push(format!("user:{n}")),
                        },
                        Grantee::Group(n) => match n.parse().ok().or_else(|| group(n)) {
                            Some(id) => grant.gids.push(id),
                            None => unknown.push(format!("group:{n}")),
                        },
                    }
                }
            }
        }
        (grant, unknown)
    }
}

/// The `adopt` setting with ids resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdoptGrant {
    pub any: bool,
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
}

impl AdoptGrant {
    /// Whether a process with these credentials may be moved.
    pub fn allows(&self, who: &Credentials) -> bool {
        self.any || self.uids.contains(&who.uid) || self.gids.iter().any(|&g| who.in_group(g))
    }
}

impl fmt::Display for AdoptGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.any {
            return write!(f, "any process");
        }
        if self.uids.is_empty() && self.gids.is_empty() {
            return write!(f, "no process");
        }
        write!(f, "uids {:?}, gids {:?}", self.uids, self.gids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(uid: u32, gid: u32, groups: &[u32]) -> Credentials {
        Credentials {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn the_default_grants_root_and_the_governor_group_only() {
        let rule = AdoptRule::parse(DEFAULT_ADOPT).unwrap();
        let (grant, unknown) = rule.resolve(|_| None, |n| (n == "governor").then_some(990));
        assert!(unknown.is_empty());
        assert!(grant.allows(&creds(0, 0, &[])));
        assert!(grant.allows(&creds(1000, 1000, &[990])));
        assert!(!grant.allows(&creds(1000, 1000, &[27])));
        // Where the group does not exist, only root is granted, and the name is reported.
        let (grant, unknown) = rule.resolve(|_| None, |_| None);
        assert_eq!(unknown, vec!["group:governor"]);
        assert!(!grant.allows(&creds(1000, 1000, &[])));
    }

    #[test]
    fn none_any_users_and_numeric_ids() {
        let none = AdoptRule::parse("none")
            .unwrap()
            .resolve(|_| None, |_| None)
            .0;
        assert!(!none.allows(&creds(0, 0, &[])));
        let any = AdoptRule::parse("any")
            .unwrap()
            .resolve(|_| None, |_| None)
            .0;
        assert!(any.allows(&creds(4242, 4242, &[])));
        let some = AdoptRule::parse("user:alice, group:1234")
            .unwrap()
            .resolve(|n| (n == "alice").then_some(1001), |_| None)
            .0;
        assert!(some.allows(&creds(1001, 1001, &[])));
        assert!(some.allows(&creds(1002, 1234, &[])));
        assert!(!some.allows(&creds(0, 0, &[])));
    }

    #[test]
    fn malformed_settings_are_refused() {
        assert!(AdoptRule::parse("everyone").is_err());
        assert!(AdoptRule::parse("group:").is_err());
        assert!(AdoptRule::parse("root,user").is_err());
    }
}
