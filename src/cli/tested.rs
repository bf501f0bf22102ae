//! The releases of migdra's peers that CI runs every test against, in one place: `migdra
//! --version` prints them, and tests/library/docs.rs fails when a document names a release that is not
//! here or when this list drifts from the pins in hack/.

macro_rules! releases {
    (kubernetes: [$k:literal $(, $ks:literal)*], slurm: [$s:literal $(, $ss:literal)*],
     containerd: $c:literal, runc: $r:literal) => {
        /// Kubernetes, newest first: full control planes and the kubelet's own code
        /// (`hack/controlplane-<minor>`, `hack/kubelet-<minor>`). The newest release (the second
        /// when the first is a pre-release) runs every test; a pre-release the control-plane
        /// tests, the kubelet code and the chart on the real node (its kubelet binary) again;
        /// an older release the control-plane tests and the kubelet code again.
        pub const KUBERNETES: &[&str] = &[$k $(, $ks)*];
        /// Slurm, newest first: 26.05 from Debian unstable (`hack/slurm-2605.sh`), every test;
        /// 22.05 from Debian 12 (`hack/slurm-deps.sh`), the Slurm tests again.
        pub const SLURM: &[&str] = &[$s $(, $ss)*];
        /// The real node's container runtime (`hack/build-node.sh`).
        pub const CONTAINERD: &str = $c;
        pub const RUNC: &str = $r;
        /// `migdra --version`: the version, then what it was tested with.
        pub const LONG_VERSION: &str = concat!(
            env!("CARGO_PKG_VERSION"),
            "\ntested with Kubernetes ", $k $(, ", ", $ks)*,
            "; Slurm ", $s $(, ", ", $ss)*,
            "; containerd ", $c, ", runc ", $r
        );
    };
}

releases!(
    kubernetes: ["1.38.0-beta.0", "1.37.2", "1.36.3"],
    slurm: ["26.05.5", "22.05.8"],
    containerd: "2.4.2",
    runc: "1.5.3"
);

#[cfg(test)]
mod tests {
    #[test]
    fn the_long_version_names_every_release() {
        for r in super::KUBERNETES.iter().chain(super::SLURM).chain([&super::CONTAINERD, &super::RUNC]) {
            assert!(super::LONG_VERSION.contains(r), "{r}");
        }
    }
}
