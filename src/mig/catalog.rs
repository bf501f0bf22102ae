//! The GPU model catalog: every MIG fact migdra relies on, as data.
//!
//! Values come from `docs/facts/mig-nvml.md` §1 (real `nvidia-smi mig -lgip/-lgipp` output where it
//! exists). Rows the facts mark inferred or unverified keep that mark in [`Evidence`], and
//! `migdra profiles` prints it, so an operator can tell measured facts from educated guesses.

pub use super::profile::{CiProfile, Engines, Evidence, GiProfile, GpuModel, MediaEngines};
use std::sync::LazyLock;

static MODELS: LazyLock<Vec<GpuModel>> = LazyLock::new(super::models::all);

/// Every model in the catalog.
pub fn models() -> &'static [GpuModel] {
    &MODELS
}

/// The model with this `--sim`/`--model` key.
pub fn model(key: &str) -> Option<&'static GpuModel> {
    models().iter().find(|m| m.key.eq_ignore_ascii_case(key))
}

/// The valid model keys, for error messages.
pub fn model_keys() -> String {
    let keys: Vec<&str> = models().iter().map(|m| m.key.as_str()).collect();
    keys.join(", ")
}

/// Recognize a model by the PCI device ID (high 16 bits of NVML `pciDeviceId`).
pub fn model_by_pci_device_id(device_id: u16) -> Option<&'static GpuModel> {
    models().iter().find(|m| m.pci_device_ids.contains(&device_id))
}

/// Recognize a model by the name NVML reports.
pub fn model_by_nvml_name(name: &str) -> Option<&'static GpuModel> {
    let name = name.trim();
    models().iter().find(|m| {
        m.product_name.eq_ignore_ascii_case(name) || m.nvml_names.iter().any(|n| n.eq_ignore_ascii_case(name))
    })
}
