#!/usr/bin/env bash
# Runs every test. README's test command and .ci/run both call this, so they cannot drift.
# --show-output prints what passing tests report, e.g. the counter proof's sets per model.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked -- --show-output
