//! The one module with unsafe code: raw libnvidia-ml calls that nvml-wrapper does not wrap (or
//! wraps wrongly: its `possible_placements` always returns an empty list, docs/facts/mig-nvml.md §3), made through
//! the library nvml-wrapper already loaded.
//!
//! Every function here is safe to call: it checks that the symbol exists (a missing one is
//! FUNCTION_NOT_FOUND, never a panic), passes buffers of the size NVML documents, sets the version
//! of each versioned struct, and copies results out before returning. GPU and compute instance
//! handles are opaque pointers; they are only passed back to NVML within one backend call.
#![allow(unsafe_code)]

use crate::mig::discovered::NvmlProfile;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_v2_t,
    nvmlComputeInstanceProfileInfo_v3_t, nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t,
    nvmlGpuInstanceProfileInfo_v3_t,
};
use std::ffi::{CStr, c_char};
use std::ptr;

/// `nvmlReturn_t` values this module acts on (nvml.h).
const SUCCESS: u32 = 0;
const INVALID_ARGUMENT: u32 = 2;
const TIMEOUT: u32 = 10;
const FUNCTION_NOT_FOUND: u32 = 13;
const ARGUMENT_VERSION_MISMATCH: u32 = 25;

/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`: room for a MIG UUID (docs/facts/mig-nvml.md §2).
const UUID_BUFFER: usize = 96;

/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`, the only engine profile NVML has.
const ENGINE_PROFILE_SHARED: u32 = 0;

/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 8;

/// `gpuInstanceId`/`computeInstanceId` of an event that is not about one instance.
const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// `NVML_STRUCT_VERSION(X, v)`: the struct's size with the version in the top byte. bindgen does
/// not emit these constants (docs/facts/mig-nvml.md §2.1).
const fn struct_version(size: usize, v: u32) -> u32 {
    size as u32 | (v << 24)
}

pub const GI_PROFILE_INFO_V2: u32 = struct_version(size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 2);
pub const GI_PROFILE_INFO_V3: u32 = struct_version(size_of::<nvmlGpuInstanceProfileInfo_v3_t>(), 3);
pub const CI_PROFILE_INFO_V2: u32 = struct_version(size_of::<nvmlComputeInstanceProfileInfo_v2_t>(), 2);
pub const CI_PROFILE_INFO_V3: u32 = struct_version(size_of::<nvmlComputeInstanceProfileInfo_v3_t>(), 3);

// The layouts of docs/facts/mig-nvml.md §2.1, checked with gcc against nvml.h; a binding that disagrees would
// corrupt memory, so it must not compile.
const _: () = {
    assert!(GI_PROFILE_INFO_V2 == 0x0200_0098);
    assert!(GI_PROFILE_INFO_V3 == 0x0300_0098);
    assert!(CI_PROFILE_INFO_V2 == 0x0200_0088);
    assert!(CI_PROFILE_INFO_V3 == 0x0300_008C);
    assert!(size_of::<nvmlGpuInstancePlacement_t>() == 8);
    assert!(size_of::<nvmlGpuInstanceInfo_t>() == 24);
    assert!(std::mem::offset_of!(nvmlGpuInstanceInfo_t, placement) == 16);
    assert!(size_of::<nvmlComputeInstanceInfo_t>() == 32);
    assert!(std::mem::offset_of!(nvmlComputeInstanceInfo_t, placement) == 24);
    assert!(size_of::<nvmlEventData_t>() == 32);
};

/// A raw call that failed: the NVML function and its return code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawError {
    pub call: &'static str,
    /// The `nvmlReturn_t`; FUNCTION_NOT_FOUND (13) when the loaded library lacks the symbol.
    pub ret: u32,
}

pub type RawResult<T> = Result<T, RawError>;

fn check(call: &'static str, ret: u32) -> RawResult<()> {
    if ret == SUCCESS { Ok(()) } else { Err(RawError { call, ret }) }
}

/// The function pointer of a symbol of the loaded library, or FUNCTION_NOT_FOUND.
macro_rules! sym {
    ($nvml:expr, $name:ident) => {
        match &$nvml.lib().$name {
            Ok(f) => *f,
            Err(_) => return Err(RawError { call: stringify!($name), ret: FUNCTION_NOT_FOUND }),
        }
    };
}

