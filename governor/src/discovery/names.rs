//! Friendly job names from cgroup paths, recognising how each runtime names its cgroups.
//!
//! Governor never talks to a runtime's API; the cgroup path alone tells who created a group:
//!
//! | runtime | cgroup path (systemd driver / cgroupfs driver) |
//! | --- | --- |
//! | Docker | `/system.slice/docker-<id>.scope` / `/docker/<id>` |
//! | containerd (CRI) | `.../kubepods-<qos>-pod<uid>.slice/cri-containerd-<id>.scope` / `/kubepods/<qos>/pod<uid>/<id>` |
//! | CRI-O | `.../crio-<id>.scope` (or `crio-conmon-<id>.scope` for its monitor) |
//! | Podman | `/machine.slice/libpod-<id>.scope`, `.../libpod-<id>.scope/container` / `/libpod_parent/libpod-<id>` |
//! | Kubernetes pod | any of the above under `kubepods`, with the pod uid in the parent |
//! | systemd unit | `/system.slice/<unit>.service`, `/user.slice/.../<unit>.service` |
//! | Governor | `/governor.slice/jobs/<name>` (jobs started by `governor run-job`) |

use std::fmt;

/// What created a cgroup, as far as its path tells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Runtime {
    Docker {
        id: String,
    },
    Containerd {
        id: String,
    },
    CriO {
        id: String,
    },
    Podman {
        id: String,
    },
    /// A Kubernetes pod whose container runtime could not be told apart.
    KubernetesPod {
        id: Option<String>,
    },
    SystemdUnit {
        unit: String,
    },
    /// Started by `governor run-job`.
    Governor {
        name: String,
    },
    /// Anything else: the last path component.
    Plain {
        name: String,
    },
}

/// A cgroup's runtime and, under Kubernetes, its pod uid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupIdentity {
    pub runtime: Runtime,
    pub pod_uid: Option<String>,
}

impl fmt::Display for CgroupIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short = |id: &str| id.chars().take(12).collect::<String>();
        if let Some(pod) = &self.pod_uid {
            write!(f, "pod-{}/", short(pod))?;
        }
        match &self.runtime {
            Runtime::Docker { id } => write!(f, "docker-{}", short(id)),
            Runtime::Containerd { id } => write!(f, "containerd-{}", short(id)),
            Runtime::CriO { id } => write!(f, "crio-{}", short(id)),
            Runtime::Podman { id } => write!(f, "podman-{}", short(id)),
            Runtime::KubernetesPod { id: Some(id) } => write!(f, "container-{}", short(id)),
            Runtime::KubernetesPod { id: None } => write!(f, "pod"),
            Runtime::SystemdUnit { unit } => f.write_str(unit),
            Runtime::Governor { name } | Runtime::Plain { name } => f.write_str(name),
        }
    }
}

fn is_container_id(s: &str) -> bool {
    s.len() >= 12 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Strip `prefix` and `suffix` and return what is between, if both match.
fn between<'a>(s: &'a str, prefix: &str, suffix: &str) -> Option<&'a str> {
    s.strip_prefix(prefix)?.strip_suffix(suffix)
}

/// The pod uid from a kubepods path component: `kubepods-besteffort-pod<uid>.slice` (systemd
/// driver, dashes in the uid replaced by underscores) or `pod<uid>` (cgroupfs driver).
fn pod_uid(component: &str) -> Option<String> {
    if let Some(rest) = component.strip_suffix(".slice") {
        let idx = rest.rfind("-pod")?;
        return Some(rest[idx + 4..].replace('_', "-"));
    }
    component
        .strip_prefix("pod")
        .filter(|u| u.len() >= 8)
        .map(str::to_owned)
}

