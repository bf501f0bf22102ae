#!/usr/bin/env bash
# Builds the two images a test node needs besides migdra's, without a registry: the pod sandbox
# (hack/node/pause.c, static) and a small workload image (Debian's busybox-static, every applet
# linked in /bin; its default command waits for SIGTERM, so a pod of it runs until deleted).
# buildah (vfs storage under the output directory) writes each as an OCI archive whose reference
# is fully qualified, so `ctr -n k8s.io images import` stores the name the kubelet asks for.
#
# Usage: hack/node-images.sh OUT_DIR     Prints: the two archives' paths, pause first.
# Needs: buildah, a C compiler with a static libc (libc6-dev), busybox-static.
set -euo pipefail
hack=$(cd "$(dirname "$0")" && pwd)
me=node-images
die() { echo "$me: $*" >&2; exit 1; }

out=${1:?usage: hack/node-images.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
pause_ref=migdra.test/pause:1
workload_ref=migdra.test/busybox:1
[[ -x /bin/busybox ]] && /bin/busybox --list >/dev/null 2>&1 || die "needs Debian's busybox-static (/bin/busybox)"
command -v buildah >/dev/null || die "needs buildah"
storage=(--root "$out/storage" --runroot "$out/run" --storage-driver vfs)
b() { command buildah "${storage[@]}" "$@"; }

rootfs=$out/rootfs
rm -rf "$rootfs" && mkdir -p "$rootfs/pause" "$rootfs/busybox/bin" "$rootfs/busybox/tmp"
cc -static -O2 -o "$rootfs/pause/pause" "$hack/node/pause.c" || die "cc -static failed (needs libc6-dev)"
strip "$rootfs/pause/pause"
cp /bin/busybox "$rootfs/busybox/bin/busybox"
for applet in $(/bin/busybox --list); do
	[[ $applet == busybox ]] || ln -s busybox "$rootfs/busybox/bin/$applet"
done
chmod 1777 "$rootfs/busybox/tmp"

# image NAME REF DIR ENTRYPOINT: one layer from DIR, written to OUT/NAME.oci.tar.
image() {
	local name=$1 ref=$2 dir=$3 entrypoint=$4 ctr
	ctr=$(b from scratch)
	b copy "$ctr" "$dir" / >/dev/null
	b config --entrypoint "$entrypoint" --cmd '[]' --env PATH=/bin "$ctr"
	b commit --quiet --format oci "$ctr" "$ref" >/dev/null
	b rm "$ctr" >/dev/null
	rm -f "$out/$name.oci.tar"
	b push --quiet "$ref" "oci-archive:$out/$name.oci.tar:$ref"
	echo "$out/$name.oci.tar"
}
b rm --all >/dev/null 2>&1 || true
image pause "$pause_ref" "$rootfs/pause" '["/pause"]'
image busybox "$workload_ref" "$rootfs/busybox" \
	"[\"/bin/sh\", \"-c\", \"trap 'exit 0' TERM; while :; do sleep 1; done\"]"