/// The NVML symbols the MIG backend calls raw, for the start-up check.
pub fn missing_mig_symbols(nvml: &Nvml) -> Vec<&'static str> {
    let lib = nvml.lib();
    let present = [
        ("nvmlDeviceGetGpuInstanceProfileInfoV", lib.nvmlDeviceGetGpuInstanceProfileInfoV.is_ok()),
        ("nvmlDeviceGetGpuInstancePossiblePlacements_v2", lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.is_ok()),
        ("nvmlDeviceCreateGpuInstanceWithPlacement", lib.nvmlDeviceCreateGpuInstanceWithPlacement.is_ok()),
        ("nvmlDeviceGetGpuInstances", lib.nvmlDeviceGetGpuInstances.is_ok()),
        ("nvmlDeviceGetGpuInstanceById", lib.nvmlDeviceGetGpuInstanceById.is_ok()),
        ("nvmlGpuInstanceGetInfo", lib.nvmlGpuInstanceGetInfo.is_ok()),
        ("nvmlGpuInstanceDestroy", lib.nvmlGpuInstanceDestroy.is_ok()),
        ("nvmlGpuInstanceGetComputeInstanceProfileInfoV", lib.nvmlGpuInstanceGetComputeInstanceProfileInfoV.is_ok()),
        ("nvmlGpuInstanceCreateComputeInstance", lib.nvmlGpuInstanceCreateComputeInstance.is_ok()),
        ("nvmlGpuInstanceGetComputeInstances", lib.nvmlGpuInstanceGetComputeInstances.is_ok()),
        ("nvmlGpuInstanceGetComputeInstanceById", lib.nvmlGpuInstanceGetComputeInstanceById.is_ok()),
        ("nvmlComputeInstanceGetInfo_v2", lib.nvmlComputeInstanceGetInfo_v2.is_ok()),
        ("nvmlComputeInstanceDestroy", lib.nvmlComputeInstanceDestroy.is_ok()),
        ("nvmlDeviceGetUUID", lib.nvmlDeviceGetUUID.is_ok()),
    ];
    present.into_iter().filter(|(_, ok)| !ok).map(|(name, _)| name).collect()
}

fn handle(dev: &Device) -> nvmlDevice_t {
    // SAFETY: `handle` only returns the raw pointer; it stays valid while `dev` (and so the
    // `Nvml` it borrows) lives, and every use below is within that borrow.
    unsafe { dev.handle() }
}

/// A value that identifies a device handle, to match event data to a device.
pub fn device_key(dev: &Device) -> usize {
    handle(dev).addr()
}

/// A NUL-terminated C string from a fixed buffer; lossy, never past the buffer.
fn c_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The profile of NVML's v2 or v3 info struct (same field names), placements still to be asked.
macro_rules! nvml_profile {
    ($info:expr, $index:expr) => {
        NvmlProfile {
            index: $index,
            id: $info.id,
            slice_count: $info.sliceCount,
            instance_count: $info.instanceCount,
            multiprocessor_count: $info.multiprocessorCount,
            copy_engine_count: $info.copyEngineCount,
            decoder_count: $info.decoderCount,
            encoder_count: $info.encoderCount,
            jpeg_count: $info.jpegCount,
            ofa_count: $info.ofaCount,
            memory_size_mb: $info.memorySizeMB,
            name: c_string(&$info.name),
            placements: Vec::new(),
        }
    };
}

/// GetGpuInstanceProfileInfoV for a profile *index*: version 3 first, then version 2 for
/// drivers that reject it (INVALID_ARGUMENT or ARGUMENT_VERSION_MISMATCH for the version).
/// The profile's placements are left empty for [`gi_possible_placements`].
pub fn gi_profile_info(nvml: &Nvml, dev: &Device, index: u32) -> RawResult<NvmlProfile> {
    let call = "nvmlDeviceGetGpuInstanceProfileInfoV";
    let f = sym!(nvml, nvmlDeviceGetGpuInstanceProfileInfoV);
    let dev = handle(dev);
    // SAFETY: the struct is plain integers and a char array, for which all-zero is valid.
    let mut v3: nvmlGpuInstanceProfileInfo_v3_t = unsafe { std::mem::zeroed() };
    v3.version = GI_PROFILE_INFO_V3;
    // SAFETY: `dev` is a live handle; `v3` is a writable struct of the size its version says
    // (152 bytes, the same as v2, whose pointer type the binding declares).
    let ret = unsafe { f(dev, index, (&raw mut v3).cast()) };
    if ret == SUCCESS {
        return Ok(nvml_profile!(v3, index));
    }
    if ret != INVALID_ARGUMENT && ret != ARGUMENT_VERSION_MISMATCH {
        return Err(RawError { call, ret });
    }
    // SAFETY: as above, all-zero is a valid value of the struct.
    let mut v2: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    v2.version = GI_PROFILE_INFO_V2;
    // SAFETY: as above, with the struct type the binding declares.
    let ret2 = unsafe { f(dev, index, &raw mut v2) };
    if ret2 != SUCCESS {
        // The first answer says more (a bad index is INVALID_ARGUMENT in both).
        return Err(RawError { call, ret });
    }
    Ok(nvml_profile!(v2, index))
}