/// Recognise a cgroup path (relative to the cgroup root, starting with `/`).
pub fn identify(cgroup: &str) -> CgroupIdentity {
    let parts: Vec<&str> = cgroup.split('/').filter(|p| !p.is_empty()).collect();
    let in_kubepods = parts.iter().any(|p| p.starts_with("kubepods"));
    let pod = if in_kubepods {
        parts.iter().rev().find_map(|p| pod_uid(p))
    } else {
        None
    };

    // Podman puts the payload in a `container` child of the libpod scope: name the scope.
    let mut components = parts.clone();
    if components.last() == Some(&"container") && components.len() >= 2 {
        components.pop();
    }
    let last = components.last().copied().unwrap_or("/");
    let parent = components.len().checked_sub(2).map(|i| components[i]);

    let runtime = if let Some(id) = between(last, "docker-", ".scope") {
        Runtime::Docker { id: id.to_owned() }
    } else if parent == Some("docker") && is_container_id(last) {
        Runtime::Docker {
            id: last.to_owned(),
        }
    } else if let Some(id) = between(last, "cri-containerd-", ".scope") {
        Runtime::Containerd { id: id.to_owned() }
    } else if let Some(id) =
        between(last, "crio-conmon-", ".scope").or_else(|| between(last, "crio-", ".scope"))
    {
        Runtime::CriO { id: id.to_owned() }
    } else if let Some(id) =
        between(last, "libpod-conmon-", ".scope").or_else(|| between(last, "libpod-", ".scope"))
    {
        Runtime::Podman { id: id.to_owned() }
    } else if let Some(id) = last
        .strip_prefix("libpod-")
        .filter(|_| parent == Some("libpod_parent"))
    {
        Runtime::Podman { id: id.to_owned() }
    } else if in_kubepods && is_container_id(last) {
        Runtime::KubernetesPod {
            id: Some(last.to_owned()),
        }
    } else if in_kubepods && pod.is_some() && pod_uid(last).is_some() {
        Runtime::KubernetesPod { id: None }
    } else if components.len() >= 2
        && components[components.len() - 2] == "jobs"
        && components[0] == "governor.slice"
    {
        Runtime::Governor {
            name: last.to_owned(),
        }
    } else if last.ends_with(".service") {
        Runtime::SystemdUnit {
            unit: last.to_owned(),
        }
    } else {
        Runtime::Plain {
            name: last.to_owned(),
        }
    };
    CgroupIdentity {
        runtime,
        pod_uid: pod,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f3a9c0e1d2b3a4f5e6d7c8b9a0f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7";

    fn name(p: &str) -> String {
        identify(p).to_string()
    }

    #[test]
    fn docker_both_drivers() {
        assert_eq!(
            identify(&format!("/system.slice/docker-{ID}.scope")).runtime,
            Runtime::Docker { id: ID.into() }
        );
        assert_eq!(name(&format!("/docker/{ID}")), "docker-4f3a9c0e1d2b");
    }

    #[test]
    fn kubernetes_containerd_systemd_driver() {
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_5e6f_7a8b_9c0d_112233445566.slice/cri-containerd-{ID}.scope"
        );
        let i = identify(&p);
        assert_eq!(i.runtime, Runtime::Containerd { id: ID.into() });
        assert_eq!(
            i.pod_uid.as_deref(),
            Some("1a2b3c4d-5e6f-7a8b-9c0d-112233445566")
        );
        assert_eq!(i.to_string(), "pod-1a2b3c4d-5e6/containerd-4f3a9c0e1d2b");
    }

    #[test]
    fn kubernetes_cgroupfs_driver_and_pod_level() {
        let p = format!("/kubepods/besteffort/pod1a2b3c4d-5e6f-7a8b-9c0d-112233445566/{ID}");
        let i = identify(&p);
        assert_eq!(
            i.runtime,
            Runtime::KubernetesPod {
                id: Some(ID.into())
            }
        );
        assert_eq!(
            i.pod_uid.as_deref(),
            Some("1a2b3c4d-5e6f-7a8b-9c0d-112233445566")
        );
        let pod_level = identify("/kubepods/besteffort/pod1a2b3c4d-5e6f-7a8b-9c0d-112233445566");
        assert_eq!(pod_level.runtime, Runtime::KubernetesPod { id: None });
    }

    #[test]
    fn crio_and_podman() {
        assert_eq!(
            identify(&format!(
                "/kubepods.slice/kubepods-pod11112222_3333.slice/crio-{ID}.scope"
            ))
            .runtime,
            Runtime::CriO { id: ID.into() }
        );
        assert_eq!(
            identify(&format!("/machine.slice/libpod-{ID}.scope")).runtime,
            Runtime::Podman { id: ID.into() }
        );
        assert_eq!(identify(&format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container")).runtime, Runtime::Podman { id: ID.into() });
        assert_eq!(
            identify(&format!("/libpod_parent/libpod-{ID}")).runtime,
            Runtime::Podman { id: ID.into() }
        );
    }

    #[test]
    fn systemd_units_governor_jobs_and_plain_groups() {
        assert_eq!(
            name("/system.slice/train-bert.service"),
            "train-bert.service"
        );
        assert_eq!(
            name("/user.slice/user-1000.slice/user@1000.service/app.slice/resnet.service"),
            "resnet.service"
        );
        assert_eq!(
            identify("/governor.slice/jobs/job1").runtime,
            Runtime::Governor {
                name: "job1".into()
            }
        );
        assert_eq!(name("/experiments/run-7"), "run-7");
        assert_eq!(name("/"), "/");
    }
}
