#!/usr/bin/env bash
# What tests/slurm.rs needs: Debian's Slurm (slurmctld, slurmd, client) and munge, with munged
# running. Idempotent; run as root. The test starts its own slurmctld and slurmd on free ports.
set -euo pipefail
if ! command -v /usr/sbin/slurmd >/dev/null || ! command -v /usr/sbin/slurmctld >/dev/null || ! command -v sbatch >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi
if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n | unmunge >/dev/null
/usr/sbin/slurmd -V