/// GetGpuInstancePossiblePlacements_v2: `(start, size)` in memory slices.
pub fn gi_possible_placements(nvml: &Nvml, dev: &Device, profile_id: u32) -> RawResult<Vec<(u32, u32)>> {
    let call = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
    let f = sym!(nvml, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
    let dev = handle(dev);
    let mut count = 0u32;
    // SAFETY: a NULL placement buffer asks for the count only (nvml.h); `count` is writable.
    check(call, unsafe { f(dev, profile_id, ptr::null_mut(), &raw mut count) })?;
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    let mut got = count;
    if count > 0 {
        // SAFETY: the buffer holds exactly the number of placements NVML just reported for this
        // profile, which is what it writes.
        check(call, unsafe { f(dev, profile_id, buf.as_mut_ptr(), &raw mut got) })?;
    }
    buf.truncate(got.min(count) as usize);
    Ok(buf.into_iter().map(|p| (p.start, p.size)).collect())
}

/// An opaque `nvmlGpuInstance_t`, valid until the GI is destroyed.
#[derive(Debug, Clone, Copy)]
pub struct GiHandle(nvmlGpuInstance_t);

/// An opaque `nvmlComputeInstance_t`.
#[derive(Debug, Clone, Copy)]
pub struct CiHandle(nvmlComputeInstance_t);

/// `nvmlGpuInstanceInfo_t` without the parent handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiInfo {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

/// CreateGpuInstanceWithPlacement: exactly this placement, or INSUFFICIENT_RESOURCES.
pub fn create_gi(nvml: &Nvml, dev: &Device, profile_id: u32, start: u32, size: u32) -> RawResult<GiHandle> {
    let f = sym!(nvml, nvmlDeviceCreateGpuInstanceWithPlacement);
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: live device handle, a readable placement, a writable handle slot.
    check("nvmlDeviceCreateGpuInstanceWithPlacement", unsafe { f(handle(dev), profile_id, &placement, &raw mut gi) })?;
    Ok(GiHandle(gi))
}

/// GetGpuInstances for one profile; `capacity` must be at least the profile's instance count.
pub fn gpu_instances(nvml: &Nvml, dev: &Device, profile_id: u32, capacity: usize) -> RawResult<Vec<GiHandle>> {
    let f = sym!(nvml, nvmlDeviceGetGpuInstances);
    let mut buf: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); capacity];
    let mut count = 0u32;
    // SAFETY: the buffer has room for `capacity` handles, at least the profile's instanceCount,
    // which bounds what NVML writes (nvml.h); `count` is writable.
    check("nvmlDeviceGetGpuInstances", unsafe { f(handle(dev), profile_id, buf.as_mut_ptr(), &raw mut count) })?;
    buf.truncate((count as usize).min(capacity));
    Ok(buf.into_iter().map(GiHandle).collect())
}

/// GetGpuInstanceById: NOT_FOUND when there is none.
pub fn gi_by_id(nvml: &Nvml, dev: &Device, id: u32) -> RawResult<GiHandle> {
    let f = sym!(nvml, nvmlDeviceGetGpuInstanceById);
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: live device handle and a writable handle slot.
    check("nvmlDeviceGetGpuInstanceById", unsafe { f(handle(dev), id, &raw mut gi) })?;
    Ok(GiHandle(gi))
}

/// GpuInstanceGetInfo.
pub fn gi_info(nvml: &Nvml, gi: GiHandle) -> RawResult<GiInfo> {
    let f = sym!(nvml, nvmlGpuInstanceGetInfo);
    // SAFETY: a handle and integers; all-zero (a NULL handle) is a valid value.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `gi` came from NVML in this call chain; `info` is writable and of the right type.
    check("nvmlGpuInstanceGetInfo", unsafe { f(gi.0, &raw mut info) })?;
    Ok(GiInfo { id: info.id, profile_id: info.profileId, start: info.placement.start, size: info.placement.size })
}

/// GpuInstanceDestroy: IN_USE while a CI or a process is on it.
pub fn destroy_gi(nvml: &Nvml, gi: GiHandle) -> RawResult<()> {
    let f = sym!(nvml, nvmlGpuInstanceDestroy);
    // SAFETY: `gi` came from NVML in this call chain; NVML validates stale handles itself.
    check("nvmlGpuInstanceDestroy", unsafe { f(gi.0) })
}

