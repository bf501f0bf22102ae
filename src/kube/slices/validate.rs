//! The API server's rules for ResourceSlices, mirrored so a slice set that the server would
//! refuse is caught before it is sent, with one message per violation naming the slice and the
//! device or counter. The limits are the constants of the parent module.

use super::{
    COMBINED_MAX_CONSUMED_COUNTERS, COMBINED_MAX_SHARED_COUNTERS, Layout, MAX_ATTRIBUTE_VALUE_LEN,
    MAX_CONSUMPTIONS_PER_DEVICE, MAX_COUNTER_SETS, MAX_COUNTERS_PER_CONSUMPTION, MAX_COUNTERS_PER_SET, MAX_DEVICES,
    MAX_DRIVER_LEN, MAX_TAINTS_PER_DEVICE,
};
use crate::mig::devices;
use crate::names::{MAX_SUBDOMAIN_LEN, is_dns_label, is_dns_subdomain, qualified_name_problem};
use k8s_openapi::api::resource::v1 as api;
use k8s_openapi::api::resource::v1::ResourceSlice;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Semantic version 2.0.0: `MAJOR.MINOR.PATCH[-pre][+build]`, numbers without leading zeros.
pub fn is_semver(s: &str) -> bool {
    let number = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'));
    let ident = |i: &str| !i.is_empty() && i.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    let (rest, build) = match s.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (s, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let core: Vec<&str> = core.split('.').collect();
    core.len() == 3
        && core.iter().all(|n| number(n))
        && pre.is_none_or(|p| p.split('.').all(|i| ident(i) && (!i.bytes().all(|b| b.is_ascii_digit()) || number(i))))
        && build.is_none_or(|b| b.split('.').all(ident))
}

fn check_counters(at: &str, counters: &BTreeMap<String, api::Counter>, problems: &mut Vec<String>) {
    if counters.is_empty() {
        problems.push(format!("{at}: no counters"));
    }
    for k in counters.keys().filter(|k| !is_dns_label(k)) {
        problems.push(format!("{at}: counter name {k:?} is not a DNS label"));
    }
}

fn check_device(at: &str, d: &api::Device, layout: Layout, problems: &mut Vec<String>) {
    let at = format!("{at}: device {:?}", d.name);
    if !is_dns_label(&d.name) {
        problems.push(format!("{at}: name is not a DNS label"));
    }
    let attributes = d.attributes.as_ref();
    let capacity = d.capacity.as_ref();
    let n = attributes.map_or(0, BTreeMap::len) + capacity.map_or(0, BTreeMap::len);
    if n > devices::MAX_ATTRIBUTES_AND_CAPACITIES {
        problems
            .push(format!("{at}: {n} attributes and capacities, more than {}", devices::MAX_ATTRIBUTES_AND_CAPACITIES));
    }
    for (k, a) in attributes.into_iter().flatten() {
        if let Some(why) = qualified_name_problem(k) {
            problems.push(format!("{at}: attribute {k:?}: {why}"));
        }
        let set = [a.int.is_some(), a.bool.is_some(), a.string.is_some(), a.version.is_some()];
        if set.iter().filter(|s| **s).count() != 1 {
            problems.push(format!("{at}: attribute {k:?} must set exactly one of int, bool, string, version"));
        }
        for (what, v) in [("string", &a.string), ("version", &a.version)] {
            if let Some(v) = v
                && v.chars().count() > MAX_ATTRIBUTE_VALUE_LEN
            {
                problems.push(format!(
                    "{at}: attribute {k:?}: {what} value has {} characters, more than {MAX_ATTRIBUTE_VALUE_LEN}",
                    v.chars().count()
                ));
            }
        }
        if let Some(v) = &a.version
            && !is_semver(v)
        {
            problems.push(format!("{at}: attribute {k:?}: {v:?} is not a semantic version"));
        }
    }
    for k in capacity.into_iter().flatten().map(|(k, _)| k) {
        if let Some(why) = qualified_name_problem(k) {
            problems.push(format!("{at}: capacity {k:?}: {why}"));
        }
    }
    let taints = d.taints.as_deref().unwrap_or_default();
    if taints.len() > MAX_TAINTS_PER_DEVICE {
        problems.push(format!("{at}: {} taints, more than {MAX_TAINTS_PER_DEVICE}", taints.len()));
    }
    for t in taints.iter().filter(|t| !["None", "NoSchedule", "NoExecute"].contains(&t.effect.as_str())) {
        problems.push(format!("{at}: taint {:?}: effect {:?} is not None, NoSchedule or NoExecute", t.key, t.effect));
    }
    let consumes = d.consumes_counters.as_deref().unwrap_or_default();
    if layout == Layout::Split && consumes.len() > MAX_CONSUMPTIONS_PER_DEVICE {
        problems
            .push(format!("{at}: consumes {} counter sets, more than {MAX_CONSUMPTIONS_PER_DEVICE}", consumes.len()));
    }
    let mut seen = BTreeSet::new();
    for c in consumes {
        if !seen.insert(c.counter_set.as_str()) {
            problems.push(format!("{at}: consumes counter set {:?} twice", c.counter_set));
        }
        if !is_dns_label(&c.counter_set) {
            problems.push(format!("{at}: counter set name {:?} is not a DNS label", c.counter_set));
        }
        check_counters(&format!("{at}: consumption of {:?}", c.counter_set), &c.counters, problems);
        if c.counters.len() > MAX_COUNTERS_PER_CONSUMPTION {
            problems.push(format!(
                "{at}: consumes {} counters of {:?}, more than {MAX_COUNTERS_PER_CONSUMPTION}",
                c.counters.len(),
                c.counter_set
            ));
        }
    }
    let total: usize = consumes.iter().map(|c| c.counters.len()).sum();
    if layout == Layout::Combined && total > MAX_COUNTERS_PER_CONSUMPTION {
        problems.push(format!("{at}: consumes {total} counters, more than {MAX_COUNTERS_PER_CONSUMPTION}"));
    }
}

/// Every way these slices of one pool break the API server's rules (or our own reading of them,
/// such as counter references, which the server checks only at allocation), one message each.
/// Empty when they may be published as they are.
pub fn validate(slices: &[ResourceSlice], layout: Layout) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(first) = slices.first() else { return problems };
    let label = |i: usize, s: &ResourceSlice| s.metadata.name.clone().unwrap_or_else(|| format!("#{i}"));
    let pool = &first.spec.pool;

    // Where each counter set lives, and each device name / slice name, for pool-wide checks.
    let mut set_home: HashMap<&str, (usize, &api::CounterSet)> = HashMap::new();
    let mut device_home: HashMap<&str, usize> = HashMap::new();
    let mut names: HashMap<String, usize> = HashMap::new();

    for (i, s) in slices.iter().enumerate() {
        let at = format!("slice {}", label(i, s));
        let spec = &s.spec;
        match &s.metadata.name {
            None => problems.push(format!("{at}: no metadata.name")),
            Some(n) if !is_dns_subdomain(n) => problems.push(format!("{at}: name is not a DNS subdomain (≤253)")),
            Some(n) => {
                if let Some(j) = names.insert(n.clone(), i) {
                    problems.push(format!("{at}: same name as slice #{j}"));
                }
            }
        }
        if !is_dns_subdomain(&spec.driver) || spec.driver.len() > MAX_DRIVER_LEN {
            problems.push(format!("{at}: driver {:?} is not a DNS subdomain of ≤{MAX_DRIVER_LEN}", spec.driver));
        }
        let p = &spec.pool;
        if p.name.is_empty() || p.name.len() > MAX_SUBDOMAIN_LEN || !p.name.split('/').all(is_dns_subdomain) {
            problems.push(format!("{at}: pool name {:?} is not DNS subdomains joined by '/' (≤253)", p.name));
        }
        if (&p.name, p.generation, &spec.driver) != (&pool.name, pool.generation, &first.spec.driver) {
            problems.push(format!(
                "{at}: pool {}/{} generation {} differs from the first slice's {}/{} generation {}",
                spec.driver, p.name, p.generation, first.spec.driver, pool.name, pool.generation
            ));
        }
        if p.generation < 0 {
            problems.push(format!("{at}: pool generation {} is negative", p.generation));
        }
        if p.resource_slice_count != slices.len() as i64 {
            problems.push(format!(
                "{at}: resourceSliceCount is {}, but the pool has {} slices",
                p.resource_slice_count,
                slices.len()
            ));
        }
        let selectors = [
            spec.node_name.is_some(),
            spec.node_selector.is_some(),
            spec.all_nodes.is_some(),
            spec.per_device_node_selection.is_some(),
        ];
        if selectors.iter().filter(|s| **s).count() != 1 {
            problems.push(format!(
                "{at}: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection must be set"
            ));
        }

        let sets = spec.shared_counters.as_deref().unwrap_or_default();
        let devices = spec.devices.as_deref().unwrap_or_default();
        match layout {
            Layout::Split => {
                if spec.shared_counters.is_some() && spec.devices.is_some() {
                    problems.push(format!("{at}: only one of sharedCounters or devices is allowed (1.35+)"));
                }
                if sets.len() > MAX_COUNTER_SETS {
                    problems.push(format!("{at}: {} counter sets, more than {MAX_COUNTER_SETS}", sets.len()));
                }
            }
            Layout::Combined => {
                let n: usize = sets.iter().map(|c| c.counters.len()).sum();
                if n > COMBINED_MAX_SHARED_COUNTERS {
                    problems.push(format!(
                        "{at}: {n} counters across its counter sets, more than {COMBINED_MAX_SHARED_COUNTERS}"
                    ));
                }
                let consumed: usize =
                    devices.iter().flat_map(|d| d.consumes_counters.iter().flatten()).map(|c| c.counters.len()).sum();
                if consumed > COMBINED_MAX_CONSUMED_COUNTERS {
                    problems.push(format!(
                        "{at}: its devices consume {consumed} counters, more than {COMBINED_MAX_CONSUMED_COUNTERS}"
                    ));
                }
            }
        }
        for c in sets {
            let set_at = format!("{at}: counter set {:?}", c.name);
            if !is_dns_label(&c.name) {
                problems.push(format!("{set_at}: name is not a DNS label"));
            }
            check_counters(&set_at, &c.counters, &mut problems);
            if c.counters.len() > MAX_COUNTERS_PER_SET {
                problems.push(format!("{set_at}: {} counters, more than {MAX_COUNTERS_PER_SET}", c.counters.len()));
            }
            if let Some((j, _)) = set_home.insert(&c.name, (i, c)) {
                problems.push(format!("{set_at}: also defined in slice {}", label(j, &slices[j])));
            }
        }
        let advanced = devices.iter().any(|d| d.consumes_counters.is_some() || d.taints.is_some());
        let max = layout.max_devices(advanced);
        if devices.len() > max {
            let when = if max < MAX_DEVICES { " when any device consumes counters or has taints" } else { "" };
            problems.push(format!("{at}: {} devices, more than {max}{when}", devices.len()));
        }
        for d in devices {
            check_device(&at, d, layout, &mut problems);
            if let Some(j) = device_home.insert(&d.name, i) {
                problems.push(format!("{at}: device {:?} is also in slice {}", d.name, label(j, &slices[j])));
            }
        }
    }

    // Counter references, once every set of the pool is known.
    for (i, s) in slices.iter().enumerate() {
        let at = format!("slice {}", label(i, s));
        for d in s.spec.devices.iter().flatten() {
            for c in d.consumes_counters.iter().flatten() {
                let here = format!("{at}: device {:?}", d.name);
                let Some(&(j, set)) = set_home.get(c.counter_set.as_str()) else {
                    problems.push(format!(
                        "{here}: consumes counter set {:?}, which the pool does not define",
                        c.counter_set
                    ));
                    continue;
                };
                if layout == Layout::Combined && j != i {
                    problems.push(format!(
                        "{here}: consumes counter set {:?} of slice {}; before 1.35 a device may \
                         consume only sets of its own slice",
                        c.counter_set,
                        label(j, &slices[j])
                    ));
                }
                for k in c.counters.keys().filter(|k| !set.counters.contains_key(*k)) {
                    problems
                        .push(format!("{here}: consumes counter {k:?}, which set {:?} does not have", c.counter_set));
                }
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::super::build;
    use super::super::tests::{DRIVER, NODE, node, node_wide};
    use super::*;
    use crate::mig::devices::GpuMode;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn broken_slices_yield_one_message_per_violation() {
        // Split: a device slice of 65 counter-consuming devices and a 33-character attribute key.
        let gpus = node_wide(&[("h100-80gb", 3, GpuMode::Dynamic)]);
        let mut split = build(DRIVER, NODE, None, 1, Layout::Split, &gpus).unwrap();
        let moved: Vec<api::Device> = split[1].spec.devices.as_mut().unwrap().drain(..13).collect();
        split[0].spec.devices.as_mut().unwrap().extend(moved);
        let long = "a".repeat(33);
        let d0 = &mut split[0].spec.devices.as_mut().unwrap()[0];
        d0.attributes
            .as_mut()
            .unwrap()
            .insert(long.clone(), api::DeviceAttribute { int: Some(1), ..Default::default() });
        let problems = validate(&split, Layout::Split);
        let s0 = "slice node-a-mig-slinky-slurm-net-00000";
        assert_eq!(
            problems,
            [
                format!("{s0}: 65 devices, more than 64 when any device consumes counters or has taints"),
                format!("{s0}: device \"gpu-100\": attribute \"{long}\": \"{long}\" has 33 characters, more than 32"),
            ]
        );

        // Combined: a device of GPU 2 moved into the slice of GPUs 0 and 1.
        let mut combined = build(DRIVER, NODE, None, 1, Layout::Combined, &gpus).unwrap();
        assert_eq!(combined.len(), 2);
        let d = combined[1].spec.devices.as_mut().unwrap().remove(5);
        let name = d.name.clone();
        combined[0].spec.devices.as_mut().unwrap().push(d);
        let problems = validate(&combined, Layout::Combined);
        assert_eq!(
            problems,
            [format!(
                "{s0}: device {name:?}: consumes counter set \"gpu-102-counters\" of slice \
                 node-a-mig-slinky-slurm-net-00001; before 1.35 a device may consume only sets of \
                 its own slice"
            )]
        );

        // Split layout rules on Combined slices, and pool-wide rules.
        let mut wrong = build(DRIVER, NODE, None, 1, Layout::Combined, &gpus).unwrap();
        wrong[1].spec.pool.generation = 2;
        let dup = wrong[0].spec.devices.as_ref().unwrap()[0].clone();
        wrong[1].spec.devices.as_mut().unwrap().push(dup);
        let problems = validate(&wrong, Layout::Split);
        assert!(problems.iter().any(|p| p.contains("only one of sharedCounters or devices")), "{problems:#?}");
        assert!(problems.iter().any(|p| p.contains("generation 2 differs")), "{problems:#?}");
        assert!(problems.iter().any(|p| p.contains("\"gpu-100\" is also in slice")), "{problems:#?}");
    }

    #[test]
    fn names_and_values_follow_the_api_formats() {
        for good in ["580.95.5", "9.0.0", "1.0.0-rc.1+build.5"] {
            assert!(is_semver(good), "{good}");
        }
        for bad in ["580.95.05", "9.0", "1.0.0-", "v1.0.0"] {
            assert!(!is_semver(bad), "{bad}");
        }

        let mut slices =
            build(DRIVER, "node-a", None, 1, Layout::Split, &node(&[("a30-24gb", 1, GpuMode::Dynamic)])).unwrap();
        let d = &mut slices[0].spec.devices.as_mut().unwrap()[0];
        d.attributes
            .as_mut()
            .unwrap()
            .insert("productName".into(), api::DeviceAttribute { string: Some("x".repeat(65)), ..Default::default() });
        d.name = "GPU_0".into();
        let sets = slices[1].spec.shared_counters.as_mut().unwrap();
        sets[0].counters.insert("memorySlice9".into(), api::Counter { value: Quantity("1".into()) });
        let problems = validate(&slices, Layout::Split);
        assert!(problems.iter().any(|p| p.contains("\"GPU_0\": name is not a DNS label")), "{problems:#?}");
        assert!(problems.iter().any(|p| p.contains("string value has 65 characters")), "{problems:#?}");
        assert!(
            problems.iter().any(|p| p.contains("counter name \"memorySlice9\" is not a DNS label")),
            "{problems:#?}"
        );
    }
}
