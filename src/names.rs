//! Kubernetes' name rules, as the API server applies them (apimachinery's `IsDNS1123Label`,
//! `IsDNS1123Subdomain`, `IsQualifiedName`), and the UID form migdra accepts. Everything that
//! names an object, a device, a counter or a file by a claim UID checks it here, so a name that
//! passes one check cannot fail another.

/// Characters of a DNS label (device names, counter names, namespaces).
pub const MAX_LABEL_LEN: usize = 63;
/// Characters of a DNS subdomain (object names, pool names).
pub const MAX_SUBDOMAIN_LEN: usize = 253;
/// Characters of the domain part of a qualified name.
pub const MAX_DOMAIN_LEN: usize = 63;
/// Characters of the identifier part of a qualified name.
pub const MAX_ID_LEN: usize = 32;

/// A DNS label (RFC 1123): 1 to 63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL_LEN
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS subdomain (RFC 1123): at most 253 characters of dot-separated parts of `[a-z0-9-]`, each
/// starting and ending alphanumeric. Kubernetes sets no 63-character limit on a part.
pub fn is_dns_subdomain(s: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !p.starts_with('-')
            && !p.ends_with('-')
    };
    !s.is_empty() && s.len() <= MAX_SUBDOMAIN_LEN && s.split('.').all(part)
}

/// Why `key` is not a qualified name (attribute and capacity keys): a C identifier of at most 32
/// characters, optionally behind a DNS subdomain of at most 63 characters and a `/`.
pub fn qualified_name_problem(key: &str) -> Option<String> {
    let (domain, id) = match key.split_once('/') {
        Some((d, i)) => (Some(d), i),
        None => (None, key),
    };
    if let Some(d) = domain {
        if d.len() > MAX_DOMAIN_LEN {
            return Some(format!("domain {d:?} has {} characters, more than {MAX_DOMAIN_LEN}", d.len()));
        }
        if !is_dns_subdomain(d) {
            return Some(format!("domain {d:?} is not a DNS subdomain"));
        }
    }
    if !is_c_identifier(id) {
        return Some(format!("{id:?} is not a C identifier"));
    }
    if id.len() > MAX_ID_LEN {
        return Some(format!("{id:?} has {} characters, more than {MAX_ID_LEN}", id.len()));
    }
    None
}

/// Why `name` is not an extended resource name as the API server accepts one (core's
/// `IsExtendedResourceName`): `<domain>/<name>` outside `kubernetes.io`, not starting with
/// `requests.`, and still a qualified name once the quota prefix `requests.` is put before it.
pub fn extended_resource_name_problem(name: &str) -> Option<String> {
    let Some((domain, id)) = name.split_once('/') else {
        return Some("it has no domain (expected <domain>/<name>, e.g. nvidia.com/mig-1g.10gb)".into());
    };
    if name.contains("kubernetes.io/") {
        return Some("the kubernetes.io domains are Kubernetes' own resources".into());
    }
    if name.starts_with("requests.") {
        return Some("names starting with requests. are quota names".into());
    }
    let quota_domain = format!("requests.{domain}");
    if !is_dns_subdomain(&quota_domain) {
        return Some(format!("domain {domain:?} is not a DNS subdomain"));
    }
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    let inner = id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if id.len() > MAX_LABEL_LEN || !inner || !edge(id.bytes().next()) || !edge(id.bytes().last()) {
        return Some(format!(
            "{id:?} must be 1 to {MAX_LABEL_LEN} of [A-Za-z0-9-_.], starting and ending alphanumeric"
        ));
    }
    None
}

/// A Kubernetes UID as migdra accepts it: 1 to 64 of `[a-z0-9-]`. UIDs are RFC 4122 strings;
/// the check is what keeps one safe inside a file name.
pub fn is_uid(uid: &str) -> bool {
    (1..=64).contains(&uid.len()) && uid.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn is_c_identifier(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_') && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// FNV-1a, 64 bits: a stable hash without a dependency, for checksums and for shortening names
/// that would be too long.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for good in ["a", "gpu-0", "0a", &"a".repeat(63)] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn subdomains() {
        assert!(is_dns_subdomain("node-a.example.com"));
        assert!(is_dns_subdomain(&["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61)].join(".")));
        assert!(is_dns_subdomain(&"a".repeat(64)), "apimachinery limits the whole name, not a part");
        for bad in ["", "node_a", "a..b", ".a", "a.", &"a.".repeat(127)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn qualified_names() {
        assert!(qualified_name_problem("resource.kubernetes.io/pciBusID").is_none());
        assert!(qualified_name_problem("slurmGpuIndex").is_none());
        assert!(qualified_name_problem("_x").is_none());
        assert!(qualified_name_problem("copy-engines").is_some());
        assert!(qualified_name_problem("Bad_Domain/x").is_some());
        assert!(qualified_name_problem(&format!("{}/x", "a".repeat(64))).is_some());
        assert!(qualified_name_problem(&"a".repeat(33)).is_some());
    }

    #[test]
    fn extended_resource_names() {
        for good in ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.24gb.me.all", "example.com/a_b"] {
            assert_eq!(extended_resource_name_problem(good), None, "{good}");
        }
        for bad in [
            "gpu",
            "nvidia.com/mig-1g.10gb+me",
            "kubernetes.io/gpu",
            "deviceclass.resource.kubernetes.io/mig",
            "requests.nvidia.com/gpu",
            "Nvidia_com/gpu",
            "nvidia.com/-gpu",
            "nvidia.com/",
            &format!("nvidia.com/{}", "a".repeat(64)),
        ] {
            assert!(extended_resource_name_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn uids() {
        assert!(is_uid("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"));
        for bad in ["", "../etc", "UID", "a/b", &"a".repeat(65)] {
            assert!(!is_uid(bad), "{bad}");
        }
    }

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