/// The part of `nvmlComputeInstanceProfileInfo_v2/v3_t` migdra uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiProfileInfo {
    pub id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
    pub multiprocessor_count: u32,
}

/// GpuInstanceGetComputeInstanceProfileInfoV for a CI profile *index* and the shared engine
/// profile: version 3 first, then version 2.
pub fn ci_profile_info(nvml: &Nvml, gi: GiHandle, index: u32) -> RawResult<CiProfileInfo> {
    let call = "nvmlGpuInstanceGetComputeInstanceProfileInfoV";
    let f = sym!(nvml, nvmlGpuInstanceGetComputeInstanceProfileInfoV);
    // SAFETY: plain integers and a char array; all-zero is valid.
    let mut v3: nvmlComputeInstanceProfileInfo_v3_t = unsafe { std::mem::zeroed() };
    v3.version = CI_PROFILE_INFO_V3;
    // SAFETY: `gi` came from NVML; `v3` is writable and as large as its version says (140 bytes,
    // larger than the v2 struct the binding names, whose fields it starts with).
    let ret = unsafe { f(gi.0, index, ENGINE_PROFILE_SHARED, (&raw mut v3).cast()) };
    if ret == SUCCESS {
        return Ok(CiProfileInfo {
            id: v3.id,
            slice_count: v3.sliceCount,
            instance_count: v3.instanceCount,
            multiprocessor_count: v3.multiprocessorCount,
        });
    }
    if ret != INVALID_ARGUMENT && ret != ARGUMENT_VERSION_MISMATCH {
        return Err(RawError { call, ret });
    }
    // SAFETY: as above.
    let mut v2: nvmlComputeInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    v2.version = CI_PROFILE_INFO_V2;
    // SAFETY: as above, with the struct type the binding declares.
    if unsafe { f(gi.0, index, ENGINE_PROFILE_SHARED, &raw mut v2) } != SUCCESS {
        return Err(RawError { call, ret });
    }
    Ok(CiProfileInfo {
        id: v2.id,
        slice_count: v2.sliceCount,
        instance_count: v2.instanceCount,
        multiprocessor_count: v2.multiprocessorCount,
    })
}

/// GpuInstanceCreateComputeInstance with a CI profile *ID*.
pub fn create_ci(nvml: &Nvml, gi: GiHandle, profile_id: u32) -> RawResult<CiHandle> {
    let f = sym!(nvml, nvmlGpuInstanceCreateComputeInstance);
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: `gi` came from NVML; the handle slot is writable.
    check("nvmlGpuInstanceCreateComputeInstance", unsafe { f(gi.0, profile_id, &raw mut ci) })?;
    Ok(CiHandle(ci))
}

/// GpuInstanceGetComputeInstances for one CI profile; `capacity` at least its instance count.
pub fn compute_instances(nvml: &Nvml, gi: GiHandle, profile_id: u32, capacity: usize) -> RawResult<Vec<CiHandle>> {
    let f = sym!(nvml, nvmlGpuInstanceGetComputeInstances);
    let mut buf: Vec<nvmlComputeInstance_t> = vec![ptr::null_mut(); capacity];
    let mut count = 0u32;
    // SAFETY: room for `capacity` handles, at least the CI profile's instanceCount (nvml.h).
    check("nvmlGpuInstanceGetComputeInstances", unsafe { f(gi.0, profile_id, buf.as_mut_ptr(), &raw mut count) })?;
    buf.truncate((count as usize).min(capacity));
    Ok(buf.into_iter().map(CiHandle).collect())
}

/// GpuInstanceGetComputeInstanceById: NOT_FOUND when there is none.
pub fn ci_by_id(nvml: &Nvml, gi: GiHandle, id: u32) -> RawResult<CiHandle> {
    let f = sym!(nvml, nvmlGpuInstanceGetComputeInstanceById);
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: `gi` came from NVML; the handle slot is writable.
    check("nvmlGpuInstanceGetComputeInstanceById", unsafe { f(gi.0, id, &raw mut ci) })?;
    Ok(CiHandle(ci))
}

/// `nvmlComputeInstanceInfo_t` plus the MIG UUID of its device handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiInfo {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    /// `MIG-…`, from GetUUID on `info.device`, the MIG device handle (a MIG device maps 1:1 to
    /// a CI; docs/facts/mig-nvml.md §2.1).
    pub uuid: String,
}

