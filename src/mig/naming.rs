//! DRA device names: the name alone decodes to (parent GPU, profile, placement).
//!
//! Full GPU: `gpu-<minor>`. MIG partition:
//! `gpu-<parentMinor>-mig-<profile without '.' and '+'>-<profileId>-<placementStart>`,
//! e.g. `gpu-0-mig-3g40gb-9-4`. Static and dynamic MIG share the scheme, so a name means the
//! same partition in both modes. Names are DNS labels (≤ 63 characters, `[a-z0-9-]`).
//!
//! With `--device-names slurm` ([`NameStyle::Slurm`]), whole GPUs and static MIG instances that
//! Slurm lists carry their Slurm index in front, zero-padded to [`SLURM_INDEX_DIGITS`] digits:
//! `0003-gpu-1`, `0012-gpu-10-mig-1g10gb-19-6`. slurm-bridge's inventory numbers a profile's
//! devices by sorting their names as plain strings (docs/facts/slurm-bridge.md §1.5), so these
//! names sort in Slurm index order. The prefix starts with a digit so that it sorts before every
//! plain name (`gpu-…`): a device Slurm does not list keeps its plain name and takes a position
//! after all the ones it does list. The prefix is advisory: the rest of the name alone says which
//! partition it is, and prepare checks the prefix against the GPU's actual Slurm index.

use thiserror::Error;

/// A decoded device name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceName {
    /// A whole GPU.
    Gpu { minor: u32 },
    /// A MIG partition of the GPU with this minor.
    Mig { parent_minor: u32, profile_slug: String, profile_id: u32, start: u32 },
}

/// Why a string is not a migdra device name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "invalid device name {name:?}: {reason}; expected [NNNN-]gpu-<minor> or \
     [NNNN-]gpu-<minor>-mig-<profile>-<profileId>-<start> (NNNN: a {SLURM_INDEX_DIGITS}-digit \
     Slurm index), e.g. gpu-0-mig-3g40gb-9-4 or 0003-gpu-1"
)]
pub struct NameError {
    pub name: String,
    pub reason: &'static str,
}

/// Longest device name: a DNS label.
pub const MAX_NAME_LEN: usize = crate::names::MAX_LABEL_LEN;

/// Digits of the Slurm index prefix. Slurm numbers GRES per node; even 16 GPUs each split into
/// 7 static instances need only 3, so 4 leaves room for any node while the names stay short.
pub const SLURM_INDEX_DIGITS: usize = 4;
/// The largest Slurm index a prefix can carry; a larger one leaves the name plain.
pub const MAX_SLURM_INDEX: u32 = 9999;

/// How published device names are formed (`--device-names`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum NameStyle {
    /// `gpu-<minor>…` everywhere, as before the flag existed.
    #[default]
    Minor,
    /// Whole GPUs and static MIG instances that Slurm lists carry their Slurm index in front.
    Slurm,
}

/// A device name as published: the partition it means, and the Slurm index it sorts by when
/// [`NameStyle::Slurm`] put one in front. Every name migdra reads back (allocations, CDI specs,
/// the checkpoint) is decoded here, so both forms are accepted everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublishedName {
    /// The prefix, as written in the name; advisory, checked by prepare.
    pub slurm_index: Option<u32>,
    pub device: DeviceName,
}

impl PublishedName {
    /// The name `style` gives `device`, whose Slurm index (the GPU's for a whole GPU, the
    /// instance's for a static MIG instance) is `slurm_index`. No index, or one above
    /// [`MAX_SLURM_INDEX`], leaves the name plain. Callers pass `None` for dynamic MIG partitions:
    /// their names must not change when an instance comes or goes.
    pub fn new(style: NameStyle, device: DeviceName, slurm_index: Option<u32>) -> Self {
        let slurm_index = match style {
            NameStyle::Minor => None,
            NameStyle::Slurm => slurm_index.filter(|i| *i <= MAX_SLURM_INDEX),
        };
        Self { slurm_index, device }
    }

    /// Decode a published name, with or without the Slurm index prefix.
    ///
    /// # Errors
    /// Anything that `to_string` would not produce.
    pub fn parse(name: &str) -> Result<Self, NameError> {
        let err = |reason| NameError { name: name.to_string(), reason };
        if name.len() > MAX_NAME_LEN {
            return Err(err("longer than 63 characters"));
        }
        if !name.starts_with(|c: char| c.is_ascii_digit()) {
            return Ok(Self { slurm_index: None, device: DeviceName::parse_plain(name, name)? });
        }
        let digits = name.bytes().take_while(u8::is_ascii_digit).count();
        if digits != SLURM_INDEX_DIGITS {
            return Err(err("a Slurm index prefix must be exactly 4 digits"));
        }
        let rest = name[digits..].strip_prefix('-').ok_or_else(|| err("the Slurm index prefix must end with -"))?;
        let index = name[..digits].parse().map_err(|_| err("the Slurm index prefix is not a number"))?;
        Ok(Self { slurm_index: Some(index), device: DeviceName::parse_plain(rest, name)? })
    }
}

