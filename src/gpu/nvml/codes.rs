//! NVML errors as migdra's: every `nvmlReturn_t` keeps its code, whichever way it arrived
//! (nvml-wrapper's `NvmlError`, which has no variant for INSUFFICIENT_RESOURCES or
//! ARGUMENT_VERSION_MISMATCH and reports them as `UnexpectedVariant(23/25)`, or a raw call).

use super::ffi::RawError;
use crate::gpu::{GpuError, NvmlCode};
use nvml_wrapper::error::NvmlError;

/// The NVML code an nvml-wrapper error stands for. Errors of the wrapper itself (a symbol that
/// failed to load, bad UTF-8) are FUNCTION_NOT_FOUND and UNKNOWN.
// The wrapper deprecates AlreadyInitialized (NVML refcounts init now), but it can still arrive.
#[allow(deprecated)]
pub fn code_of(e: &NvmlError) -> NvmlCode {
    use NvmlCode as C;
    match e {
        NvmlError::Uninitialized => C::Uninitialized,
        NvmlError::InvalidArg => C::InvalidArgument,
        NvmlError::NotSupported => C::NotSupported,
        NvmlError::NoPermission => C::NoPermission,
        NvmlError::AlreadyInitialized => C::AlreadyInitialized,
        NvmlError::NotFound => C::NotFound,
        NvmlError::InsufficientSize(_) => C::InsufficientSize,
        NvmlError::InsufficientPower => C::InsufficientPower,
        NvmlError::DriverNotLoaded => C::DriverNotLoaded,
        NvmlError::Timeout => C::Timeout,
        NvmlError::IrqIssue => C::IrqIssue,
        NvmlError::LibraryNotFound => C::LibraryNotFound,
        NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_) => C::FunctionNotFound,
        NvmlError::CorruptedInfoROM => C::CorruptedInforom,
        NvmlError::GpuLost => C::GpuIsLost,
        NvmlError::ResetRequired => C::ResetRequired,
        NvmlError::OperatingSystem => C::OperatingSystem,
        NvmlError::LibRmVersionMismatch => C::LibRmVersionMismatch,
        NvmlError::InUse => C::InUse,
        NvmlError::InsufficientMemory => C::Memory,
        NvmlError::NoData => C::NoData,
        NvmlError::VgpuEccNotSupported => C::VgpuEccNotSupported,
        NvmlError::UnexpectedVariant(v) => C::from_value(*v),
        _ => C::Unknown,
    }
}

/// An nvml-wrapper error of `op` on `gpu`.
pub fn from_wrapper(op: &'static str, gpu: &str, e: NvmlError) -> GpuError {
    GpuError::Nvml { op, gpu: gpu.to_string(), code: code_of(&e) }
}

/// A raw call's error on `gpu`.
pub fn from_raw(e: RawError, gpu: &str) -> GpuError {
    GpuError::Nvml { op: e.call, gpu: gpu.to_string(), code: NvmlCode::from_value(e.ret) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every return code nvml.h defines, however it reaches migdra, keeps its number.
    #[test]
    fn every_nvml_return_code_keeps_its_number() {
        for v in (1..=30).chain([999]) {
            let code = NvmlCode::from_value(v);
            assert_eq!(code.value(), v, "{v} has no NvmlCode of its own");
            assert_eq!(code_of(&NvmlError::from(v)), code, "nvml-wrapper's error for {v}");
            let raw = from_raw(RawError { call: "nvmlX", ret: v }, "GPU-1");
            assert_eq!(raw.code(), Some(code));
        }
        assert_eq!(code_of(&NvmlError::UnexpectedVariant(23)), NvmlCode::InsufficientResources);
        assert_eq!(code_of(&NvmlError::UnexpectedVariant(25)), NvmlCode::ArgumentVersionMismatch);
        assert_eq!(code_of(&NvmlError::FailedToLoadSymbol("x".into())), NvmlCode::FunctionNotFound);
        assert_eq!(NvmlCode::from_value(31), NvmlCode::Unknown, "newer codes are unknown, not wrong");
        let e = from_wrapper("nvmlDeviceGetUUID", "0", NvmlError::GpuLost);
        assert_eq!(e.to_string(), "nvmlDeviceGetUUID failed on GPU 0: gpu-is-lost (15)");
    }
}
