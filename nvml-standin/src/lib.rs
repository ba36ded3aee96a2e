//! A stand-in for the NVIDIA management library (`libnvidia-ml.so.1`): the NVML functions the
//! governor calls, implemented over a JSON state file ([`state`]) named by `NVML_STANDIN_STATE`.
//!
//! nvml-wrapper loads it by its ordinary path (`Nvml::builder().lib_path(...)`, the daemon's
//! `[gpu] nvml_library`): `dlopen`, symbol resolution, the C structures and the mapping of
//! NVML's return codes to errors all run as they do against a driver, in `cargo xtask test` and
//! in the VM, on machines without a GPU. The devices keep their settings in the file, so a
//! daemon that is killed and started again finds them as it left them (as on a real GPU, where
//! a power limit outlives the process that set it), and a test can change a setting behind the
//! daemon's back the way `nvidia-smi` would, script an error for one function
//! (`fail: {"nvmlDeviceSetPowerManagementLimit": "NO_PERMISSION"}`), or add and remove compute
//! processes. Functions the governor does not call are absent: nvml-wrapper reports them as
//! failed to load, which the governor treats like a device that does not support them.

// NVML's C names, as the bindings spell them.
#![allow(non_upper_case_globals, non_snake_case)]

pub mod state;

use std::ffi::{c_char, c_uint, c_ulonglong};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use nvml_wrapper_sys::bindings::*;

use state::{Device, STATE_ENV, State, with_state};

/// NVML's error codes by the names a state file uses.
pub fn error_code(name: &str) -> nvmlReturn_t {
    match name {
        "UNINITIALIZED" => nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        "INVALID_ARGUMENT" => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        "NOT_SUPPORTED" => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        "NO_PERMISSION" => nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
        "NOT_FOUND" => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
        "INSUFFICIENT_SIZE" => nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
        "DRIVER_NOT_LOADED" => nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
        "TIMEOUT" => nvmlReturn_enum_NVML_ERROR_TIMEOUT,
        "GPU_IS_LOST" => nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        "IN_USE" => nvmlReturn_enum_NVML_ERROR_IN_USE,
        _ => nvmlReturn_enum_NVML_ERROR_UNKNOWN,
    }
}

fn state_path() -> Option<PathBuf> {
    std::env::var_os(STATE_ENV).map(PathBuf::from)
}

/// Run `f` on the whole state under its lock; any failure to read it is `UNINITIALIZED`, a
/// panic is `UNKNOWN` (nothing unwinds into the caller's C frames).
fn with_all(f: impl FnOnce(&mut State) -> nvmlReturn_t) -> nvmlReturn_t {
    let Some(path) = state_path() else {
        return nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
    };
    catch_unwind(AssertUnwindSafe(|| {
        with_state(&path, f).unwrap_or(nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)
    }))
    .unwrap_or(nvmlReturn_enum_NVML_ERROR_UNKNOWN)
}

/// Run `f` on one device, unless the state scripts `function` to fail there.
fn with_device(
    function: &str,
    device: nvmlDevice_t,
    f: impl FnOnce(&mut Device) -> nvmlReturn_t,
) -> nvmlReturn_t {
    let index = device.addr().wrapping_sub(1);
    with_all(|s| {
        let Some(d) = s.devices.get_mut(index) else {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        };
        if let Some(e) = d.fail.get(function) {
            return error_code(e);
        }
        f(d)
    })
}

/// Copy `text` into a caller's buffer of `length` bytes, NUL-terminated.
///
/// # Safety
/// `buf` is valid for `length` bytes of writes (NVML's contract).
unsafe fn copy_str(text: &str, buf: *mut c_char, length: c_uint) -> nvmlReturn_t {
    if buf.is_null() || (length as usize) < text.len() + 1 {
        return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: `buf` has room for the text and its NUL (checked above; the caller's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, text.len());
        *buf.add(text.len()) = 0;
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// Write `value` through an out-pointer, or `INVALID_ARGUMENT` for a null one.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> nvmlReturn_t {
    if out.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write(value) };
    nvmlReturn_enum_NVML_SUCCESS
}

fn init() -> nvmlReturn_t {
    with_all(|s| match &s.init_fails {
        Some(e) => error_code(e),
        None => nvmlReturn_enum_NVML_SUCCESS,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    nvmlReturn_enum_NVML_SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static std::ffi::CStr = match result {
        nvmlReturn_enum_NVML_SUCCESS => c"Success",
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// # Safety
/// NVML's contract: `version` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    let mut text = String::new();
    let r = with_all(|s| {
        text = s.driver_version.clone();
        nvmlReturn_enum_NVML_SUCCESS
    });
    if r != nvmlReturn_enum_NVML_SUCCESS {
        return r;
    }
    // SAFETY: forwarded contract.
    unsafe { copy_str(&text, version, length) }
}

/// # Safety
/// `count` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_all(|s| unsafe { put(count, s.devices.len() as c_uint) })
}

/// # Safety
/// `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_all(|s| {
        if index as usize >= s.devices.len() {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        // A handle is the index plus one: never null, never dereferenced by the caller.
        let handle = std::ptr::without_provenance_mut::<nvmlDevice_st>(index as usize + 1);
        // SAFETY: forwarded contract.
        unsafe { put(device, handle) }
    })
}

/// # Safety
/// `uuid` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_device("nvmlDeviceGetUUID", device, |d| unsafe {
        copy_str(&d.uuid, uuid, length)
    })
}

