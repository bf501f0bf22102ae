//! The exported NVML C functions: each converts its arguments, runs the node's logic, and writes
//! results back through [`abi`](crate::abi). Panics never cross into C: they become UNKNOWN.
//!
//! Only what migdra (and nvml-wrapper on its behalf) calls is here; anything else is absent, so
//! nvml-wrapper reports FUNCTION_NOT_FOUND for it. `nvmlDeviceSetMigMode` is exported only to
//! refuse: a trace of it means migdra tried to change MIG mode.

use crate::abi::{c_array, c_str, get, put, put_all, put_str, version_of};
use crate::node::{
    self, ARGUMENT_VERSION_MISMATCH, CUDA_VERSION, EVENT_XID, Fake, INVALID_ARGUMENT, NO_INSTANCE, NO_PERMISSION, Ret,
    UNKNOWN,
};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t,
    nvmlComputeInstanceProfileInfo_v2_t, nvmlComputeInstanceProfileInfo_v3_t, nvmlDevice_t, nvmlEventData_t,
    nvmlEventSet_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlGpuInstanceProfileInfo_v3_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t,
    nvmlReturn_t,
};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::without_provenance_mut;
use std::time::Duration;

/// Struct versions the fake checks: `NVML_STRUCT_VERSION(X, v)` as nvml.h defines it, written out
/// so a mistake on migdra's side cannot cancel one here.
const GI_PROFILE_INFO_V2: u32 = 0x0200_0098;
const GI_PROFILE_INFO_V3: u32 = 0x0300_0098;
const CI_PROFILE_INFO_V2: u32 = 0x0200_0088;
const CI_PROFILE_INFO_V3: u32 = 0x0300_008C;
const MEMORY_V2: u32 = 0x0200_0028;

