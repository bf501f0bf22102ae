#!/usr/bin/env bash
# The image's release build of `migdra` for one architecture, from this machine: natively for the
# machine's own, cross-compiled for the other (never an emulated compiler). Both image builds run
# it: daemonset/image/Dockerfile's build stage (docker buildx, once per --platform) and
# hack/build-image.sh. The locked dependencies and the release profile are the same for both
# architectures; both builds share one target directory, so what runs on the build machine
# (build scripts, proc macros) is compiled once.
#
# Cross-compiling needs the Rust target and a C cross compiler (ring's C and assembly): both are
# installed here when missing (rustup, Debian's gcc-<triple>).
#
# Usage: hack/release-build.sh ARCH OUT   ARCH: amd64 or arm64 (Docker's and Debian's names);
#        OUT: where the stripped binary is written. An empty ARCH means this machine's.
# Environment: CARGO_TARGET_DIR (default target/).
set -euo pipefail
me=release-build
die() { echo "$me: $*" >&2; exit 1; }
log() { echo "$me: $*" >&2; }

# docker build without BuildKit sets no TARGETARCH.
arch=${1:-$(dpkg --print-architecture)}
out=${2:?usage: hack/release-build.sh amd64|arm64 OUT}
case $arch in
amd64) triple=x86_64-unknown-linux-gnu gnu=x86_64-linux-gnu ;;
arm64) triple=aarch64-unknown-linux-gnu gnu=aarch64-linux-gnu ;;
*) die "architecture '$arch' is not built; use amd64 or arm64" ;;
esac
host=$(uname -m)-linux-gnu
strip=strip
if [[ $gnu != "$host" ]]; then
	if ! rustup target list --installed | grep -qx "$triple"; then
		log "rustup target add $triple"
		rustup target add "$triple" >&2
	fi
	if ! command -v "$gnu-gcc" >/dev/null; then
		# Debian's package name has dashes only: gcc-x86-64-linux-gnu, gcc-aarch64-linux-gnu.
		package=gcc-${gnu//_/-}
		log "installing Debian's $package (the C cross compiler ring needs)"
		apt-get install -y -qq "$package" >/dev/null 2>&1 ||
			{ apt-get update -qq && apt-get install -y -qq "$package" >/dev/null; }
	fi
	upper=${triple^^}
	export "CARGO_TARGET_${upper//-/_}_LINKER=$gnu-gcc"
	export "CC_${triple//-/_}=$gnu-gcc"
	export "AR_${triple//-/_}=$gnu-ar"
	strip=$gnu-strip
fi
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
start=$SECONDS
CARGO_TARGET_DIR=$target cargo build --locked --release --bin migdra --target "$triple" >&2
bin=$target/$triple/release/migdra
mkdir -p "$(dirname "$out")"
"$strip" --strip-debug -o "$out" "$bin"
log "$arch ($triple): built in $((SECONDS - start))s; $(stat -c %s "$bin") bytes, $(stat -c %s "$out") stripped"