/// Whether two published names mean the same partition, whatever their prefixes; names that do
/// not decode are the same only when equal.
pub fn same_partition(a: &str, b: &str) -> bool {
    match (DeviceName::parse(a), DeviceName::parse(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

impl std::fmt::Display for PublishedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.slurm_index {
            Some(i) => write!(f, "{i:0width$}-{}", self.device, width = SLURM_INDEX_DIGITS),
            None => write!(f, "{}", self.device),
        }
    }
}

/// The profile as it appears in names: lower case, without `.` and `+`, only `[a-z0-9-]`.
pub fn profile_slug(profile_name: &str) -> String {
    let slug: String = profile_name
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
        .collect();
    slug.trim_matches('-').to_string()
}

impl DeviceName {
    /// The name of a MIG partition.
    pub fn mig(parent_minor: u32, profile_name: &str, profile_id: u32, start: u32) -> Self {
        Self::Mig { parent_minor, profile_slug: profile_slug(profile_name), profile_id, start }
    }

    /// The parent GPU's minor.
    pub fn minor(&self) -> u32 {
        match self {
            Self::Gpu { minor } => *minor,
            Self::Mig { parent_minor, .. } => *parent_minor,
        }
    }

    /// Decode a device name, with or without the Slurm index prefix; the prefix is dropped.
    /// Callers that must check it use [`PublishedName::parse`].
    ///
    /// # Errors
    /// Anything that [`PublishedName`]'s `to_string` would not produce.
    pub fn parse(name: &str) -> Result<Self, NameError> {
        PublishedName::parse(name).map(|n| n.device)
    }

    /// Decode `name`, the part of `whole` after any prefix; errors name `whole`.
    fn parse_plain(name: &str, whole: &str) -> Result<Self, NameError> {
        let err = |reason| NameError { name: whole.to_string(), reason };
        let rest = name.strip_prefix("gpu-").ok_or_else(|| err("it does not start with gpu-"))?;
        let Some((minor, mig)) = rest.split_once("-mig-") else {
            return Ok(Self::Gpu { minor: number(rest).ok_or_else(|| err("the GPU minor is not a number"))? });
        };
        let parent_minor = number(minor).ok_or_else(|| err("the GPU minor is not a number"))?;
        let mut parts = mig.rsplitn(3, '-');
        let start = parts.next().and_then(number).ok_or_else(|| err("the placement start is not a number"))?;
        let profile_id = parts.next().and_then(number).ok_or_else(|| err("the profile ID is not a number"))?;
        let slug = parts.next().unwrap_or_default();
        if slug.is_empty() || slug != profile_slug(slug) {
            return Err(err("the profile part must be lower-case letters, digits and inner dashes"));
        }
        Ok(Self::Mig { parent_minor, profile_slug: slug.to_string(), profile_id, start })
    }
}

impl std::fmt::Display for DeviceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Gpu { minor } => write!(f, "gpu-{minor}"),
            Self::Mig { parent_minor, profile_slug, profile_id, start } => {
                write!(f, "gpu-{parent_minor}-mig-{profile_slug}-{profile_id}-{start}")
            }
        }
    }
}

