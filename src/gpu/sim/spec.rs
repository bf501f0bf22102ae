//! The `--sim` spec: which GPU models a simulated node has, in NVML index order.

use super::MAX_GPUS;
use crate::gpu::{GpuError, Result};
use crate::mig::catalog::{self, GpuModel};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

pub(super) const SPEC_FORM: &str = "expected MODEL:COUNT[:mig-off][,...], e.g. h100-80gb:2,a100-40gb:1:mig-off";

/// One simulated GPU of a [`SimSpec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimGpuSpec {
    /// Catalog key, e.g. `h100-80gb`.
    pub model: String,
    pub mig_enabled: bool,
}

/// The GPUs of a simulated node, from `--sim h100-80gb:2,a100-40gb:1:mig-off`. NVML indexes are
/// given in spec order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimSpec {
    pub gpus: Vec<SimGpuSpec>,
}

impl SimSpec {
    /// Parse `MODEL:COUNT[:mig-off][,...]`.
    pub fn parse(s: &str) -> Result<SimSpec> {
        let bad =
            |part: &str, why: &str| GpuError::Invalid(format!("--sim '{s}': bad part '{part}': {why}; {SPEC_FORM}"));
        if s.trim().is_empty() {
            return Err(GpuError::Invalid(format!("--sim is empty; {SPEC_FORM}")));
        }
        let mut gpus = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let fields: Vec<&str> = part.split(':').map(str::trim).collect();
            if fields.len() < 2 || fields.len() > 3 {
                return Err(bad(part, "wrong number of ':'-separated fields"));
            }
            let model = catalog::model(fields[0]).ok_or_else(|| {
                GpuError::Invalid(format!(
                    "--sim '{s}': unknown GPU model '{}'; valid models: {}",
                    fields[0],
                    catalog::model_keys()
                ))
            })?;
            let count: usize = fields[1].parse().map_err(|_| bad(part, "COUNT is not a number"))?;
            if !(1..=MAX_GPUS).contains(&count) {
                return Err(bad(part, &format!("COUNT must be 1 to {MAX_GPUS}")));
            }
            let mig_enabled = match fields.get(2).map(|m| m.to_ascii_lowercase()) {
                None => true,
                Some(m) if m == "mig-off" => false,
                Some(m) if m == "mig-on" => true,
                Some(_) => return Err(bad(part, "the third field may only be 'mig-off'")),
            };
            gpus.extend((0..count).map(|_| SimGpuSpec { model: model.key.clone(), mig_enabled }));
        }
        if gpus.len() > MAX_GPUS {
            return Err(GpuError::Invalid(format!(
                "--sim '{s}': {} GPUs in all, at most {MAX_GPUS} are supported",
                gpus.len()
            )));
        }
        Ok(SimSpec { gpus })
    }

    /// The catalog model of each GPU, in NVML index order.
    pub fn models(&self) -> impl Iterator<Item = &'static GpuModel> + '_ {
        self.gpus.iter().map(|g| catalog::model(&g.model).expect("parsed specs name catalog models"))
    }
}

impl FromStr for SimSpec {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl fmt::Display for SimSpec {
    /// The compact form `parse` reads: runs of equal GPUs become `MODEL:COUNT`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        let mut i = 0;
        while i < self.gpus.len() {
            let g = &self.gpus[i];
            let run = self.gpus[i..].iter().take_while(|o| *o == g).count();
            let off = if g.mig_enabled { "" } else { ":mig-off" };
            parts.push(format!("{}:{run}{off}", g.model));
            i += run;
        }
        f.write_str(&parts.join(","))
    }
}
