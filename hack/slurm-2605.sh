#!/usr/bin/env bash
# Slurm 26.05, the release slurm-bridge users run, beside Debian 12's 22.05 (hack/slurm-deps.sh):
# Debian unstable's slurmctld, slurmd, slurmrestd, client and munge in a chroot made with
# debootstrap, cached outside the repo by Slurm's version. Debian 12 ships only 22.05, which has no
# external jobs and whose slurmrestd stops at OpenAPI v0.0.38.
#
# Prints, as its last line, a directory of wrappers (slurmctld, slurmd, slurmrestd, sbatch,
# scontrol, scancel, curl, run) that run the chroot's programs with the host's /proc, /dev, /sys and
# /tmp bound in a private mount namespace, so paths under /tmp mean the same inside and out and
# nothing stays mounted when they exit. `run CMD ARGS...` runs anything in the chroot. Starts the
# chroot's own munged (its own key and socket) if it does not answer. Idempotent; run as root.
set -euo pipefail

want=26.05
# The same cache as the hack/build-*.sh scripts.
cache=${MIGDRA_CACHE:-$HOME/.cache/migdra}
mirror=${MIGDRA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# slurm-wlm-jwt-plugin: auth_jwt.so, which slurm-bridge's REST client needs (AuthAltTypes=auth/jwt);
# Debian ships it apart from slurmctld, and without it that setting stops slurmctld.
pkgs=(slurmctld slurmd slurmrestd slurm-client slurm-wlm-jwt-plugin munge curl ca-certificates)
# The unprivileged user slurmd-less REST clients run as: slurmrestd refuses root and SlurmUser.
bridge_user=bridge

current=$(ls -d "$cache"/slurm-"$want".*-sid 2>/dev/null | sort -V | tail -n 1 || true)
if [[ -z $current || ! -e $current/.complete ]]; then
    started=$SECONDS
    command -v debootstrap >/dev/null || {
        apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
            { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
    }
    mkdir -p "$cache"
    tmp=$(mktemp -d "$cache/slurm-sid.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    root=$tmp/root
    echo "debootstrap sid into $root ($mirror)" >&2
    debootstrap --variant=minbase sid "$root" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
        { tail -n 20 "$tmp/debootstrap.log" >&2; exit 1; }
    # sid's Release file is often past its Valid-Until on the mirror; debootstrap does not check,
    # apt does.
    chroot "$root" apt-get -qq -o Acquire::Check-Valid-Until=false update
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends \
        -o Acquire::Check-Valid-Until=false "${pkgs[@]}" >"$tmp/apt.log" 2>&1 ||
        { tail -n 20 "$tmp/apt.log" >&2; exit 1; }
    chroot "$root" apt-get clean
    version=$(chroot "$root" dpkg-query -W -f '${Version}' slurmd)
    [[ $version == "$want".* ]] || { echo "sid has slurmd $version, not $want.x" >&2; exit 1; }
    chroot "$root" useradd --system --create-home "$bridge_user"
    dd if=/dev/urandom of="$root/etc/munge/munge.key" bs=1 count=1024 status=none
    chroot "$root" sh -c 'chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key'
    current=$cache/slurm-${version%%-*}-sid
    rm -rf "$current"
    mkdir -p "$current"
    mv "$root" "$current/root"
    echo "$version" >"$current/version"
    touch "$current/.complete"
    rm -rf "$tmp"
    trap - EXIT
    echo "Slurm $version in $current/root: made in $((SECONDS - started))s, $(du -sh "$current/root" | cut -f1)" >&2
fi
root=$current/root
bin=$current/bin

# A chroot made before the JWT plugin was on the list gets it now (a few seconds), not remade.
if ! chroot "$root" dpkg -s slurm-wlm-jwt-plugin >/dev/null 2>&1; then
    chroot "$root" apt-get -qq -o Acquire::Check-Valid-Until=false update
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends \
        -o Acquire::Check-Valid-Until=false slurm-wlm-jwt-plugin >/dev/null
    chroot "$root" apt-get clean
fi

# The wrappers, rewritten each time so a moved cache still works.
mkdir -p "$bin"
cat >"$bin/run" <<EOF
#!/bin/sh
# Run a program inside Slurm $(cat "$current/version")'s chroot, with the host's /proc, /dev, /sys
# and /tmp bound in a private mount namespace of its own.
exec unshare --mount --propagation private sh -c '
    for d in proc dev sys tmp; do mount --rbind "/\$d" "$root/\$d" || exit 1; done
    exec chroot "$root" "\$@"' run "\$@"
EOF
chmod +x "$bin/run"
for cmd in slurmctld slurmd slurmrestd munged; do
    printf '#!/bin/sh\nexec "%s/run" /usr/sbin/%s "$@"\n' "$bin" "$cmd" >"$bin/$cmd"
done
for cmd in sbatch scontrol scancel squeue sinfo munge unmunge curl runuser; do
    printf '#!/bin/sh\nexec "%s/run" %s "$@"\n' "$bin" "$cmd" >"$bin/$cmd"
done
chmod +x "$bin"/*

# The host's name resolves inside as outside (munged and slurmd look it up).
cp /etc/hosts "$root/etc/hosts"

# The chroot's munged: its own key, socket (/run/munge inside the chroot) and pid file.
if ! "$bin/run" sh -c 'munge -n | unmunge' >/dev/null 2>&1; then
    "$bin/run" sh -c 'mkdir -p /run/munge /var/lib/munge /var/log/munge &&
        chown munge:munge /run/munge /var/lib/munge /var/log/munge &&
        runuser -u munge -- /usr/sbin/munged'
    for _ in $(seq 50); do
        "$bin/run" sh -c 'munge -n | unmunge' >/dev/null 2>&1 && break
        sleep 0.1
    done
    "$bin/run" sh -c 'munge -n | unmunge' >/dev/null
fi
echo "$("$bin/slurmd" -V) (Debian sid $(cat "$current/version"), chroot $root)" >&2
echo "$bin"
