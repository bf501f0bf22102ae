#!/usr/bin/env bash
# Stops what hack/node-up.sh started and waits until its node has removed everything it made.
set -euo pipefail
me=node-down
dir=${MIGDRA_NODE_UP_DIR:-/tmp/migdra-node-up}
[[ -e $dir/pid ]] || { echo "$me: nothing is up ($dir/pid missing)" >&2; exit 1; }
pid=$(cat "$dir/pid")
touch "$dir/stop"
for _ in $(seq 120); do
	kill -0 "$pid" 2>/dev/null || break
	sleep 1
done
if kill -0 "$pid" 2>/dev/null; then
	echo "$me: still running after 120 s (pid $pid, log $dir/log)" >&2
	exit 1
fi
tail -n 3 "$dir/log" >&2
grep -q 'test result: ok' "$dir/log" || { echo "$me: the node did not stop cleanly (log: $dir/log)" >&2; exit 1; }
rm -rf "$dir"
echo "$me: stopped; nothing left behind"
