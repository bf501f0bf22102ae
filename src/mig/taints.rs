//! Device taints for unhealthy GPUs (KEP-5055): which of a GPU's devices carry which taint, from
//! the health the backend reports. The scheduler allocates no tainted device to a claim that does
//! not tolerate the taint, so a GPU that had a critical XID or fell off the bus gets no new work.
//!
//! The keys follow NVIDIA's DRA driver under the driver's own domain, so an operator who knows
//! `gpu.nvidia.com/xid` reads ours the same way: `<driver>/xid` with the XID as its value, and
//! `<driver>/gpu-lost` without a value. A GPU's cause taints every device on it; a GPU
//! instance's own cause (a contained ECC error) taints only that instance's device.

use super::devices::{AttributeValue, Device};
use serde::Serialize;
use std::fmt;

/// Why a GPU, or one GPU instance, should take no new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// A critical XID: the driver reported an error that is not the application's.
    Xid(u64),
    /// The GPU no longer answers (NVML_ERROR_GPU_IS_LOST).
    Lost,
}

/// What a taint does to claims that do not tolerate it (`DeviceTaintEffect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Effect {
    /// New claims are not allocated the device; running pods stay.
    NoSchedule,
    /// As NoSchedule, and pods already using the device are evicted.
    NoExecute,
    /// Only informational: the taint shows in the slice, scheduling ignores it.
    None,
}

impl Effect {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::NoExecute => "NoExecute",
            Self::None => "None",
        }
    }
}

/// Whether and how unhealthy GPUs are tainted (`--unhealthy-taint-effect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaintPolicy {
    /// No taints (`disabled`; not `off`, which YAML reads as false): slices look the same
    /// whatever the health.
    Off,
    /// Taint with this effect.
    Taint(Effect),
}

impl TaintPolicy {
    /// The values the flag takes, for its error message.
    pub const VALUES: &'static str = "NoSchedule, NoExecute, None, disabled";

    /// Parse the flag's value (any case).
    ///
    /// # Errors
    /// The value is none of [`Self::VALUES`]; the message names it and them.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "noschedule" => Ok(Self::Taint(Effect::NoSchedule)),
            "noexecute" => Ok(Self::Taint(Effect::NoExecute)),
            "none" => Ok(Self::Taint(Effect::None)),
            "disabled" => Ok(Self::Off),
            _ => Err(format!("--unhealthy-taint-effect {s:?} is not a taint effect; use one of {}", Self::VALUES)),
        }
    }
}

impl Default for TaintPolicy {
    fn default() -> Self {
        Self::Taint(Effect::NoSchedule)
    }
}

impl fmt::Display for TaintPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("disabled"),
            Self::Taint(e) => f.write_str(e.as_str()),
        }
    }
}

/// One device taint, as the slice carries it (the API server stamps the time it was added).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Taint {
    /// A label name under the driver's domain.
    pub key: String,
    /// A label value; `None` when the key says it all.
    pub value: Option<String>,
    pub effect: Effect,
}

/// The taint for one cause.
pub fn taint(driver: &str, cause: Cause, effect: Effect) -> Taint {
    match cause {
        Cause::Xid(x) => Taint { key: format!("{driver}/xid"), value: Some(x.to_string()), effect },
        Cause::Lost => Taint { key: format!("{driver}/gpu-lost"), value: None, effect },
    }
}

/// One GPU's health, as far as taints need it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GpuHealth {
    /// `Some` when the whole GPU is unhealthy.
    pub gpu: Option<Cause>,
    /// GPU instances unhealthy on their own: (profile ID, placement start, cause).
    pub instances: Vec<(u32, u32, Cause)>,
}

impl GpuHealth {
    pub fn is_healthy(&self) -> bool {
        self.gpu.is_none() && self.instances.is_empty()
    }
}

