//! GPUs of the node: inventory (model, memory) for registration with the coordinator and usage
//! for reports, read through NVML (nvml-wrapper loads `libnvidia-ml` at run time, so the daemon
//! builds and runs on machines without a GPU).
//!
//! This file only reads (inventory and usage for the coordinator). Every device setting goes
//! through [`device`] and is made by [`governance`], opt-in.
//!
//! Machines without NVIDIA GPUs (these development machines, the VM bed) can declare simulated
//! GPUs in the configuration (`[[node.simulated_gpus]]`) so that GPU-aware placement is testable.

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

pub mod device;
pub mod governance;

/// One GPU, as registered with the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    /// Model name, e.g. `NVIDIA H200`.
    pub model: String,
    pub memory_bytes: u64,
}

/// A GPU's current use, for node reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUsage {
    pub index: u32,
    /// Percent of the last sample period a kernel was running.
    pub utilization_percent: u32,
    pub memory_used_bytes: u64,
    /// Power draw in milliwatts, where the device reports it.
    pub power_milliwatts: Option<u32>,
}

/// A GPU declared in the configuration for nodes without real ones (tests, the VM bed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatedGpu {
    pub model: String,
    pub memory: crate::config::ByteSize,
}

/// Where GPU information comes from.
pub enum Gpus {
    Nvml(nvml_wrapper::Nvml),
    Simulated(Vec<GpuInfo>),
    None,
}

/// Load NVML: `library` (the stand-in, another path), else the driver's `libnvidia-ml`.
pub fn open_nvml(
    library: Option<&std::path::Path>,
) -> Result<nvml_wrapper::Nvml, nvml_wrapper::error::NvmlError> {
    match library {
        Some(path) => nvml_wrapper::Nvml::builder()
            .lib_path(path.as_os_str())
            .init(),
        None => nvml_wrapper::Nvml::init(),
    }
}

impl Gpus {
    /// Simulated GPUs if configured, else NVML if the driver's library (or `library`) loads,
    /// else none (said once in the log).
    pub fn open(simulated: &[SimulatedGpu], library: Option<&std::path::Path>) -> Gpus {
        if !simulated.is_empty() {
            info!(
                count = simulated.len(),
                "using simulated GPUs from the configuration"
            );
            return Gpus::Simulated(simulated_inventory(simulated));
        }
        match open_nvml(library) {
            Ok(nvml) => Gpus::Nvml(nvml),
            Err(e) => {
                info!(reason = %e, "no NVIDIA management library: the node reports no GPUs");
                Gpus::None
            }
        }
    }

    /// Every GPU of the node.
    pub fn inventory(&self) -> Vec<GpuInfo> {
        match self {
            Gpus::Simulated(list) => list.clone(),
            Gpus::None => Vec::new(),
            Gpus::Nvml(nvml) => {
                let count = match nvml.device_count() {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(error = %e, "NVML cannot count the GPUs");
                        return Vec::new();
                    }
                };
                (0..count)
                    .filter_map(|index| {
                        let d = nvml.device_by_index(index).ok()?;
                        Some(GpuInfo {
                            index,
                            uuid: d.uuid().unwrap_or_default(),
                            model: d.name().unwrap_or_else(|_| "unknown".into()),
                            memory_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
                        })
                    })
                    .collect()
            }
        }
    }

    /// Current use of every GPU (simulated GPUs report idle).
    pub fn usage(&self) -> Vec<GpuUsage> {
        match self {
            Gpus::Simulated(list) => list
                .iter()
                .map(|g| GpuUsage {
                    index: g.index,
                    ..Default::default()
                })
                .collect(),
            Gpus::None => Vec::new(),
            Gpus::Nvml(nvml) => {
                let count = nvml.device_count().unwrap_or(0);
                (0..count)
                    .filter_map(|index| {
                        let d = nvml.device_by_index(index).ok()?;
                        Some(GpuUsage {
                            index,
                            utilization_percent: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
                            memory_used_bytes: d.memory_info().map(|m| m.used).unwrap_or(0),
                            power_milliwatts: d.power_usage().ok(),
                        })
                    })
                    .collect()
            }
        }
    }
}

fn simulated_inventory(simulated: &[SimulatedGpu]) -> Vec<GpuInfo> {
    simulated
        .iter()
        .enumerate()
        .map(|(i, g)| GpuInfo {
            index: i as u32,
            uuid: format!("GPU-simulated-{i}"),
            model: g.model.clone(),
            memory_bytes: g.memory.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ByteSize;

    #[test]
    fn simulated_gpus_are_listed_with_stable_indices_and_report_idle() {
        let g = Gpus::open(
            &[
                SimulatedGpu {
                    model: "NVIDIA H200".into(),
                    memory: ByteSize(141 << 30),
                },
                SimulatedGpu {
                    model: "NVIDIA H200".into(),
                    memory: ByteSize(141 << 30),
                },
            ],
            None,
        );
        let inv = g.inventory();
        assert_eq!(inv.len(), 2);
        assert_eq!(inv[1].index, 1);
        assert_eq!(inv[1].uuid, "GPU-simulated-1");
        assert_eq!(inv[0].memory_bytes, 141 << 30);
        assert_eq!(
            g.usage()[1],
            GpuUsage {
                index: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn without_a_driver_the_node_has_no_gpus() {
        // These machines have no libnvidia-ml: init fails and the node reports none.
        let g = Gpus::open(&[], None);
        if let Gpus::Nvml(_) = g {
            return; // a machine with a driver: nothing to check here
        }
        assert!(g.inventory().is_empty() && g.usage().is_empty());
    }
}