/// A decimal number without sign or leading zeros, so that decoding is lossless.
fn number(s: &str) -> Option<u32> {
    let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if ok { s.parse().ok() } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog::models;

    #[test]
    fn names_follow_the_contract() {
        assert_eq!(DeviceName::mig(0, "3g.40gb", 9, 4).to_string(), "gpu-0-mig-3g40gb-9-4");
        assert_eq!(DeviceName::mig(12, "1g.10gb+me", 20, 6).to_string(), "gpu-12-mig-1g10gbme-20-6");
        assert_eq!(DeviceName::mig(1, "1g.24gb-me", 67, 9).to_string(), "gpu-1-mig-1g24gb-me-67-9");
        assert_eq!(DeviceName::Gpu { minor: 3 }.to_string(), "gpu-3");
    }

    #[test]
    fn every_catalog_device_name_round_trips_and_is_a_dns_label() {
        for model in models() {
            for p in &model.profiles {
                for &start in &p.placements {
                    for minor in [0, 7, 31, 255] {
                        let name = DeviceName::mig(minor, &p.name, p.id, start);
                        let text = name.to_string();
                        assert!(crate::names::is_dns_label(&text), "{text}");
                        assert_eq!(DeviceName::parse(&text), Ok(name), "{text}");
                    }
                }
            }
        }
    }

    #[test]
    fn malformed_names_are_refused_with_the_reason() {
        for bad in [
            "",
            "gpu",
            "gpu-",
            "gpu-01",
            "gpu--1",
            "gpu-x",
            "GPU-0",
            "gpu-0-mig-",
            "gpu-0-mig-3g40gb-9",
            "gpu-0-mig-3g40gb-9-x",
            "gpu-0-mig-3g40gb-09-4",
            "gpu-0-mig--9-4",
            "gpu-0-mig-3G40gb-9-4",
            "gpu-0-mig-3g.40gb-9-4",
            "gpu-0-mig-3g40gb--9-4",
            "gpu-0-mig-3g40gb-9-4-",
            "gpu-4294967296",
        ] {
            let err = DeviceName::parse(bad).expect_err(bad);
            assert!(err.to_string().contains("expected [NNNN-]gpu-<minor>"), "{err}");
        }
        let long = format!("gpu-0-mig-{}-9-4", "a".repeat(60));
        assert!(DeviceName::parse(&long).is_err());
    }

    fn slurm(device: DeviceName, index: u32) -> String {
        PublishedName::new(NameStyle::Slurm, device, Some(index)).to_string()
    }

    #[test]
    fn slurm_names_carry_the_zero_padded_index_in_front() {
        assert_eq!(slurm(DeviceName::Gpu { minor: 1 }, 3), "0003-gpu-1");
        assert_eq!(slurm(DeviceName::mig(10, "1g.10gb", 19, 6), 12), "0012-gpu-10-mig-1g10gb-19-6");
        assert_eq!(slurm(DeviceName::Gpu { minor: 0 }, MAX_SLURM_INDEX), "9999-gpu-0");
        // Minor style, no index, or one too wide for the prefix: the plain name.
        let gpu = DeviceName::Gpu { minor: 4 };
        assert_eq!(PublishedName::new(NameStyle::Minor, gpu.clone(), Some(3)).to_string(), "gpu-4");
        assert_eq!(PublishedName::new(NameStyle::Slurm, gpu.clone(), None).to_string(), "gpu-4");
        assert_eq!(PublishedName::new(NameStyle::Slurm, gpu, Some(MAX_SLURM_INDEX + 1)).to_string(), "gpu-4");
        assert_eq!(SLURM_INDEX_DIGITS, MAX_SLURM_INDEX.to_string().len());
    }

    #[test]
    fn both_forms_decode_to_the_same_partition() {
        for device in [DeviceName::Gpu { minor: 7 }, DeviceName::mig(7, "3g.40gb", 9, 4)] {
            let plain = PublishedName::parse(&device.to_string()).unwrap();
            assert_eq!(plain, PublishedName { slurm_index: None, device: device.clone() });
            let prefixed = PublishedName::parse(&slurm(device.clone(), 42)).unwrap();
            assert_eq!(prefixed, PublishedName { slurm_index: Some(42), device: device.clone() });
            assert_eq!(DeviceName::parse(&slurm(device.clone(), 42)), Ok(device));
        }
    }

    #[test]
    fn the_same_partition_under_either_name_is_the_same() {
        assert!(same_partition("gpu-1", "0003-gpu-1"));
        assert!(same_partition("0002-gpu-1", "0003-gpu-1"));
        assert!(same_partition("gpu-1-mig-3g40gb-9-4", "0007-gpu-1-mig-3g40gb-9-4"));
        assert!(!same_partition("gpu-1", "0001-gpu-10"));
        assert!(!same_partition("gpu-1-mig-3g40gb-9-4", "gpu-1-mig-3g40gb-9-0"));
        assert!(same_partition("x", "x") && !same_partition("x", "y"));
    }

    /// slurm-bridge sorts names as plain strings and takes the position as the Slurm index.
    fn string_order(names: &[String]) -> Vec<String> {
        let mut sorted = names.to_vec();
        sorted.sort();
        sorted
    }

    #[test]
    fn sixteen_gpus_whose_minors_differ_from_slurm_order_sort_in_slurm_order() {
        // Slurm index i is the GPU with minor (i * 7) % 16: no two neighbours in minor order.
        let minor_of = |i: u32| (i * 7) % 16;
        let by_index: Vec<String> = (0..16).map(|i| slurm(DeviceName::Gpu { minor: minor_of(i) }, i)).collect();
        let mut shuffled = by_index.clone();
        shuffled.reverse();
        assert_eq!(string_order(&shuffled), by_index);
        // The plain names do not: gpu-10 sorts before gpu-2, and minors are not Slurm's order.
        let plain: Vec<String> = (0..16).map(|i| DeviceName::Gpu { minor: minor_of(i) }.to_string()).collect();
        assert_ne!(string_order(&plain), plain);
    }

    #[test]
    fn padding_keeps_order_past_ten_and_a_hundred() {
        let names: Vec<String> =
            [0, 1, 2, 9, 10, 11, 99, 100, 101, 999, 1000, 9999].map(|i| slurm(DeviceName::Gpu { minor: 0 }, i)).into();
        assert_eq!(string_order(&names), names);
        assert_eq!(names[4], "0010-gpu-0");
    }

    #[test]
    fn plain_names_sort_after_every_prefixed_name() {
        let mut names =
            ["gpu-0".to_string(), slurm(DeviceName::Gpu { minor: 5 }, 9999), "gpu-0-mig-1g10gb-19-0".into()];
        names.sort();
        assert_eq!(names[0], "9999-gpu-5");
    }

    #[test]
    fn static_instances_of_twelve_gpus_sort_by_slurm_index() {
        // Slurm lists instances by parent minor, then capability minors, which need not follow the
        // placement; the plain names sort gpu-10 before gpu-2 and by placement. The prefix decides.
        let mut want = Vec::new();
        let mut index = 0;
        for minor in 0..12 {
            for start in [6, 0, 4] {
                want.push(slurm(DeviceName::mig(minor, "1g.10gb", 19, start), index));
                index += 1;
            }
        }
        assert_eq!(string_order(&want), want);
    }

    #[test]
    fn bad_prefixes_are_refused_in_one_line_naming_the_name() {
        for (bad, why) in [
            ("3-gpu-1", "exactly 4 digits"),
            ("003-gpu-1", "exactly 4 digits"),
            ("00003-gpu-1", "exactly 4 digits"),
            ("0003gpu-1", "must end with -"),
            ("0003", "must end with -"),
            ("0003-", "does not start with gpu-"),
            ("0003--gpu-1", "does not start with gpu-"),
            ("0003-0003-gpu-1", "does not start with gpu-"),
            ("0003-gpu-01", "the GPU minor is not a number"),
            ("0003-gpu-1-mig-3g40gb-9", "the profile ID is not a number"),
            ("0003-GPU-1", "does not start with gpu-"),
        ] {
            let err = PublishedName::parse(bad).expect_err(bad).to_string();
            assert!(err.starts_with(&format!("invalid device name {bad:?}: ")), "{err}");
            assert!(err.contains(why), "{bad}: {err}");
            assert!(err.contains("e.g. gpu-0-mig-3g40gb-9-4 or 0003-gpu-1"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
        let long = format!("0001-gpu-0-mig-{}-9-4", "a".repeat(50));
        assert!(PublishedName::parse(&long).unwrap_err().to_string().contains("longer than 63"));
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics_and_valid_names_re_encode(s in "\\PC{0,80}") {
            if let Ok(name) = PublishedName::parse(&s) {
                proptest::prop_assert_eq!(name.to_string(), s);
            }
        }

        #[test]
        fn prefixed_names_never_panic_and_re_encode(s in "[0-9]{0,6}-?(gpu-)?[0-9a-z-]{0,30}") {
            if let Ok(name) = PublishedName::parse(&s) {
                proptest::prop_assert_eq!(name.to_string(), s);
            }
        }

        #[test]
        fn prefixed_names_round_trip(
            index in 0u32..=MAX_SLURM_INDEX,
            minor in 0u32..100_000,
            id in 0u32..1000,
            start in 0u32..64,
        ) {
            for device in [DeviceName::Gpu { minor }, DeviceName::mig(minor, "3g.40gb", id, start)] {
                let name = PublishedName::new(NameStyle::Slurm, device.clone(), Some(index));
                let text = name.to_string();
                proptest::prop_assert!(crate::names::is_dns_label(&text), "{}", text);
                proptest::prop_assert_eq!(PublishedName::parse(&text), Ok(name));
                proptest::prop_assert_eq!(DeviceName::parse(&text), Ok(device));
            }
        }

        #[test]
        fn generated_names_round_trip(
            minor in 0u32..100_000,
            slug in "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?",
            id in 0u32..1000,
            start in 0u32..64,
        ) {
            let name = DeviceName::Mig { parent_minor: minor, profile_slug: slug, profile_id: id, start };
            proptest::prop_assert_eq!(DeviceName::parse(&name.to_string()), Ok(name));
        }
    }
}
