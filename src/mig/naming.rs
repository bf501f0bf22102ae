//! DRA device names: the name alone decodes to (parent GPU, profile, placement).
//!
//! Full GPU: `gpu-<minor>`. MIG partition:
//! `gpu-<parentMinor>-mig-<profile without '.' and '+'>-<profileId>-<placementStart>`,
//! e.g. `gpu-0-mig-3g40gb-9-4`. Static and dynamic MIG share the scheme, so a name means the
//! same partition in both modes. Names are DNS labels (≤ 63 characters, `[a-z0-9-]`).

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
    "invalid device name {name:?}: {reason}; expected gpu-<minor> or gpu-<minor>-mig-<profile>-<profileId>-<start>, e.g. gpu-0-mig-3g40gb-9-4"
)]
pub struct NameError {
    pub name: String,
    pub reason: &'static str,
}

/// Longest device name: a DNS label.
pub const MAX_NAME_LEN: usize = crate::names::MAX_LABEL_LEN;

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

    /// Decode a device name.
    ///
    /// # Errors
    /// Anything that `to_string` would not produce.
    pub fn parse(name: &str) -> Result<Self, NameError> {
        let err = |reason| NameError { name: name.to_string(), reason };
        if name.len() > MAX_NAME_LEN {
            return Err(err("longer than 63 characters"));
        }
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
            assert!(err.to_string().contains("expected gpu-<minor>"), "{err}");
        }
        let long = format!("gpu-0-mig-{}-9-4", "a".repeat(60));
        assert!(DeviceName::parse(&long).is_err());
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics_and_valid_names_re_encode(s in "\\PC{0,80}") {
            if let Ok(name) = DeviceName::parse(&s) {
                proptest::prop_assert_eq!(name.to_string(), s);
            }
        }

        #[test]
        fn generated_names_round_trip(minor in 0u32..100_000, slug in "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", id in 0u32..1000, start in 0u32..64) {
            let name = DeviceName::Mig { parent_minor: minor, profile_slug: slug, profile_id: id, start };
            proptest::prop_assert_eq!(DeviceName::parse(&name.to_string()), Ok(name));
        }
    }
}
