//! Device taints in published slices: the API's form of migdra's taints, and what the publisher
//! needs to keep them honest: each taint's `timeAdded` carried over between publications, the
//! set it compares with what the API server kept, and their removal for a server that drops them.

use crate::mig::taints::Taint;
use k8s_openapi::api::resource::v1 as api;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeSet;

/// A taint as the API's, without `timeAdded`: the API server stamps it when the taint first
/// appears, and the publisher carries that stamp over ([`keep_taint_times`]).
pub(super) fn taint(t: &Taint) -> api::DeviceTaint {
    api::DeviceTaint { key: t.key.clone(), value: t.value.clone(), effect: t.effect.as_str().into(), time_added: None }
}

/// Give every taint in `want` the `timeAdded` the same taint (key, value, effect) of the same
/// device has in `have`, so a taint keeps its time while the GPU stays unhealthy and a republish
/// does not rewrite it; a new taint gets `now`, in whole seconds as the server stores it.
pub fn keep_taint_times(want: &mut [ResourceSlice], have: &[ResourceSlice], now: Time) {
    let published: Vec<&api::Device> = have.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
    for d in want.iter_mut().flat_map(|s| s.spec.devices.iter_mut().flatten()) {
        let old = published.iter().find(|o| o.name == d.name).and_then(|o| o.taints.as_ref());
        for t in d.taints.iter_mut().flatten() {
            let same =
                old.into_iter().flatten().find(|o| (&o.key, &o.value, &o.effect) == (&t.key, &t.value, &t.effect));
            t.time_added = Some(same.and_then(|o| o.time_added.clone()).unwrap_or_else(|| now.clone()));
        }
    }
}

/// Taints without their times: (device, key, value, effect).
pub type TaintSet = BTreeSet<(String, String, Option<String>, String)>;

/// Every taint of the slices, by device, without times: what the publisher compares to see
/// whether the API server kept them.
pub fn taints_of(slices: &[ResourceSlice]) -> TaintSet {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .flat_map(|d| {
            d.taints.iter().flatten().map(|t| (d.name.clone(), t.key.clone(), t.value.clone(), t.effect.clone()))
        })
        .collect()
}

/// Remove every taint, for an API server that drops them (DRADeviceTaints off).
pub fn strip_taints(slices: &mut [ResourceSlice]) {
    for d in slices.iter_mut().flat_map(|s| s.spec.devices.iter_mut().flatten()) {
        d.taints = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::slices::tests::{DRIVER, NODE, node, parent, tainted};
    use crate::kube::slices::{Layout, build};
    use crate::mig::devices::GpuMode;

    #[test]
    fn a_taint_keeps_its_time_and_a_new_one_gets_now() {
        let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        let mut gpus = node(&[("h100-80gb", 2, GpuMode::Dynamic)]);
        tainted(&mut gpus, 0);
        let mut have = build(DRIVER, NODE, None, 1, Layout::Split, &gpus).unwrap();
        keep_taint_times(&mut have, &[], at(100));
        let times = |slices: &[ResourceSlice]| -> BTreeSet<(String, Option<i64>)> {
            slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .flat_map(|d| {
                    d.taints.iter().flatten().map(|t| (d.name.clone(), t.time_added.as_ref().map(|t| t.0.as_second())))
                })
                .collect()
        };
        assert!(times(&have).iter().all(|(_, t)| *t == Some(100)));
        assert_eq!(times(&have).len(), gpus[0].devices.len());

        // Both GPUs unhealthy, one more generation: GPU 0's taints keep 100, GPU 1's get 200.
        tainted(&mut gpus, 1);
        let mut want = build(DRIVER, NODE, None, 2, Layout::Split, &gpus).unwrap();
        keep_taint_times(&mut want, &have, at(200));
        let t = times(&want);
        let first = |n: &str| parent(n) == "gpu-100";
        assert!(t.iter().all(|(n, s)| *s == Some(if first(n) { 100 } else { 200 })), "{t:?}");
        assert_eq!(taints_of(&want).len(), gpus[0].devices.len() + gpus[1].devices.len());
        strip_taints(&mut want);
        assert!(taints_of(&want).is_empty());
    }
}