/// Put the taints `health` calls for on one GPU's devices: the GPU's cause on every device (the
/// whole GPU, every partition, every instance), otherwise an instance's own cause on the device
/// at its profile and placement. Devices of a healthy GPU, and every device under
/// [`TaintPolicy::Off`], are left without taints.
pub fn apply(devices: &mut [Device], health: &GpuHealth, driver: &str, policy: TaintPolicy) {
    let TaintPolicy::Taint(effect) = policy else { return };
    for d in devices.iter_mut() {
        let cause = health.gpu.or_else(|| {
            let int = |k: &str| match d.attributes.get(k) {
                Some(AttributeValue::Int(i)) => u32::try_from(*i).ok(),
                _ => None,
            };
            let (profile, start) = (int("profileId")?, int("placementStart")?);
            health.instances.iter().find(|(p, s, _)| (*p, *s) == (profile, start)).map(|(_, _, c)| *c)
        });
        if let Some(cause) = cause {
            d.taints = vec![taint(driver, cause, effect)];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::allowlist::Allowlist;
    use crate::mig::catalog::model;
    use crate::mig::devices::{ExistingInstance, GpuIdentity, GpuMode, gpu_devices};
    use crate::mig::naming::NameStyle;

    const DRIVER: &str = "mig.slinky.slurm.net";

    fn identity() -> GpuIdentity {
        GpuIdentity {
            index: 0,
            minor: 1,
            uuid: "GPU-1".into(),
            pci_bus_id: "00000000:3B:00.0".into(),
            product_name: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81559,
            driver_version: "580.95.05".into(),
            cuda_compute_capability: (9, 0),
            slurm_index: Some(0),
            slurm_index_source: "nvml".into(),
            shards_per_gpu: 7,
            topology: Default::default(),
        }
    }

    fn devices(mode: GpuMode, whole: bool, existing: &[ExistingInstance]) -> Vec<Device> {
        let m = model("h100-80gb").unwrap();
        gpu_devices(m, &identity(), mode, whole, existing, NameStyle::Minor, &Allowlist::default())
    }

    fn instance(profile_id: u32, start: u32) -> ExistingInstance {
        ExistingInstance { profile_id, start, uuid: format!("MIG-{profile_id}-{start}"), slurm_index: None }
    }

    fn tainted(devices: &[Device]) -> Vec<(&str, &[Taint])> {
        devices.iter().filter(|d| !d.taints.is_empty()).map(|d| (d.name.as_str(), d.taints.as_slice())).collect()
    }

    #[test]
    fn a_sick_gpu_taints_every_device_it_has_in_every_mode() {
        let sick = GpuHealth { gpu: Some(Cause::Xid(79)), instances: vec![] };
        let want = [taint(DRIVER, Cause::Xid(79), Effect::NoSchedule)];
        for (mode, whole, existing) in [
            (GpuMode::Full, false, vec![]),
            (GpuMode::Dynamic, true, vec![instance(9, 4)]),
            (GpuMode::Dynamic, false, vec![]),
            (GpuMode::Static, false, vec![instance(9, 4), instance(19, 0)]),
        ] {
            let mut d = devices(mode, whole, &existing);
            assert!(!d.is_empty());
            apply(&mut d, &sick, DRIVER, TaintPolicy::default());
            assert!(d.iter().all(|d| d.taints == want), "{mode:?}: {:?}", tainted(&d));
        }
        assert_eq!(want[0].key, "mig.slinky.slurm.net/xid");
        assert_eq!(want[0].value.as_deref(), Some("79"));
    }

    #[test]
    fn a_sick_instance_taints_only_its_own_device() {
        let existing = [instance(9, 4), instance(19, 0)];
        let health = GpuHealth { gpu: None, instances: vec![(9, 4, Cause::Xid(94))] };
        for mode in [GpuMode::Dynamic, GpuMode::Static] {
            let mut d = devices(mode, false, &existing);
            apply(&mut d, &health, DRIVER, TaintPolicy::Taint(Effect::NoExecute));
            let t = tainted(&d);
            assert_eq!(t.len(), 1, "{mode:?}: {t:?}");
            assert_eq!(t[0].0, "gpu-1-mig-3g40gb-9-4");
            assert_eq!(t[0].1, [taint(DRIVER, Cause::Xid(94), Effect::NoExecute)]);
        }
    }

    #[test]
    fn the_gpu_cause_wins_over_an_instance_cause() {
        let health = GpuHealth { gpu: Some(Cause::Lost), instances: vec![(9, 4, Cause::Xid(94))] };
        let mut d = devices(GpuMode::Static, false, &[instance(9, 4)]);
        apply(&mut d, &health, DRIVER, TaintPolicy::default());
        let lost = taint(DRIVER, Cause::Lost, Effect::NoSchedule);
        assert_eq!(lost.key, "mig.slinky.slurm.net/gpu-lost");
        assert_eq!(lost.value, None);
        assert_eq!(d[0].taints, [lost]);
    }

    #[test]
    fn healthy_gpus_and_the_off_policy_publish_no_taints() {
        let mut d = devices(GpuMode::Dynamic, true, &[instance(9, 4)]);
        apply(&mut d, &GpuHealth::default(), DRIVER, TaintPolicy::default());
        assert!(tainted(&d).is_empty());
        let sick = GpuHealth { gpu: Some(Cause::Xid(48)), instances: vec![(9, 4, Cause::Xid(94))] };
        apply(&mut d, &sick, DRIVER, TaintPolicy::Off);
        assert!(tainted(&d).is_empty());
        assert!(GpuHealth::default().is_healthy() && !sick.is_healthy());
    }

    #[test]
    fn the_flag_takes_each_effect_or_disabled_and_names_them_when_wrong() {
        assert_eq!(TaintPolicy::parse("NoSchedule"), Ok(TaintPolicy::Taint(Effect::NoSchedule)));
        assert_eq!(TaintPolicy::parse("noexecute"), Ok(TaintPolicy::Taint(Effect::NoExecute)));
        assert_eq!(TaintPolicy::parse("None"), Ok(TaintPolicy::Taint(Effect::None)));
        assert_eq!(TaintPolicy::parse("disabled"), Ok(TaintPolicy::Off));
        assert_eq!(TaintPolicy::default(), TaintPolicy::Taint(Effect::NoSchedule));
        let e = TaintPolicy::parse("PreferNoSchedule").unwrap_err();
        assert!(e.contains("\"PreferNoSchedule\"") && e.contains(TaintPolicy::VALUES), "{e}");
        for v in TaintPolicy::VALUES.split(", ") {
            assert_eq!(TaintPolicy::parse(v).unwrap().to_string(), v);
        }
    }
}
