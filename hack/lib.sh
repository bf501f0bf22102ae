# shellcheck shell=bash
# What the hack/build-*.sh scripts share, sourced after they set `me` (their name in messages).
# Each builds Go tools from pinned modules into a cache outside the repository, keyed by version.

die() { echo "$me: $*" >&2; exit 1; }
log() { echo "$me: $*" >&2; }

# enter_go_cache BIN WHAT PRINT CHECK...: when the command CHECK succeeds (the tools are in BIN),
# print PRINT and exit; otherwise take BIN's lock, so that two runs at once (a test run and CI)
# never build into the same place, check again, and set the environment of a pinned Go build.
enter_go_cache() {
	local bin=$1 what=$2 print=$3
	shift 3
	if "$@"; then
		log "$what: already in $bin"
		echo "$print"
		exit 0
	fi
	mkdir -p "$bin"
	if command -v flock >/dev/null; then
		exec 9>"$bin/.lock"
		flock 9
		if "$@"; then
			log "$what: already in $bin (built by another run)"
			echo "$print"
			exit 0
		fi
	fi
	export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
	export CGO_ENABLED=0
	# -mod=readonly: build exactly what go.mod and go.sum pin; fail rather than re-resolve.
	# -buildvcs=false: do not stamp this repository's git state into the binaries.
	export GOFLAGS="-mod=readonly -buildvcs=false"
	log "go: $(go version); GOTOOLCHAIN=$GOTOOLCHAIN"
}

# go_toolchain GO_MOD: the Go that builds a module: its `toolchain goX` line when it has one
# (1.38's modules need Go 1.27, which the go command fetches from the proxy; the project's own Go
# stays 1.26), else GOTOOLCHAIN as set, else the local Go.
go_toolchain() {
	local t
	t=$(awk '$1 == "toolchain" { print $2; exit }' "$1")
	echo "${t:-${GOTOOLCHAIN:-local}}"
}

# required_version GO_MOD MODULE: the version in GO_MOD's one-line `require MODULE vX`, the one
# place each tool's version is written; dies when there is no such line.
required_version() {
	local v
	v=$(awk -v m="$2" '$1 == "require" && $2 == m { print $3; exit }' "$1")
	[[ -n $v ]] || die "no 'require $2 vX' line in $1"
	echo "$v"
}