/// ComputeInstanceGetInfo_v2, then GetUUID on the MIG device handle it returns.
pub fn ci_info(nvml: &Nvml, ci: CiHandle) -> RawResult<CiInfo> {
    let f = sym!(nvml, nvmlComputeInstanceGetInfo_v2);
    let uuid_fn = sym!(nvml, nvmlDeviceGetUUID);
    // SAFETY: handles and integers; all-zero is valid.
    let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `ci` came from NVML; `info` is writable and of the declared type.
    check("nvmlComputeInstanceGetInfo_v2", unsafe { f(ci.0, &raw mut info) })?;
    let mut buf: [c_char; UUID_BUFFER] = [0; UUID_BUFFER];
    // SAFETY: `info.device` is the MIG device handle NVML just returned; the buffer is writable
    // for the length passed.
    check("nvmlDeviceGetUUID", unsafe { uuid_fn(info.device, buf.as_mut_ptr(), UUID_BUFFER as u32) })?;
    buf[UUID_BUFFER - 1] = 0;
    // SAFETY: the buffer is NUL-terminated (its last byte was just set to 0).
    let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
    Ok(CiInfo { id: info.id, profile_id: info.profileId, start: info.placement.start, size: info.placement.size, uuid })
}

/// ComputeInstanceDestroy: IN_USE while a process runs on it.
pub fn destroy_ci(nvml: &Nvml, ci: CiHandle) -> RawResult<()> {
    let f = sym!(nvml, nvmlComputeInstanceDestroy);
    // SAFETY: `ci` came from NVML in this call chain; NVML validates stale handles itself.
    check("nvmlComputeInstanceDestroy", unsafe { f(ci.0) })
}

/// One event from an event set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// [`device_key`] of the device it happened on.
    pub device: usize,
    pub event_type: u64,
    /// The XID, for [`EVENT_XID`].
    pub data: u64,
    /// The GPU instance it names, if any (MIG).
    pub gi: Option<u32>,
    pub ci: Option<u32>,
}

/// An NVML event set; freed on drop.
pub struct EventSet<'a> {
    nvml: &'a Nvml,
    set: nvmlEventSet_t,
}

impl<'a> EventSet<'a> {
    /// EventSetCreate.
    pub fn new(nvml: &'a Nvml) -> RawResult<Self> {
        let f = sym!(nvml, nvmlEventSetCreate);
        let mut set: nvmlEventSet_t = ptr::null_mut();
        // SAFETY: the set slot is writable.
        check("nvmlEventSetCreate", unsafe { f(&raw mut set) })?;
        Ok(EventSet { nvml, set })
    }

    /// DeviceRegisterEvents for `types` (a mask of `nvmlEventType*`).
    pub fn register(&self, dev: &Device, types: u64) -> RawResult<()> {
        let f = sym!(self.nvml, nvmlDeviceRegisterEvents);
        // SAFETY: live device handle and the set this struct owns.
        check("nvmlDeviceRegisterEvents", unsafe { f(handle(dev), types, self.set) })
    }

    /// EventSetWait_v2: the next event, or `None` after `timeout_ms` without one.
    pub fn wait(&self, timeout_ms: u32) -> RawResult<Option<Event>> {
        let f = sym!(self.nvml, nvmlEventSetWait_v2);
        // SAFETY: a handle and integers; all-zero is valid.
        let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: the set this struct owns and a writable event struct.
        let ret = unsafe { f(self.set, &raw mut data, timeout_ms) };
        if ret == TIMEOUT {
            return Ok(None);
        }
        check("nvmlEventSetWait_v2", ret)?;
        let id = |v: u32| (v != NO_INSTANCE).then_some(v);
        Ok(Some(Event {
            device: data.device.addr(),
            event_type: data.eventType,
            data: data.eventData,
            gi: id(data.gpuInstanceId),
            ci: id(data.computeInstanceId),
        }))
    }
}

impl Drop for EventSet<'_> {
    fn drop(&mut self) {
        if let Ok(f) = &self.nvml.lib().nvmlEventSetFree {
            // SAFETY: the set was created by EventSetCreate and is freed exactly once, here.
            let _ = unsafe { f(self.set) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_versions_match_nvml_h() {
        assert_eq!(GI_PROFILE_INFO_V3, 0x0300_0098);
        assert_eq!(CI_PROFILE_INFO_V3, 0x0300_008C);
    }

    #[test]
    fn c_strings_stop_at_nul_or_the_end() {
        let mut buf = [0 as c_char; 8];
        for (i, b) in b"MIG 1g".iter().enumerate() {
            buf[i] = *b as c_char;
        }
        assert_eq!(c_string(&buf), "MIG 1g");
        assert_eq!(c_string(&[b'a' as c_char; 4]), "aaaa");
    }
}