/// # Safety
/// `name` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_device("nvmlDeviceGetName", device, |d| unsafe {
        copy_str(&d.name, name, length)
    })
}

fn memory_used(d: &Device) -> u64 {
    d.processes.iter().map(|p| p.used_memory).sum()
}

/// # Safety
/// `memory` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMemoryInfo", device, |d| {
        let used = memory_used(d);
        let m = nvmlMemory_t {
            total: d.memory_total,
            free: d.memory_total.saturating_sub(used),
            used,
        };
        // SAFETY: forwarded contract.
        unsafe { put(memory, m) }
    })
}

/// # Safety
/// `memory` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMemoryInfo_v2", device, |d| {
        let used = memory_used(d);
        let m = nvmlMemory_v2_t {
            version: (std::mem::size_of::<nvmlMemory_v2_t>() | (2 << 24)) as c_uint,
            total: d.memory_total,
            reserved: 0,
            free: d.memory_total.saturating_sub(used),
            used,
        };
        // SAFETY: forwarded contract.
        unsafe { put(memory, m) }
    })
}

/// # Safety
/// `utilization` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetUtilizationRates", device, |d| {
        let u = d.utilization();
        // SAFETY: forwarded contract.
        unsafe {
            put(
                utilization,
                nvmlUtilization_t {
                    gpu: u,
                    memory: u / 2,
                },
            )
        }
    })
}

/// # Safety
/// `power` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_device("nvmlDeviceGetPowerUsage", device, |d| unsafe {
        put(power, d.power_mw())
    })
}

/// # Safety
/// `energy` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_device("nvmlDeviceGetTotalEnergyConsumption", device, |d| unsafe {
        put(energy, d.energy_mj)
    })
}

/// # Safety
/// `limit` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_device("nvmlDeviceGetPowerManagementLimit", device, |d| unsafe {
        put(limit, d.power_limit_mw)
    })
}

/// # Safety
/// `limit` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_device("nvmlDeviceGetEnforcedPowerLimit", device, |d| unsafe {
        put(limit, d.power_limit_mw)
    })
}

/// # Safety
/// `limit` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_device(
        "nvmlDeviceGetPowerManagementDefaultLimit",
        device,
        |d| unsafe { put(limit, d.default_limit_mw) },
    )
}

/// # Safety
/// `min` and `max` are null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: nvmlDevice_t,
    min: *mut c_uint,
    max: *mut c_uint,
) -> nvmlReturn_t {
    with_device(
        "nvmlDeviceGetPowerManagementLimitConstraints",
        device,
        |d| {
            // SAFETY: forwarded contract.
            let r = unsafe { put(min, d.min_limit_mw) };
            if r != nvmlReturn_enum_NVML_SUCCESS {
                return r;
            }
            // SAFETY: forwarded contract.
            unsafe { put(max, d.max_limit_mw) }
        },
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceSetPowerManagementLimit", device, |d| {
        if limit < d.min_limit_mw || limit > d.max_limit_mw {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        d.power_limit_mw = limit;
        nvmlReturn_enum_NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetGpuLockedClocks(
    device: nvmlDevice_t,
    min_mhz: c_uint,
    max_mhz: c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceSetGpuLockedClocks", device, |d| {
        if min_mhz > max_mhz || min_mhz < d.min_clock_mhz || max_mhz > d.max_clock_mhz {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        d.locked_clocks_mhz = Some((min_mhz, max_mhz));
        nvmlReturn_enum_NVML_SUCCESS
    })
}

/// # Safety
/// `clock` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    _clock_type: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded contract.
    with_device("nvmlDeviceGetMaxClockInfo", device, |d| unsafe {
        put(clock, d.max_clock_mhz)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceResetGpuLockedClocks(device: nvmlDevice_t) -> nvmlReturn_t {
    with_device("nvmlDeviceResetGpuLockedClocks", device, |d| {
        d.locked_clocks_mhz = None;
        nvmlReturn_enum_NVML_SUCCESS
    })
}

/// # Safety
/// `current` and `pending` are null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMigMode", device, |d| {
        let mode = c_uint::from(d.mig);
        // SAFETY: forwarded contract.
        let r = unsafe { put(current, mode) };
        if r != nvmlReturn_enum_NVML_SUCCESS {
            return r;
        }
        // SAFETY: forwarded contract.
        unsafe { put(pending, mode) }
    })
}

/// NVML's two-call protocol: with too small a buffer, the count and `INSUFFICIENT_SIZE`.
///
/// # Safety
/// `count` is valid for reads and writes; `infos` is null or valid for `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    if count.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    with_device("nvmlDeviceGetComputeRunningProcesses_v3", device, |d| {
        let n = d.processes.len();
        // SAFETY: `count` is non-null and valid by contract.
        let room = unsafe { *count } as usize;
        // SAFETY: as above.
        unsafe { *count = n as c_uint };
        if n == 0 {
            return nvmlReturn_enum_NVML_SUCCESS;
        }
        if infos.is_null() || room < n {
            return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (i, p) in d.processes.iter().enumerate() {
            let info = nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.used_memory,
                gpuInstanceId: u32::MAX,
                computeInstanceId: u32::MAX,
            };
            // SAFETY: `i < n <= room` entries are valid by contract.
            unsafe { infos.add(i).write(info) };
        }
        nvmlReturn_enum_NVML_SUCCESS
    })
}