/// Run one call: trace it, find the node, turn the result (or a panic) into a return code.
fn call(name: &str, f: impl FnOnce(&Fake) -> Ret<()>) -> nvmlReturn_t {
    node::trace(name);
    match catch_unwind(AssertUnwindSafe(|| node::node().and_then(|fake| f(&fake)))) {
        Ok(Ok(())) => 0,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

fn h<T>(p: *mut T) -> usize {
    p.addr()
}

fn ptr<T>(v: usize) -> *mut T {
    without_provenance_mut(v)
}

// === init ===

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    let ret = match catch_unwind(node::init) {
        Ok(Ok(())) => 0,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    };
    node::trace("nvmlInit_v2");
    ret
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    // SAFETY: takes no pointers.
    unsafe { nvmlInit_v2() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    node::trace("nvmlShutdown");
    match catch_unwind(node::shutdown) {
        Ok(Ok(())) => 0,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static std::ffi::CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        15 => c"GPU is lost",
        19 => c"In use by another client",
        23 => c"Insufficient Resources",
        25 => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

// === system ===

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    // SAFETY: `version` has `length` bytes (nvml.h).
    call("nvmlSystemGetDriverVersion", |f| unsafe { put_str(version, length, f.driver_version()) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: `v` points to an int (nvml.h).
    call("nvmlSystemGetCudaDriverVersion_v2", |_| unsafe { put(v, CUDA_VERSION) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: `v` points to an int (nvml.h).
    call("nvmlSystemGetCudaDriverVersion", |_| unsafe { put(v, CUDA_VERSION) })
}

// === devices ===

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: `count` points to an unsigned int.
    call("nvmlDeviceGetCount_v2", |f| unsafe { put(count, f.device_count()?) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    // SAFETY: `device` points to a handle slot.
    call("nvmlDeviceGetHandleByIndex_v2", |f| unsafe { put(device, ptr(f.handle_by_index(index)?)) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    // SAFETY: `uuid` is a C string and `device` a handle slot.
    call("nvmlDeviceGetHandleByUUID", |f| unsafe { put(device, ptr(f.handle_by_uuid(&c_str(uuid)?)?)) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> nvmlReturn_t {
    // SAFETY: `uuid` has `length` bytes.
    call("nvmlDeviceGetUUID", |f| unsafe { put_str(uuid, length, &f.uuid(h(device))?) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: `minor` points to an unsigned int.
    call("nvmlDeviceGetMinorNumber", |f| unsafe { put(minor, f.minor(h(device))?) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: `index` points to an unsigned int.
    call("nvmlDeviceGetIndex", |f| unsafe { put(index, f.index(h(device))?) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    call("nvmlDeviceGetPciInfo_v3", |f| {
        let (bus_id, device_id) = f.pci(h(device))?;
        // `00000000:18:00.0` → domain, bus, device.
        let field = |from: usize, to: usize| bus_id.get(from..to).and_then(|s| u32::from_str_radix(s, 16).ok());
        let info = nvmlPciInfo_t {
            busIdLegacy: c_array(bus_id.get(4..).unwrap_or("")),
            domain: field(0, 8).unwrap_or(0),
            bus: field(9, 11).unwrap_or(0),
            device: field(12, 14).unwrap_or(0),
            pciDeviceId: device_id,
            pciSubSystemId: 0x16C1_10DE,
            busId: c_array(&bus_id),
        };
        // SAFETY: `pci` points to an nvmlPciInfo_t.
        unsafe { put(pci, info) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> nvmlReturn_t {
    // SAFETY: `name` has `length` bytes.
    call("nvmlDeviceGetName", |f| unsafe { put_str(name, length, &f.name(h(device))?) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    call("nvmlDeviceGetMemoryInfo_v2", |f| {
        // SAFETY: `memory` points to an nvmlMemory_v2_t, whose first field is its version.
        if unsafe { version_of(memory) }? != MEMORY_V2 {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let total = f.memory_bytes(h(device))?;
        // SAFETY: as above.
        unsafe { put(memory, nvmlMemory_v2_t { version: MEMORY_V2, total, reserved: 0, free: total, used: 0 }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t {
    call("nvmlDeviceGetMemoryInfo", |f| {
        let total = f.memory_bytes(h(device))?;
        // SAFETY: `memory` points to an nvmlMemory_t.
        unsafe { put(memory, nvmlMemory_t { total, free: total, used: 0 }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    call("nvmlDeviceGetMigMode", |f| {
        let mode = f.mig_mode(h(device))?;
        // SAFETY: both point to unsigned ints.
        unsafe {
            put(current, mode)?;
            put(pending, mode)
        }
    })
}

/// Refused: the fake's driver never lets anyone change MIG mode, and the trace shows the try.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    _device: nvmlDevice_t,
    _mode: c_uint,
    _activation: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    call("nvmlDeviceSetMigMode", |_| Err(NO_PERMISSION))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    call("nvmlDeviceGetCudaComputeCapability", |f| {
        let (a, b) = f.compute_capability(h(device))?;
        // SAFETY: both point to ints.
        unsafe {
            put(major, a as c_int)?;
            put(minor, b as c_int)
        }
    })
}

// === GPU instances ===

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    call("nvmlDeviceGetGpuInstanceProfileInfoV", |f| {
        // SAFETY: `info` points to a versioned profile info struct (nvml.h).
        let version = unsafe { version_of(info) }?;
        let v3 = version == GI_PROFILE_INFO_V3 && f.config.profile_info_version >= 3;
        if !v3 && version != GI_PROFILE_INFO_V2 {
            return Err(INVALID_ARGUMENT);
        }
        let (x, _) = f.gi_profile_info(h(device), profile)?;
        let p = x.profile;
        if v3 {
            let out = nvmlGpuInstanceProfileInfo_v3_t {
                version,
                id: p.id,
                sliceCount: p.compute_slices,
                instanceCount: p.max_instances,
                multiprocessorCount: p.multiprocessors,
                copyEngineCount: p.engines.copy,
                decoderCount: p.engines.decoders,
                encoderCount: p.engines.encoders,
                jpegCount: p.engines.jpeg,
                ofaCount: p.engines.ofa,
                memorySizeMB: p.memory_mib,
                name: c_array(&x.name),
                capabilities: if p.gfx { 2 } else { 0 },
            };
            // SAFETY: the caller said version 3, so `info` has room for a v3 struct.
            unsafe { put(info.cast::<nvmlGpuInstanceProfileInfo_v3_t>(), out) }
        } else {
            let out = nvmlGpuInstanceProfileInfo_v2_t {
                version,
                id: p.id,
                isP2pSupported: 0,
                sliceCount: p.compute_slices,
                instanceCount: p.max_instances,
                multiprocessorCount: p.multiprocessors,
                copyEngineCount: p.engines.copy,
                decoderCount: p.engines.decoders,
                encoderCount: p.engines.encoders,
                jpegCount: p.engines.jpeg,
                ofaCount: p.engines.ofa,
                memorySizeMB: p.memory_mib,
                name: c_array(&x.name),
            };
            // SAFETY: version 2: `info` is the v2 struct.
            unsafe { put(info, out) }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call("nvmlDeviceGetGpuInstancePossiblePlacements_v2", |f| {
        let all: Vec<nvmlGpuInstancePlacement_t> = f
            .placements(h(device), profile_id)?
            .into_iter()
            .map(|(start, size)| nvmlGpuInstancePlacement_t { start, size })
            .collect();
        // SAFETY: `placements` is NULL or holds the profile's placement count (nvml.h).
        unsafe {
            put_all(placements, &all);
            put(count, all.len() as c_uint)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    call("nvmlDeviceCreateGpuInstanceWithPlacement", |f| {
        // SAFETY: `placement` points to a placement.
        let p = unsafe { get(placement) }?;
        let gi = f.create_gi(h(device), profile_id, p.start, p.size)?;
        // SAFETY: `gpu_instance` points to a handle slot.
        unsafe { put(gpu_instance, ptr(gi)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call("nvmlDeviceGetGpuInstances", |f| {
        let all: Vec<nvmlGpuInstance_t> = f.gpu_instances(h(device), profile_id)?.into_iter().map(ptr).collect();
        if gpu_instances.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: the array holds the profile's instance count, which bounds `all` (nvml.h).
        unsafe {
            put_all(gpu_instances, &all);
            put(count, all.len() as c_uint)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    // SAFETY: `gpu_instance` points to a handle slot.
    call("nvmlDeviceGetGpuInstanceById", |f| unsafe { put(gpu_instance, ptr(f.gi_by_id(h(device), id)?)) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gi: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    call("nvmlGpuInstanceGetInfo", |f| {
        let x = f.gi_info(h(gi))?;
        let out = nvmlGpuInstanceInfo_t {
            device: ptr(crate::handles::Handle::Gpu(x.gpu).encode()),
            id: x.id,
            profileId: x.profile_id,
            placement: nvmlGpuInstancePlacement_t { start: x.start, size: x.size },
        };
        // SAFETY: `info` points to an nvmlGpuInstanceInfo_t.
        unsafe { put(info, out) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gi: nvmlGpuInstance_t) -> nvmlReturn_t {
    call("nvmlGpuInstanceDestroy", |f| f.destroy_gi(h(gi)))
}

// === compute instances ===

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    engine_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    call("nvmlGpuInstanceGetComputeInstanceProfileInfoV", |f| {
        // SAFETY: `info` points to a versioned profile info struct.
        let version = unsafe { version_of(info) }?;
        let v3 = version == CI_PROFILE_INFO_V3 && f.config.profile_info_version >= 3;
        if !v3 && version != CI_PROFILE_INFO_V2 {
            return Err(INVALID_ARGUMENT);
        }
        let x = f.ci_profile_info(h(gi), profile, engine_profile)?;
        let (g, c) = (x.gi, x.ci);
        if v3 {
            let out = nvmlComputeInstanceProfileInfo_v3_t {
                version,
                id: c.id,
                sliceCount: c.compute_slices,
                instanceCount: c.max_instances,
                multiprocessorCount: c.multiprocessors,
                sharedCopyEngineCount: g.engines.copy,
                sharedDecoderCount: g.engines.decoders,
                sharedEncoderCount: g.engines.encoders,
                sharedJpegCount: g.engines.jpeg,
                sharedOfaCount: g.engines.ofa,
                name: c_array(&x.name),
                capabilities: 0,
            };
            // SAFETY: version 3: `info` has room for the v3 struct.
            unsafe { put(info.cast::<nvmlComputeInstanceProfileInfo_v3_t>(), out) }
        } else {
            let out = nvmlComputeInstanceProfileInfo_v2_t {
                version,
                id: c.id,
                sliceCount: c.compute_slices,
                instanceCount: c.max_instances,
                multiprocessorCount: c.multiprocessors,
                sharedCopyEngineCount: g.engines.copy,
                sharedDecoderCount: g.engines.decoders,
                sharedEncoderCount: g.engines.encoders,
                sharedJpegCount: g.engines.jpeg,
                sharedOfaCount: g.engines.ofa,
                name: c_array(&x.name),
            };
            // SAFETY: version 2: `info` is the v2 struct.
            unsafe { put(info, out) }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    // SAFETY: `ci` points to a handle slot.
    call("nvmlGpuInstanceCreateComputeInstance", |f| unsafe { put(ci, ptr(f.create_ci(h(gi), profile_id)?)) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    cis: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call("nvmlGpuInstanceGetComputeInstances", |f| {
        let all: Vec<nvmlComputeInstance_t> = f.compute_instances(h(gi), profile_id)?.into_iter().map(ptr).collect();
        if cis.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: the array holds the CI profile's instance count, which bounds `all`.
        unsafe {
            put_all(cis, &all);
            put(count, all.len() as c_uint)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gi: nvmlGpuInstance_t,
    id: c_uint,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    // SAFETY: `ci` points to a handle slot.
    call("nvmlGpuInstanceGetComputeInstanceById", |f| unsafe { put(ci, ptr(f.ci_by_id(h(gi), id)?)) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    ci: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    call("nvmlComputeInstanceGetInfo_v2", |f| {
        use crate::handles::Handle;
        let x = f.ci_info(h(ci))?;
        let out = nvmlComputeInstanceInfo_t {
            // The MIG device handle: a MIG device is one CI (docs/facts/mig-nvml.md §2.1).
            device: ptr(Handle::Mig { gpu: x.gpu, gi: x.gi, ci: x.id }.encode()),
            gpuInstance: ptr(Handle::Gi { gpu: x.gpu, gi: x.gi }.encode()),
            id: x.id,
            profileId: x.profile_id,
            placement: nvmlComputeInstancePlacement_t { start: x.start, size: x.size },
        };
        // SAFETY: `info` points to an nvmlComputeInstanceInfo_t.
        unsafe { put(info, out) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(ci: nvmlComputeInstance_t) -> nvmlReturn_t {
    call("nvmlComputeInstanceDestroy", |f| f.destroy_ci(h(ci)))
}

// === MIG device handles ===

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: `count` points to an unsigned int.
    call("nvmlDeviceGetMaxMigDeviceCount", |f| unsafe { put(count, f.max_mig_devices(h(device))?) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: `mig` points to a handle slot.
    call("nvmlDeviceGetMigDeviceHandleByIndex", |f| unsafe { put(mig, ptr(f.mig_device_by_index(h(device), index)?)) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: `is_mig` points to an unsigned int.
    call("nvmlDeviceIsMigDeviceHandle", |f| unsafe { put(is_mig, c_uint::from(f.is_mig_device(h(device))?)) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: `device` points to a handle slot.
    call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", |f| unsafe { put(device, ptr(f.mig_parent(h(mig))?.0)) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: `id` points to an unsigned int.
    call("nvmlDeviceGetGpuInstanceId", |f| unsafe { put(id, f.mig_parent(h(device))?.1) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: `id` points to an unsigned int.
    call("nvmlDeviceGetComputeInstanceId", |f| unsafe { put(id, f.mig_parent(h(device))?.2) })
}

// === events ===

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    // SAFETY: `set` points to a handle slot.
    call("nvmlEventSetCreate", |f| unsafe { put(set, ptr(f.event_set_create()?)) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    call("nvmlDeviceRegisterEvents", |f| f.register_events(h(device), types, h(set)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    call("nvmlDeviceGetSupportedEventTypes", |f| {
        f.index(h(device))?;
        // SAFETY: `types` points to an unsigned long long.
        unsafe { put(types, EVENT_XID) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    call("nvmlEventSetWait_v2", |f| {
        let ev = f.event_wait(h(set), Duration::from_millis(timeout_ms.into()))?;
        let out = nvmlEventData_t {
            device: ptr(crate::handles::Handle::Gpu(ev.gpu).encode()),
            eventType: EVENT_XID,
            eventData: ev.xid,
            gpuInstanceId: ev.gi,
            computeInstanceId: NO_INSTANCE,
        };
        // SAFETY: `data` points to an nvmlEventData_t.
        unsafe { put(data, out) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    call("nvmlEventSetFree", |f| f.event_set_free(h(set)))
}
