#!/usr/bin/env bash
# expect_output.sh RC REGEX COMMAND [ARGS...]: the ctest check for a command's exit status AND its
# output. Runs COMMAND (stdout and stderr together, printed), passes when it exits RC and a line of
# the output matches the extended regular expression REGEX. ctest's PASS_REGULAR_EXPRESSION alone
# ignores the exit status, so a usage message that happens to contain the word, printed on a
# refused argument, passed as a success. Exit 77 (ctest's SKIP_RETURN_CODE, tools/if_cpu_has.sh's
# "this CPU cannot run it") passes through unless 77 is what is expected.
set -uo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: tests/checks/expect_output.sh RC REGEX COMMAND [ARGS...]" >&2
  exit 2
fi
want="$1" re="$2"
shift 2
out="$("$@" 2>&1)"
rc=$?
printf '%s\n' "$out"
if [[ "$rc" == 77 && "$want" != 77 ]]; then exit 77; fi
if [[ "$rc" != "$want" ]]; then
  echo "expect_output: '$*' exited $rc, want $want" >&2
  exit 1
fi
if ! grep -qE -- "$re" <<<"$out"; then
  echo "expect_output: no line of '$*' matches: $re" >&2
  exit 1
fi
