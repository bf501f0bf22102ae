#!/usr/bin/env bash
# Builds migdra's image for amd64 and arm64 without a Docker daemon, as daemonset/image/Dockerfile
# describes it, and checks each:
#   1. the Dockerfile's build stage: its COPY lines are copied, alone, into a fresh directory and
#      its RUN (hack/release-build.sh) runs there once per architecture, arm64 cross-compiled; a
#      missing path fails here, as it would fail `docker build`. The target directory is shared,
#      so what was built before is reused; these are CI's only release builds
#      (hack/check-release.sh checks their binaries);
#   2. each base: hack/image-rootfs.sh, the same script the Dockerfile runs, per architecture;
#   3. buildah (Debian's; vfs storage and chroot isolation, under target/image) assembles each
#      image from scratch with the Dockerfile's ENTRYPOINT and CMD; the amd64 image is written
#      as an OCI archive (what tests/node/ imports);
#   4. a container of each runs `migdra --version` and `migdra demo --fast` (which starts
#      `migdra serve` as its child), so no library is missing; arm64 runs under qemu-user
#      (Debian's qemu-user-static, registered with binfmt_misc here when it is not: that
#      registration is the kernel's, for the whole machine). Each size is printed beside the
#      40 MB goal;
#   5. once both images are in the storage (from this run or an earlier one), the OCI image index
#      of the two is written, and each architecture taken from it is checked to be that one.
#
# Usage: hack/build-image.sh [ARCH...]   ARCH: amd64, arm64 (default: both). As root; installs
#        buildah, the cross compiler and qemu-user with apt-get when missing. Two runs must not
#        overlap (one image storage).
#        hack/build-image.sh --archive prints where the amd64 archive is written, building nothing
#        (.ci/run names it for the tests before its background build is done).
# Prints: the index's path when written, then the amd64 archive's path, when built, last.
# Environment: CARGO_TARGET_DIR (default target/); MIGDRA_IMAGE_DIR (default
#        $CARGO_TARGET_DIR/image): the image storage, the archives and each architecture's files.
set -euo pipefail
cd "$(dirname "$0")/.."
me=build-image
die() { echo "$me: $*" >&2; exit 1; }
log() { echo "$me: $*" >&2; }

dockerfile=daemonset/image/Dockerfile
build_cmd='bash hack/release-build.sh "$TARGETARCH" /out/migdra'
goal_bytes=$((40 * 1000 * 1000))
all=(amd64 arm64)
print_archive=false
[[ ${1:-} == --archive ]] && { print_archive=true; shift; }
arches=("${@:-${all[@]}}")
for arch in "${arches[@]}"; do
	[[ " ${all[*]} " == *" $arch "* ]] || die "architecture '$arch' is not built; use ${all[*]}"
done
native=$(dpkg --print-architecture)
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
out=$(realpath -m "${MIGDRA_IMAGE_DIR:-$target/image}")
version=$(awk -F'"' '/^version = / { print $2; exit }' Cargo.toml)
name=migdra:$version
archive=$out/migdra-$version.oci.tar
index=$out/migdra-$version.index.oci.tar
if $print_archive; then
	echo "$archive"
	exit 0
fi

# The build stage: the lines between the first FROM and the next.
stage=$(awk '/^FROM / { n++ } n == 1' "$dockerfile")
grep -qxF "RUN $build_cmd" <<<"$stage" || die "$dockerfile's build stage does not RUN '$build_cmd'"

