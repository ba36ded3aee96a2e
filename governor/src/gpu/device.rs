//! Every NVML call the daemon makes, behind one trait: the reads of a device's state and the one
//! setting it changes (the power limit). The real implementation is nvml-wrapper over the
//! driver's library (or the workspace's stand-in, `nvml-standin`, loaded the same way); tests
//! of the governance logic may use any other implementation.

use std::fmt;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

/// Why a device call failed, as far as the governor acts on it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// `NVML_ERROR_NO_PERMISSION`: the daemon may not change this setting.
    #[error("no permission")]
    NoPermission,
    /// `NVML_ERROR_NOT_SUPPORTED` (or a library without the function).
    #[error("not supported")]
    NotSupported,
    #[error("{0}")]
    Other(String),
}

impl From<NvmlError> for GpuError {
    fn from(e: NvmlError) -> Self {
        match e {
            NvmlError::NoPermission => GpuError::NoPermission,
            NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) => GpuError::NotSupported,
            other => GpuError::Other(other.to_string()),
        }
    }
}

/// One device's state at one read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub utilization_percent: u32,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub power_mw: Option<u32>,
    /// NVML's total-energy counter (millijoules since the driver loaded).
    pub energy_mj: Option<u64>,
    pub limit_mw: Option<u32>,
    pub default_limit_mw: Option<u32>,
    pub min_limit_mw: Option<u32>,
    pub max_limit_mw: Option<u32>,
    /// The graphics clock's maximum (MHz), for locking clocks.
    pub max_clock_mhz: Option<u32>,
    /// MIG mode on: its instances are read and left alone.
    pub mig: bool,
    /// Compute processes: (pid, GPU memory bytes).
    pub processes: Vec<(u32, u64)>,
}

/// The node's GPUs as the governor reads and sets them.
pub trait GpuDevices: Send {
    fn count(&self) -> Result<u32, GpuError>;
    fn snapshot(&self, index: u32) -> Result<Snapshot, GpuError>;
    fn set_power_limit(&self, index: u32, milliwatts: u32) -> Result<(), GpuError>;
    /// Lock the graphics clock at `mhz`, or (None) unlock it.
    fn lock_clocks(&self, index: u32, mhz: Option<u32>) -> Result<(), GpuError>;
}

/// NVML through nvml-wrapper.
pub struct NvmlDevices(pub Nvml);

impl fmt::Debug for NvmlDevices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NvmlDevices")
    }
}

impl GpuDevices for NvmlDevices {
    fn count(&self) -> Result<u32, GpuError> {
        Ok(self.0.device_count()?)
    }

    fn snapshot(&self, index: u32) -> Result<Snapshot, GpuError> {
        let d = self.0.device_by_index(index)?;
        let memory = d.memory_info().ok();
        let constraints = d.power_management_limit_constraints().ok();
        Ok(Snapshot {
            index,
            uuid: d.uuid()?,
            model: d.name().unwrap_or_else(|_| "unknown".into()),
            utilization_percent: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
            memory_used_bytes: memory.as_ref().map_or(0, |m| m.used),
            memory_total_bytes: memory.as_ref().map_or(0, |m| m.total),
            power_mw: d.power_usage().ok(),
            energy_mj: d.total_energy_consumption().ok(),
            limit_mw: d.power_management_limit().ok(),
            default_limit_mw: d.power_management_limit_default().ok(),
            min_limit_mw: constraints.as_ref().map(|c| c.min_limit),
            max_limit_mw: constraints.as_ref().map(|c| c.max_limit),
            max_clock_mhz: d
                .max_clock_info(nvml_wrapper::enum_wrappers::device::Clock::Graphics)
                .ok(),
            mig: d.mig_mode().is_ok_and(|m| m.current != 0),
            processes: d
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .map(|p| {
                    let bytes = match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => b,
                        UsedGpuMemory::Unavailable => 0,
                    };
                    (p.pid, bytes)
                })
                .collect(),
        })
    }

    fn set_power_limit(&self, index: u32, milliwatts: u32) -> Result<(), GpuError> {
        let mut d = self.0.device_by_index(index)?;
        Ok(d.set_power_management_limit(milliwatts)?)
    }

    fn lock_clocks(&self, index: u32, mhz: Option<u32>) -> Result<(), GpuError> {
        use nvml_wrapper::enums::device::GpuLockedClocksSetting;
        let mut d = self.0.device_by_index(index)?;
        match mhz {
            Some(m) => Ok(d.set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
                min_clock_mhz: m,
                max_clock_mhz: m,
            })?),
            None => Ok(d.reset_gpu_locked_clocks()?),
        }
    }
}
