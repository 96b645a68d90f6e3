#!/bin/sh
# tools/if_cpu_has.sh FLAG... -- COMMAND [ARGS...]: runs COMMAND when /proc/cpuinfo lists every
# FLAG, else exits 77 (ctest's SKIP_RETURN_CODE for the Tools.probe_* tests).
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  grep -qw "$1" /proc/cpuinfo || { echo "skipped: this CPU lacks $1"; exit 77; }
  shift
done
[ "$1" = "--" ] || { echo "if_cpu_has.sh: usage: FLAG... -- COMMAND [ARGS...]" >&2; exit 2; }
shift
exec "$@"