# 1. Only what the build stage copies, laid out as COPY lays it out.
context=$out/context
rm -rf "$context" && mkdir -p "$context"
copied=()
while read -r _ args; do
	read -ra words <<<"$args"
	[[ ${#words[@]} -ge 2 ]] || die "$dockerfile: 'COPY $args' needs a source and a destination"
	dest=${words[-1]}
	unset 'words[-1]'
	for src in "${words[@]}"; do
		[[ $src != -* && $src != *[*?]* ]] || die "$dockerfile: 'COPY $args': flags and wildcards are not supported here"
		[[ -e $src ]] || die "$dockerfile copies $src, which is not in the repository"
		if [[ $dest == */ ]]; then to=$context/$dest$(basename "$src")
		else
			[[ ${#words[@]} -eq 1 ]] || die "$dockerfile: 'COPY $args': several sources need a destination ending in /"
			to=$context/$dest
		fi
		mkdir -p "$(dirname "$to")"
		cp -a "$src" "$to"
		copied+=("$src")
	done
done < <(grep '^COPY ' <<<"$stage")
log "the build stage copies: ${copied[*]}"
for arch in "${arches[@]}"; do
	start=$SECONDS
	if ! (cd "$context" && CARGO_TARGET_DIR=$target bash hack/release-build.sh "$arch" "$out/$arch/migdra"); then
		die "'$build_cmd' for $arch fails with only the files $dockerfile copies (${copied[*]}): add what is missing to its COPY lines"
	fi
	log "$arch release build from the Dockerfile's files: $((SECONDS - start))s"
done

# 2. The bases.
for arch in "${arches[@]}"; do
	rootfs=$out/$arch/rootfs
	rm -rf "$rootfs"
	if ! bash hack/image-rootfs.sh "$rootfs" "$arch" 2>/dev/null; then
		rm -rf "$rootfs"
		apt-get update -qq
		bash hack/image-rootfs.sh "$rootfs" "$arch"
	fi
done

# 3. The images, and the amd64 archive.
if ! command -v buildah >/dev/null; then
	log "installing Debian's buildah"
	apt-get install -y -qq buildah >/dev/null
fi
storage=(--root "$out/storage" --runroot "$out/run" --storage-driver vfs)
buildah() { command buildah "${storage[@]}" "$@"; }
field() { awk -v k="$1" '$1 == k { $1 = ""; sub(/^ /, ""); print }' <<<"$(awk '/^FROM / { n++ } n == 3' "$dockerfile")"; }
entrypoint=$(field ENTRYPOINT)
cmd=$(field CMD)
env=$(field ENV)
[[ $entrypoint == '['* && $cmd == '['* ]] || die "$dockerfile: the last stage needs ENTRYPOINT and CMD in JSON form"
[[ $env =~ ^PATH=[^[:space:]]+$ ]] || die "$dockerfile: the last stage needs one 'ENV PATH=...' line"
buildah rm --all >/dev/null 2>&1 || true
# What the checks below pulled from the archives last time, by the archives' name.
buildah rmi --force "docker.io/library/$name" >/dev/null 2>&1 || true
buildah rmi --prune >/dev/null 2>&1 || true
for arch in "${arches[@]}"; do
	buildah rmi --force "$name-$arch" >/dev/null 2>&1 || true
	ctr=$(buildah from --arch "$arch" scratch)
	buildah copy "$ctr" "$out/$arch/rootfs" / >/dev/null
	buildah copy --chmod 0755 "$ctr" "$out/$arch/migdra" /usr/bin/migdra >/dev/null
	buildah config --os linux --arch "$arch" --entrypoint "$entrypoint" --cmd "$cmd" --env "$env" \
		--label org.opencontainers.image.title=migdra --label "org.opencontainers.image.version=$version" "$ctr"
	buildah commit --quiet --format oci "$ctr" "$name-$arch" >/dev/null
	buildah rm "$ctr" >/dev/null
done
# The archives name the image fully, as the chart's `migdra:TAG` normalizes to: a container
# runtime that imports one (`ctr -n k8s.io images import`) then finds it without a registry.
if [[ " ${arches[*]} " == *" amd64 "* ]]; then
	rm -f "$archive"
	buildah push --quiet "$name-amd64" "oci-archive:$archive:docker.io/library/$name"
fi

# 4. What each image holds, run in a container: amd64's from its archive.
# Another architecture's binaries run under qemu-user through binfmt_misc.
emulate() {
	local qarch=$1
	[[ -e /proc/sys/fs/binfmt_misc/status ]] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc ||
		die "cannot mount binfmt_misc: $qarch binaries cannot run here"
	[[ -e /proc/sys/fs/binfmt_misc/qemu-$qarch ]] && return
	if [[ ! -e /usr/lib/binfmt.d/qemu-$qarch.conf ]]; then
		log "installing Debian's qemu-user-static"
		apt-get install -y -qq qemu-user-static >/dev/null 2>&1 ||
			{ apt-get update -qq && apt-get install -y -qq qemu-user-static >/dev/null; }
	fi
	log "registering qemu-$qarch with binfmt_misc (for the whole machine)"
	cat "/usr/lib/binfmt.d/qemu-$qarch.conf" >/proc/sys/fs/binfmt_misc/register
}
ctr=""
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
# Bounded, so that a hang inside the image fails CI instead of stalling it.
run() { timeout 600 "$(command -v buildah)" "${storage[@]}" run --isolation chroot "$ctr" -- "$@"; }
for arch in "${arches[@]}"; do
	case $arch in arm64) qarch=aarch64 ;; *) qarch=x86_64 ;; esac
	[[ $arch == "$native" ]] || emulate "$qarch"
	buildah rm "$ctr" >/dev/null 2>&1 || true
	if [[ $arch == amd64 ]]; then from=oci-archive:$archive; else from=$name-$arch; fi
	ctr=$(buildah from --quiet --arch "$arch" "$from")
	got=$(buildah inspect --format '{{.OCIv1.Architecture}}' "$ctr")
	[[ $got == "$arch" ]] || die "$from is a $got image, not $arch"
	# By name, as an operator's `kubectl exec POD -- migdra ...` runs it.
	got=$(run migdra --version) || die "'migdra --version' fails inside the $arch image"
	# The first line is the version; the second names the releases it was tested with.
	[[ ${got%%$'\n'*} == "migdra $version" ]] || die "'migdra --version' inside the $arch image says '$got', expected 'migdra $version' first"
	log "inside the $arch image: ${got%%$'\n'*}"
	demo_log=$out/$arch/demo.log
	start=$SECONDS
	if ! run migdra demo --fast >"$demo_log" 2>&1; then
		tail -n 20 "$demo_log" >&2
		die "'migdra demo --fast' fails inside the $arch image (log: $demo_log)"
	fi
	log "inside the $arch image$([[ $arch == "$native" ]] || echo " (qemu-$qarch)"): migdra demo --fast passed in $((SECONDS - start))s ($(wc -l <"$demo_log") lines, $demo_log)"
	log "$arch config: $(buildah inspect --type image --format 'entrypoint {{.OCIv1.Config.Entrypoint}}, cmd {{.OCIv1.Config.Cmd}}, env {{.OCIv1.Config.Env}}' "$name-$arch")"
	# What the one layer holds: the base and the binary (the container may have written /tmp).
	size=$(($(du -sb "$out/$arch/rootfs" | cut -f1) + $(stat -c %s "$out/$arch/migdra")))
	log "$arch image size: $size bytes uncompressed (goal <= $goal_bytes)"
	((size <= goal_bytes)) || die "the $arch image is $size bytes uncompressed, over the $goal_bytes goal"
done

# 5. The index of both, once both are built.
have=()
for arch in "${all[@]}"; do
	buildah inspect --type image "$name-$arch" >/dev/null 2>&1 && have+=("$arch")
done
if [[ ${#have[@]} -eq ${#all[@]} ]]; then
	buildah manifest rm "$name-index" >/dev/null 2>&1 || true
	buildah manifest create "$name-index" >/dev/null
	for arch in "${all[@]}"; do
		buildah manifest add "$name-index" "containers-storage:localhost/$name-$arch" >/dev/null
	done
	rm -f "$index"
	buildah manifest push --quiet --all "$name-index" "oci-archive:$index:docker.io/library/$name" >/dev/null
	for arch in "${all[@]}"; do
		buildah rm "$ctr" >/dev/null 2>&1 || true
		ctr=$(buildah from --quiet --arch "$arch" "oci-archive:$index")
		got=$(buildah inspect --format '{{.OCIv1.Architecture}} {{.FromImageDigest}}' "$ctr")
		[[ ${got%% *} == "$arch" ]] || die "the index $index gives a ${got%% *} image for $arch"
		log "the index gives $arch: ${got#* }"
	done
	log "the index $index: ${all[*]}, $(stat -c %s "$index") bytes"
	echo "$index"
else
	log "no index: only ${have[*]} built so far (run with the others too)"
fi
if [[ " ${arches[*]} " == *" amd64 "* ]]; then echo "$archive"; fi
