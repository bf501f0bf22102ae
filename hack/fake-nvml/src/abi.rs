//! The only raw pointer access of the fake: reading what callers pass and writing results
//! through their out-pointers, each checked for NULL.
//!
//! Every function is `unsafe`: the caller promises nvml.h's contract for the call it serves
//! (a non-NULL pointer is valid and aligned for the type, a buffer for its stated length).

use crate::node::{INSUFFICIENT_SIZE, INVALID_ARGUMENT, Ret};
use std::ffi::{CStr, c_char};

/// Write `v` through an out-pointer.
pub unsafe fn put<T>(p: *mut T, v: T) -> Ret<()> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-NULL, and valid and aligned for `T` by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Read a value the caller passed by pointer.
pub unsafe fn get<T: Copy>(p: *const T) -> Ret<T> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-NULL, and valid and aligned for `T` by the caller's contract.
    Ok(unsafe { p.read() })
}

/// The `version` field every versioned NVML struct starts with.
pub unsafe fn version_of<T>(p: *const T) -> Ret<u32> {
    // SAFETY: a versioned struct begins with its u32 version; the caller's contract covers it.
    unsafe { get(p.cast::<u32>()) }
}

/// Copy `s` and a NUL into a caller's buffer of `len` bytes; INSUFFICIENT_SIZE if it is short.
pub unsafe fn put_str(buf: *mut c_char, len: u32, s: &str) -> Ret<()> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` has room for `len` bytes by the caller's contract, and `s.len() + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// Write `items` into a caller's array (NULL: only the count is wanted).
pub unsafe fn put_all<T: Copy>(p: *mut T, items: &[T]) {
    if p.is_null() {
        return;
    }
    // SAFETY: NVML callers size the array for the profile's instance or placement count, which
    // bounds `items` (nvml.h).
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), p, items.len()) };
}

/// A C string the caller passed.
pub unsafe fn c_str(p: *const c_char) -> Ret<String> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// A fixed-size C char array holding `s` (cut to fit, always NUL-terminated).
pub fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N.saturating_sub(1))) {
        *o = b as c_char;
    }
    out
}
