#!/usr/bin/env bash
# The release binary, built exactly as daemonset/image builds it (release profile, default
# features), must not carry the recovery tests' crash hook: an environment variable
# (MIGDRA_CRASH_AT) must not be able to make a production daemon SIGKILL itself. The hook lives
# behind the `crash-points` feature; this builds without it and looks for the variable's name in
# the binary. With a test binary as the second argument (built with the feature), it first checks
# that the search finds the name there, so the check itself can fail.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
if [[ -n ${1:-} ]]; then
    if ! grep -aq MIGDRA_CRASH_AT "$1"; then
        echo "check-release: $1 (built with crash-points) has no MIGDRA_CRASH_AT either: the search is broken" >&2
        exit 1
    fi
fi
# MIGDRA_RELEASE_BIN: a release binary built already (hack/build-image.sh builds the image's from
# the Dockerfile's files), checked instead of building one here.
bin=${MIGDRA_RELEASE_BIN:-}
if [[ -z $bin ]]; then
    cargo build --release --locked --bin migdra
    bin=$target/release/migdra
fi
if grep -aq MIGDRA_CRASH_AT "$bin"; then
    echo "check-release: $bin contains MIGDRA_CRASH_AT: the crash hook is in the release build" >&2
    exit 1
fi
echo "check-release: $bin ($(stat -c %s "$bin") bytes) has no crash hook"
