//! PCI addresses in the one form Kubernetes' standard attributes and Slurm's maps compare:
//! `0000:3b:00.0` (4-digit domain, lowercase), whatever form NVML, lspci or a person wrote.

/// `00000000:3B:00.0`, `0000:3b:00.0` and `3b:00.0` → `0000:3b:00.0`.
pub fn bus_id(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, devfn) = match parts.as_slice() {
        [d, b, f] => (*d, *b, *f),
        [b, f] => ("0", *b, *f),
        _ => return None,
    };
    let (dev, func) = devfn.split_once('.')?;
    let hex = |x: &str, max: u32| u32::from_str_radix(x, 16).ok().filter(|v| *v <= max && !x.is_empty());
    let domain = hex(domain, 0xffff)?;
    Some(format!("{domain:04x}:{:02x}:{:02x}.{:x}", hex(bus, 0xff)?, hex(dev, 0x1f)?, hex(func, 0x7)?))
}

/// The form Kubernetes' standard attribute `resource.kubernetes.io/pciBusID` requires (and the
/// claim's `parentPCIBusID`, so the two compare equal); an address that does not parse is kept as
/// it was given, so nothing is lost.
pub fn standard(s: &str) -> String {
    bus_id(s).unwrap_or_else(|| s.to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn forms() {
        assert_eq!(super::bus_id("00000000:3B:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(super::bus_id("0001:c1:1f.7").as_deref(), Some("0001:c1:1f.7"));
        assert_eq!(super::bus_id("3b:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(super::bus_id("3b:00"), None);
        assert_eq!(super::bus_id("zz:00.0"), None);
        assert_eq!(super::standard("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(super::standard("not-an-address"), "not-an-address");
    }
}
