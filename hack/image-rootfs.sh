#!/usr/bin/env bash
# Writes the root filesystem under migdra's binary in its image: Debian's libc6 and libgcc-s1,
# unpacked, nothing else. That is all the binary links against (`ldd` on the release build:
# libc, libm, libgcc_s and the loader). libnvidia-ml.so.1 is never in the image: migdra dlopens
# it from the host's driver root. No shell, no CA bundle: the probes are `migdra probe`, and in a
# pod the API client trusts the service account's ca.crt only.
#
# Both image builds call it: daemonset/image/Dockerfile in a Debian stage, and
# hack/build-image.sh (buildah, no Docker daemon) on this Debian host, so both bases are the same
# packages of the same Debian release.
#
# Another architecture's base (arm64 on an amd64 machine) is the same packages of that
# architecture: its dpkg architecture is added, and the package lists updated, when missing.
#
# Usage: hack/image-rootfs.sh DIR [ARCH]   DIR must not exist; ARCH: amd64 or arm64 (default:
#        this machine's). Needs apt-get with package lists.
set -euo pipefail
me=image-rootfs
die() { echo "$me: $*" >&2; exit 1; }

dir=${1:?usage: hack/image-rootfs.sh DIR [amd64|arm64]}
arch=${2:-$(dpkg --print-architecture)}
[[ ! -e $dir ]] || die "$dir exists; give a new directory"
case $arch in
amd64) gnu=x86_64-linux-gnu loader=lib64/ld-linux-x86-64.so.2 ;;
arm64) gnu=aarch64-linux-gnu loader=lib/ld-linux-aarch64.so.1 ;;
*) die "architecture '$arch' has no base here; use amd64 or arm64" ;;
esac
if [[ $arch != "$(dpkg --print-architecture)" ]] && ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
	echo "$me: adding the dpkg architecture $arch" >&2
	dpkg --add-architecture "$arch"
	apt-get update -qq
fi
packages=(libc6:"$arch" libgcc-s1:"$arch")

debs=$(mktemp -d)
trap 'rm -rf "$debs"' EXIT
# apt's sandbox user cannot write to a root-owned temporary directory.
chmod 0755 "$debs"
(cd "$debs" && apt-get download -q "${packages[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) ||
	die "apt-get download ${packages[*]} failed (run apt-get update first?)"
mkdir -p "$dir"
for deb in "$debs"/*.deb; do
	dpkg-deb -x "$deb" "$dir"
	echo "$me: $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) $(dpkg-deb -f "$deb" Architecture)" >&2
done
# iconv's converters (8 MB) serve nothing migdra calls; documentation is not read in a container.
rm -rf "$dir/usr/lib/$gnu/gconv" "$dir/usr/share"
# `migdra demo` and anything else writing temporary files.
mkdir -p "$dir/tmp" && chmod 1777 "$dir/tmp"
[[ -e $dir/$loader ]] || die "no loader at $loader in $dir: not an $arch libc6?"
echo "$me: $dir ($arch), $(du -sk "$dir" | cut -f1) KiB" >&2
