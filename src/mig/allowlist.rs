//! The operator's profile allowlist (`--profiles`): which MIG profiles dynamic GPUs publish.
//!
//! Every published partition costs the scheduler a check in every pass, and clusters use a few
//! profiles (mig-parted layouts name two or three), so publishing only those is the cheapest way
//! to make a MIG pod cheap to schedule. One list serves a mixed fleet: a name only some models
//! have applies where it exists.

use super::catalog::{self, GiProfile, GpuModel};

/// Profile names to publish; empty means all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist(Vec<String>);

/// The allowlist does not fit this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowlistError {
    #[error("--profiles: {name:?} is not a MIG profile of any known GPU; known: {known}")]
    Unknown { name: String, known: String },
    #[error(
        "--profiles: GPU {index} ({model}) has none of {listed}, so it would publish no partition; \
         its profiles: {valid}"
    )]
    NoneOnGpu { index: u32, model: String, listed: String, valid: String },
}

impl Allowlist {
    /// Every profile.
    pub fn all() -> Self {
        Self::default()
    }

    /// The names as given, blanks dropped; checked against the node by [`Self::check`].
    pub fn new<S: AsRef<str>>(names: &[S]) -> Self {
        Self(names.iter().map(|n| n.as_ref().trim().to_string()).filter(|n| !n.is_empty()).collect())
    }

    pub fn is_all(&self) -> bool {
        self.0.is_empty()
    }

    /// This list and `more` too (nothing to add to "all").
    pub fn including<S: AsRef<str>>(&self, more: &[S]) -> Self {
        if self.is_all() {
            return self.clone();
        }
        let mut names = self.0.clone();
        for m in more.iter().map(AsRef::as_ref) {
            if !names.iter().any(|n| n == m) {
                names.push(m.to_string());
            }
        }
        Self(names)
    }

    pub fn allows(&self, profile: &GiProfile) -> bool {
        self.is_all() || self.0.contains(&profile.name)
    }

    /// Each name must be a profile of the catalog or of one of `gpus` (models NVML described),
    /// and each GPU in `gpus` (index, model) must keep at least one profile.
    ///
    /// # Errors
    /// The first name nothing knows, or the first GPU left without partitions.
    pub fn check<'a>(&self, gpus: impl IntoIterator<Item = (u32, &'a GpuModel)> + Clone) -> Result<(), AllowlistError> {
        if self.is_all() {
            return Ok(());
        }
        let known = |name: &str| {
            let has = |m: &GpuModel| m.profiles.iter().any(|p| p.name == name);
            catalog::models().iter().any(has) || gpus.clone().into_iter().any(|(_, m)| has(m))
        };
        if let Some(name) = self.0.iter().find(|n| !known(n)) {
            let mut all: Vec<&str> =
                catalog::models().iter().flat_map(|m| m.profiles.iter().map(|p| p.name.as_str())).collect();
            all.sort_unstable();
            all.dedup();
            return Err(AllowlistError::Unknown { name: name.clone(), known: all.join(", ") });
        }
        for (index, model) in gpus {
            if !model.profiles.iter().any(|p| self.allows(p)) {
                return Err(AllowlistError::NoneOnGpu {
                    index,
                    model: model.product_name.clone(),
                    listed: self.0.join(","),
                    valid: model.profile_names(),
                });
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Allowlist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_all() { f.write_str("all") } else { f.write_str(&self.0.join(",")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog::model;

    #[test]
    fn empty_allows_everything_and_a_list_only_its_names() {
        let h100 = model("h100-80gb").unwrap();
        assert!(h100.profiles.iter().all(|p| Allowlist::all().allows(p)));
        let list = Allowlist::new(&["1g.10gb", " 3g.40gb ", ""]);
        let mut kept: Vec<&str> = h100.profiles.iter().filter(|p| list.allows(p)).map(|p| p.name.as_str()).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["1g.10gb", "3g.40gb"]);
        assert_eq!(list.to_string(), "1g.10gb,3g.40gb");
    }

    #[test]
    fn a_mixed_fleet_list_applies_where_each_name_exists() {
        let (h100, h200) = (model("h100-80gb").unwrap(), model("h200-141gb").unwrap());
        let list = Allowlist::new(&["1g.10gb", "1g.18gb"]);
        assert!(list.check([(0, h100), (1, h200)]).is_ok());
    }

    #[test]
    fn unknown_names_and_gpus_left_empty_are_refused_in_one_line() {
        let h100 = model("h100-80gb").unwrap();
        let e = Allowlist::new(&["1g.10gb", "1g.11gb"]).check([(0, h100)]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("\"1g.11gb\"") && msg.contains("1g.10gb+me") && !msg.contains('\n'), "{msg}");
        let e = Allowlist::new(&["1g.18gb"]).check([(3, h100)]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("GPU 3") && msg.contains("1g.18gb") && msg.contains("7g.80gb"), "{msg}");
    }

    #[test]
    fn including_adds_each_name_once_and_all_stays_all() {
        let list = Allowlist::new(&["1g.10gb"]);
        assert_eq!(list.including(&["3g.40gb", "1g.10gb", "3g.40gb"]), Allowlist::new(&["1g.10gb", "3g.40gb"]));
        assert!(Allowlist::all().including(&["3g.40gb"]).is_all());
    }
}
