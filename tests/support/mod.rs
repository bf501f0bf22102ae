//! Shared test support, included by test files with `mod support;`.
//!
//! Each test binary compiles this module on its own and uses only part of it, so unused items
//! are expected and must not fail `clippy -D warnings`.
#![allow(dead_code)]

pub mod fake_apiserver;
pub mod fake_nvml;
pub mod controlplane;
pub mod kubelet_code;
