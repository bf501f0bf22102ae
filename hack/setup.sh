#!/usr/bin/env bash
# What the tests need on a machine of this kind (Debian 12, root, with Rust and Go) that the
# machine does not ship: openssl (the control plane's certificates), buildah (the image without a
# Docker daemon), pkg-config and libseccomp-dev (runc's build, hack/build-node.sh), the CNI plugins
# and busybox-static (the real node's network and workload image), and Debian's Slurm 22.05 with
# munge running (hack/slurm-deps.sh). hack/test.sh (README's test command) and .ci/run both call
# it, so a fresh machine needs nothing else. Idempotent: it installs only what is missing, and a
# machine that has everything needs no root.
set -euo pipefail
cd "$(dirname "$0")/.."
me=hack/setup.sh

# Installed, not merely known to dpkg: a removed package keeps its config ("rc") and dpkg -s
# still answers for it.
installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]; }
missing=()
for tool in openssl:openssl buildah:buildah pkg-config:pkg-config; do
	command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
for package in libseccomp-dev containernetworking-plugins busybox-static; do
	installed "$package" || missing+=("$package")
done
if [[ ${#missing[@]} -gt 0 ]]; then
	if [[ $(id -u) -ne 0 ]]; then
		echo "$me: missing ${missing[*]}: run it as root, or apt-get install them" >&2
		exit 1
	fi
	echo "$me: installing ${missing[*]}" >&2
	# The package lists of a fresh machine may be empty or old: update once if the first try fails.
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi
if [[ $(id -u) -eq 0 ]]; then
	bash hack/slurm-deps.sh
elif ! command -v /usr/sbin/slurmd >/dev/null; then
	echo "$me: Debian's Slurm is missing (hack/slurm-deps.sh needs root): the Slurm tests will skip" >&2
fi
