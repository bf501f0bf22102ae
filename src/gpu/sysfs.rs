//! Where a PCI device sits on the host, read from sysfs as Kubernetes' standard-attribute helpers
//! read it (`k8s.io/dynamic-resource-allocation/deviceattribute`): the PCIe root complex is the
//! first directory under `devices/` that `bus/pci/devices/<address>` links into, and the NUMA
//! node is that directory's `numa_node` (-1: none). Nothing here fails: what cannot be read is
//! unknown, and its attribute is left out.

use crate::mig::devices::Topology;
use std::path::Path;

/// The topology of the PCI device at `bus_id` (any form NVML or lspci prints) under `sysfs`
/// (`/sys` on a node).
pub fn topology(sysfs: &Path, bus_id: &str) -> Topology {
    let Some(address) = crate::pci::bus_id(bus_id) else {
        return Topology::default();
    };
    let link = sysfs.join("bus/pci/devices").join(&address);
    Topology { pcie_root: pcie_root(&link, &address), numa_node: numa_node(&link) }
}

/// `pci0000:15` from a link such as `../../../devices/pci0000:15/0000:15:01.0/0000:18:00.0`.
fn pcie_root(link: &Path, address: &str) -> Option<String> {
    let target = std::fs::read_link(link).ok()?;
    let parts: Vec<String> = target.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let at = parts.iter().position(|p| p == "devices")?;
    let root = parts.get(at + 1).filter(|r| r.starts_with("pci"))?;
    (parts.last().map(String::as_str) == Some(address)).then(|| root.clone())
}

fn numa_node(link: &Path) -> Option<u32> {
    std::fs::read_to_string(link.join("numa_node")).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysfs with one GPU at 0000:18:00.0 under root complex pci0000:15 on NUMA node `numa`.
    fn sysfs(numa: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let device = root.path().join("devices/pci0000:15/0000:15:01.0/0000:18:00.0");
        std::fs::create_dir_all(&device).unwrap();
        std::fs::write(device.join("numa_node"), format!("{numa}\n")).unwrap();
        std::fs::create_dir_all(root.path().join("bus/pci/devices")).unwrap();
        let link = root.path().join("bus/pci/devices/0000:18:00.0");
        std::os::unix::fs::symlink("../../../devices/pci0000:15/0000:15:01.0/0000:18:00.0", link).unwrap();
        root
    }

    #[test]
    fn reads_the_root_complex_and_the_numa_node_in_any_bus_id_form() {
        let root = sysfs("1");
        for form in ["00000000:18:00.0", "0000:18:00.0", "18:00.0"] {
            let t = topology(root.path(), form);
            assert_eq!(t, Topology { pcie_root: Some("pci0000:15".into()), numa_node: Some(1) }, "{form}");
        }
    }

    #[test]
    fn what_the_kernel_does_not_say_is_unknown() {
        let root = sysfs("-1");
        assert_eq!(topology(root.path(), "0000:18:00.0").numa_node, None, "-1 is no node");
        assert_eq!(topology(root.path(), "0000:19:00.0"), Topology::default(), "no such device");
        assert_eq!(topology(root.path(), "not a bus id"), Topology::default());
        assert_eq!(topology(Path::new("/nonexistent"), "0000:18:00.0"), Topology::default());
    }
}
