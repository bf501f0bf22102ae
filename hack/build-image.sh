#!/usr/bin/env bash
# Builds migdra's image without a Docker daemon, as daemonset/image/Dockerfile describes it, and
# checks it:
#   1. the Dockerfile's build stage: its COPY lines are copied, alone, into a fresh directory and
#      `cargo build --locked --release --bin migdra` runs there; a missing path fails here, as it
#      would fail `docker build`. The target directory is shared, so dependencies built before
#      are reused and this is CI's only release build (hack/check-release.sh checks its binary);
#   2. the base: hack/image-rootfs.sh, the same script the Dockerfile runs;
#   3. buildah (Debian's; vfs storage and chroot isolation, under target/image) assembles the
#      image from scratch with the Dockerfile's ENTRYPOINT and CMD, and writes an OCI archive;
#   4. a container from that archive runs `migdra --version` and `migdra demo --fast`, so no
#      library is missing; the image's size is printed beside the 40 MB goal.
#
# Usage: hack/build-image.sh      (as root; installs buildah with apt-get when missing)
# Prints: the archive's path on its last line.
# Environment: CARGO_TARGET_DIR (default target/).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
me=build-image
die() { echo "$me: $*" >&2; exit 1; }
log() { echo "$me: $*" >&2; }

dockerfile=daemonset/image/Dockerfile
build_cmd="cargo build --locked --release --bin migdra"
goal_bytes=$((40 * 1000 * 1000))
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
out=$target/image
version=$(awk -F'"' '/^version = / { print $2; exit }' Cargo.toml)
name=migdra:$version
archive=$out/migdra-$version.oci.tar

# The build stage: the lines between the first FROM and the next.
stage=$(awk '/^FROM / { n++ } n == 1' "$dockerfile")
grep -q "^RUN $build_cmd" <<<"$stage" || die "$dockerfile's build stage does not RUN '$build_cmd'"

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
start=$SECONDS
if ! (cd "$context" && CARGO_TARGET_DIR=$target $build_cmd); then
	die "'$build_cmd' fails with only the files $dockerfile copies (${copied[*]}): add what is missing to its COPY lines"
fi
log "release build from the Dockerfile's files: $((SECONDS - start))s"
bin=$target/release/migdra
stripped=$out/migdra
strip --strip-debug -o "$stripped" "$bin"
log "binary: $(stat -c %s "$bin") bytes, $(stat -c %s "$stripped") without debug info"

# 2. The base.
rootfs=$out/rootfs
rm -rf "$rootfs"
if ! bash hack/image-rootfs.sh "$rootfs" 2>/dev/null; then
	apt-get update -qq
	bash hack/image-rootfs.sh "$rootfs"
fi

# 3. The image.
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
buildah rmi --all --force >/dev/null 2>&1 || true
ctr=$(buildah from scratch)
buildah copy "$ctr" "$rootfs" / >/dev/null
buildah copy --chmod 0755 "$ctr" "$stripped" /usr/bin/migdra >/dev/null
buildah config --entrypoint "$entrypoint" --cmd "$cmd" --env "$env" \
	--label org.opencontainers.image.title=migdra --label "org.opencontainers.image.version=$version" "$ctr"
buildah commit --quiet --format oci "$ctr" "$name" >/dev/null
buildah rm "$ctr" >/dev/null
rm -f "$archive"
# The archive names the image fully, as the chart's `migdra:TAG` normalizes to: a container
# runtime that imports it (`ctr -n k8s.io images import`) then finds it without a registry.
buildah push --quiet "$name" "oci-archive:$archive:docker.io/library/$name"

# 4. What the image holds, run from the archive.
ctr=$(buildah from --quiet "oci-archive:$archive")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
# Bounded, so that a hang inside the image fails CI instead of stalling it.
run() { timeout 300 "$(command -v buildah)" "${storage[@]}" run --isolation chroot "$ctr" -- "$@"; }
# By name, as an operator's `kubectl exec POD -- migdra ...` runs it.
got=$(run migdra --version) || die "'migdra --version' fails inside the image"
# The first line is the version; the second names the releases it was tested with.
[[ ${got%%$'\n'*} == "migdra $version" ]] || die "'migdra --version' inside the image says '$got', expected 'migdra $version' first"
log "inside the image: $got"
demo_log=$out/demo.log
if ! run migdra demo --fast >"$demo_log" 2>&1; then
	tail -n 20 "$demo_log" >&2
	die "'migdra demo --fast' fails inside the image (log: $demo_log)"
fi
log "inside the image: migdra demo --fast passed ($(wc -l <"$demo_log") lines, $demo_log)"
log "config: $(buildah inspect --type image --format 'entrypoint {{.OCIv1.Config.Entrypoint}}, cmd {{.OCIv1.Config.Cmd}}, env {{.OCIv1.Config.Env}}' "$name")"

# What the one layer holds: the base and the binary (the container above may have written /tmp).
size=$(($(du -sb "$rootfs" | cut -f1) + $(stat -c %s "$stripped")))
log "image size: $size bytes uncompressed (goal <= $goal_bytes), archive $(stat -c %s "$archive") bytes"
((size <= goal_bytes)) || die "the image is $size bytes uncompressed, over the $goal_bytes goal"
echo "$archive"
