//! The fault language (`OP=ERROR[:COUNT][@PROBABILITY][#GPU]`, `OP=delay:DURATION…`) and how
//! faults fire on an operation.

use super::SimState;
use super::hardware::splitmix64;
use crate::gpu::{GpuError, NvmlCode, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub(super) const FAULT_FORM: &str = "expected OP=ERROR[:COUNT] or OP=delay:DURATION[:COUNT], optionally followed by \
                          @PROBABILITY and #GPU, e.g. create-gi=insufficient-resources:1, destroy-gi=delay:1s, \
                          create-ci=in-use@0.05";

/// A simulated operation a fault can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SimOp {
    /// `gpus()`.
    Discover,
    /// `gpu_instances()`.
    ListGi,
    CreateGi,
    DestroyGi,
    /// `compute_instances()`.
    ListCi,
    CreateCi,
    DestroyCi,
}

impl SimOp {
    pub const ALL: [SimOp; 7] =
        [Self::Discover, Self::ListGi, Self::CreateGi, Self::DestroyGi, Self::ListCi, Self::CreateCi, Self::DestroyCi];

    /// The kebab-case name (`create-gi`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Discover => "discover",
            Self::ListGi => "list-gi",
            Self::CreateGi => "create-gi",
            Self::DestroyGi => "destroy-gi",
            Self::ListCi => "list-ci",
            Self::CreateCi => "create-ci",
            Self::DestroyCi => "destroy-ci",
        }
    }

    /// The NVML call this operation stands for, for error messages.
    pub fn nvml_call(self) -> &'static str {
        match self {
            Self::Discover => "nvmlDeviceGetHandleByIndex",
            Self::ListGi => "nvmlDeviceGetGpuInstances",
            Self::CreateGi => "nvmlDeviceCreateGpuInstanceWithPlacement",
            Self::DestroyGi => "nvmlGpuInstanceDestroy",
            Self::ListCi => "nvmlGpuInstanceGetComputeInstances",
            Self::CreateCi => "nvmlGpuInstanceCreateComputeInstance",
            Self::DestroyCi => "nvmlComputeInstanceDestroy",
        }
    }

    pub fn parse(s: &str) -> Option<SimOp> {
        let s = s.trim().to_ascii_lowercase().replace('_', "-");
        Self::ALL.into_iter().find(|o| o.name() == s)
    }

    /// The valid names, for error messages.
    pub fn names() -> String {
        let names: Vec<&str> = Self::ALL.iter().map(|o| o.name()).collect();
        names.join(", ")
    }
}

impl fmt::Display for SimOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a fault does to the operation it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Fail with this NVML code; nothing changes.
    Fail(NvmlCode),
    /// Sleep this long (holding no lock), then do the operation.
    Delay(Duration),
}

/// An injected fault, written `OP=ERROR[:COUNT][@PROBABILITY][#GPU]` or
/// `OP=delay:DURATION[:COUNT][@PROBABILITY][#GPU]`. It is stored in the state file in that form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Fault {
    pub op: SimOp,
    pub action: FaultAction,
    /// How many more times it fires; `None` is forever. Dropped when it reaches 0.
    pub remaining: Option<u32>,
    /// Chance that it fires on a matching operation; `None` is always.
    pub probability: Option<f64>,
    /// Only operations on this GPU (UUID or NVML index); `None` is every GPU.
    pub gpu: Option<String>,
}

impl Fault {
    /// Parse one fault.
    pub fn parse(s: &str) -> Result<Fault> {
        let orig = s.trim();
        let bad = |why: &str| {
            GpuError::Invalid(format!(
                "fault '{orig}': {why}; {FAULT_FORM}; ops: {}; errors: {}",
                SimOp::names(),
                NvmlCode::names()
            ))
        };
        let mut body = orig;
        let (mut probability, mut gpu) = (None, None);
        while let Some(i) = body.rfind(['@', '#']) {
            let (head, tail) = body.split_at(i);
            let value = tail[1..].trim();
            if tail.starts_with('#') {
                if gpu.is_some() || value.is_empty() {
                    return Err(bad("'#GPU' must name one GPU (UUID or index)"));
                }
                gpu = Some(value.to_string());
            } else {
                let p: f64 = value.parse().map_err(|_| bad("'@PROBABILITY' must be a number from 0 to 1"))?;
                if probability.is_some() || !(0.0..=1.0).contains(&p) {
                    return Err(bad("'@PROBABILITY' must be a number from 0 to 1"));
                }
                probability = Some(p);
            }
            body = head;
        }
        let (op, action) = body.split_once('=').ok_or_else(|| bad("missing '='"))?;
        let op = SimOp::parse(op).ok_or_else(|| bad(&format!("unknown operation '{}'", op.trim())))?;
        if op == SimOp::Discover && gpu.is_some() {
            return Err(bad("discover covers the whole node, so it takes no '#GPU'"));
        }
        let fields: Vec<&str> = action.split(':').map(str::trim).collect();
        let (action, rest) = if fields[0].eq_ignore_ascii_case("delay") {
            let d = fields.get(1).ok_or_else(|| bad("delay needs a duration, e.g. delay:300ms"))?;
            let d = crate::duration::parse(d).map_err(|e| bad(&e.to_string()))?;
            (FaultAction::Delay(d), &fields[2..])
        } else {
            let code = NvmlCode::parse(fields[0]).ok_or_else(|| bad(&format!("unknown error '{}'", fields[0])))?;
            (FaultAction::Fail(code), &fields[1..])
        };
        let remaining = match rest {
            [] => None,
            [n] => match n.parse::<u32>() {
                Ok(n) if n >= 1 => Some(n),
                _ => return Err(bad(&format!("COUNT '{n}' must be a whole number of at least 1"))),
            },
            _ => return Err(bad("too many ':'-separated fields")),
        };
        Ok(Fault { op, action, remaining, probability, gpu })
    }

