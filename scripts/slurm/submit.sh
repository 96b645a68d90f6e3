#!/usr/bin/env bash
# A sweep fanned out on a Slurm cluster: an array of N shard tasks (sweep.sbatch), then a job
# that waits for all of them (afterany) and merges them with the report (merge.sbatch).
#   scripts/slurm/submit.sh EXPERIMENT OUT N [sbatch options for the shard tasks...]
# e.g. scripts/slurm/submit.sh seq_len_scaling /shared/results/scaling 8 --cpus-per-task=16
# OUT must be on a file system every node sees; run from the repository root (build/attnlab
# built there, or ATTNLAB=path). Prints the two job ids.
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: scripts/slurm/submit.sh EXPERIMENT OUT N [sbatch options]" >&2
  exit 2
fi
exp="$1" out="$2" n="$3"
shift 3
if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then
  echo "submit: N '$n' is not allowed; allowed: an integer >= 1 (shard tasks)" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$(realpath "${ATTNLAB:-build/attnlab}")"
[[ -x "$bin" ]] || { echo "submit: $bin is not an executable; build first (scripts/lab build) or set ATTNLAB" >&2; exit 2; }
# A name in experiments/ resolves here, where the repository is.
[[ -f "$exp" ]] || exp="$(dirname "$bin")/../experiments/$exp.json"
exp="$(realpath "$exp")"
mkdir -p "$out"
out="$(realpath "$out")"
array="$(sbatch --parsable --array="0-$((n - 1))" --chdir="$out" "$@" "$here/sweep.sbatch" "$exp" "$out" "$bin")"
merge="$(sbatch --parsable --dependency="afterany:${array%%;*}" --chdir="$out" "$here/merge.sbatch" "$out" "$bin")"
echo "array job ${array%%;*} ($n shards), merge job ${merge%%;*}: results in $out/merged"
