#!/usr/bin/env bash
# scripts/lab slurm-test: a real one-node Slurm cluster on this machine, a sweep fanned out on
# it and merged back. Installs Debian's slurm-wlm and munge (scripts/setup.sh slurm), starts
# munged, slurmctld and slurmd with a configuration of their own in a temporary folder (own
# ports and munge socket; nothing under /etc is changed), submits a small experiment as an
# array of 3 shard tasks plus the dependent merge + report job (submit.sh), waits, checks that
# the merged folder holds every planned point exactly once and the report exists, and stops
# the daemons it started (also on failure).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${ATTN_BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh" slurm
tmp="$(mktemp -d /tmp/attnlab-slurm.XXXXXX)"
chmod 755 "$tmp"
started=()
cleanup() {
  local rc=$?
  [[ -f "$tmp/slurm.conf" ]] && SLURM_CONF="$tmp/slurm.conf" scancel --user="$(id -un)" 2>/dev/null || true
  for pidfile in "$tmp/slurmd.pid" "$tmp/slurmctld.pid" "$tmp/munged.pid"; do
    [[ -f "$pidfile" ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 1
  if [[ $rc -ne 0 ]]; then
    echo "slurm-test failed; daemon logs:" >&2
    tail -n 30 "$tmp"/*.log >&2 2>/dev/null || true
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT

# munge: a daemon of our own (root needs --force), with our own socket.
munged --force --socket="$tmp/munge.socket" --pid-file="$tmp/munged.pid" --log-file="$tmp/munged.log" \
  --seed-file="$tmp/munged.seed"
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host="$(hostname -s)"
mem_mb="$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
mkdir -p "$tmp/state" "$tmp/spool"
cat >"$tmp/slurm.conf" <<CONF
ClusterName=attnlab-test
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge.socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
NodeName=$host CPUs=$(nproc) RealMemory=$mem_mb State=UNKNOWN
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$tmp/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 60); do
  state="$(sinfo -h -o %t 2>/dev/null || true)"
  [[ "$state" == idle ]] && break
  sleep 1
done
[[ "$state" == idle ]] || { echo "slurm-test: the node did not become idle (state '$state')" >&2; exit 1; }
echo "slurm-test: one-node cluster up ($host, $(nproc) CPUs): $(sinfo -h -o '%P %a %D %t')"

# The experiment: 2 kernels x 3 lengths = 6 points, in 3 shard tasks of 1 CPU each.
cat >"$tmp/tiny.json" <<'JSON'
{"description": "slurm-test: a small sweep fanned out on Slurm", "implementations": ["naive", "blocked"],
 "q_heads": 2, "q_len": [16, 32, 64], "head_dim": 16, "threads": 1, "repetitions": 1, "min_time_s": 0.001}
JSON
mapfile -t planned < <("$BUILD/attnlab" sweep --experiment "$tmp/tiny.json" --dry-run 2>&1 | awk 'NR > 1 {print $1}' | sort)
# An empty plan would match an empty merge: the dry run must list the 6 points.
((${#planned[@]} == 6)) || { echo "slurm-test: the dry run planned ${#planned[@]} points, not 6: ${planned[*]}" >&2; exit 1; }
cd "$ROOT"
ATTNLAB="$BUILD/attnlab" "$ROOT/scripts/slurm/submit.sh" "$tmp/tiny.json" "$tmp/out" 3 --cpus-per-task=1 --mem=1G
for _ in $(seq 300); do
  [[ -z "$(squeue -h 2>/dev/null)" ]] && break
  sleep 1
done
[[ -z "$(squeue -h)" ]] || { echo "slurm-test: jobs still queued after 300 s:" >&2; squeue >&2; exit 1; }
csv="$tmp/out/merged/results.csv"
[[ -f "$csv" ]] || { echo "slurm-test: no merged results ($csv)" >&2; cat "$tmp/out"/slurm-*.out >&2 || true; exit 1; }
mapfile -t merged < <(tail -n +2 "$csv" | cut -d, -f2 | sort)
if [[ "${planned[*]}" != "${merged[*]}" ]]; then
  echo "slurm-test: merged points differ from the plan" >&2
  echo "planned: ${planned[*]}" >&2
  echo "merged:  ${merged[*]}" >&2
  exit 1
fi
# Every merged point was measured: status ok (column "status" of results.csv), not failed or skipped.
not_ok="$(awk -F, 'NR == 1 {for (i = 1; i <= NF; i++) if ($i == "status") c = i; next} $c != "ok" {print $2 ": " $c}' "$csv")"
[[ -z "$not_ok" ]] || { echo "slurm-test: merged points not ok:" >&2; echo "$not_ok" >&2; exit 1; }
[[ -f "$tmp/out/merged/report.md" ]] || { echo "slurm-test: no report in the merged folder" >&2; exit 1; }
shards="$(ls -d "$tmp/out"/shard-* | wc -l)"
echo "slurm-test: $shards shard tasks merged: ${#merged[@]} points, each planned point exactly once, all ok; report written"