    /// Parse a comma-separated list (the `MIGDRA_SIM_FAULTS` format); empty entries are skipped.
    pub fn parse_list(s: &str) -> Result<Vec<Fault>> {
        s.split(',').filter(|p| !p.trim().is_empty()).map(Fault::parse).collect()
    }

    pub(super) fn matches(&self, op: SimOp, gpu: Option<usize>, state: &SimState) -> bool {
        if self.op != op {
            return false;
        }
        match &self.gpu {
            None => true,
            Some(sel) => gpu.is_some() && state.resolve(sel).ok() == gpu,
        }
    }
}

impl FromStr for Fault {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=", self.op)?;
        match self.action {
            FaultAction::Fail(code) => f.write_str(code.name())?,
            FaultAction::Delay(d) => write!(f, "delay:{}", crate::duration::format(d))?,
        }
        if let Some(n) = self.remaining {
            write!(f, ":{n}")?;
        }
        if let Some(p) = self.probability {
            write!(f, "@{p}")?;
        }
        if let Some(g) = &self.gpu {
            write!(f, "#{g}")?;
        }
        Ok(())
    }
}

impl TryFrom<String> for Fault {
    type Error = GpuError;
    fn try_from(s: String) -> Result<Self> {
        Self::parse(&s)
    }
}

impl From<Fault> for String {
    fn from(f: Fault) -> String {
        f.to_string()
    }
}

/// Process-local fault state.
pub(super) struct Extra {
    pub(super) env_faults: Vec<Fault>,
    /// Generator for fault probabilities (not part of the state: read-only ops must not write).
    pub(super) rng: u64,
}

/// What the faults decided for one operation.
pub(super) struct Decision {
    pub(super) delay: Duration,
    pub(super) fail: Option<NvmlCode>,
    pub(super) gpu_label: String,
}

/// Which faults hit this operation. Every fault that fires counts down; delays add up; the first
/// failure wins (later failures do not fire).
pub(super) fn decide(st: &mut SimState, extra: &mut Extra, op: SimOp, gpu: Option<&str>) -> Decision {
    let pos = gpu.and_then(|g| st.resolve(g).ok());
    let gpu_label = match (pos, gpu) {
        (Some(i), _) => st.gpus[i].uuid.clone(),
        (None, Some(g)) => g.to_string(),
        (None, None) => "all".to_string(),
    };
    let mut d = Decision { delay: Duration::ZERO, fail: None, gpu_label };
    let mut persisted = std::mem::take(&mut st.faults);
    for list in [&mut persisted, &mut extra.env_faults] {
        list.retain_mut(|f| {
            if !f.matches(op, pos, st) {
                return true;
            }
            if matches!(f.action, FaultAction::Fail(_)) && d.fail.is_some() {
                return true;
            }
            if f.probability.is_some_and(|p| roll(&mut extra.rng) >= p) {
                return true;
            }
            match f.action {
                FaultAction::Fail(code) => d.fail = Some(code),
                FaultAction::Delay(t) => d.delay += t,
            }
            match &mut f.remaining {
                Some(n) => {
                    *n -= 1;
                    *n > 0
                }
                None => true,
            }
        });
    }
    st.faults = persisted;
    d
}

/// A uniform draw from [0, 1).
pub(super) fn roll(rng: &mut u64) -> f64 {
    *rng = rng.wrapping_add(1);
    (splitmix64(*rng) >> 11) as f64 / (1u64 << 53) as f64
}
