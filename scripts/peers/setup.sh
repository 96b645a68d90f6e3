#!/usr/bin/env bash
# The peers' virtual environment (.venv-peers, ignored by git): Debian's python3 -m venv, then
# pinned wheels from PyPI. Nothing else in the lab depends on it; `attnlab sweep --peers` finds
# it (or $ATTN_PEERS_PYTHON). Idempotent: what is installed at the pinned version stays.
# A family with a "venv" of its own in the catalogue (zentorch: built for another torch than the torch
# family's) goes into that venv instead; the sweep starts that family's server with its Python.
# Usage: scripts/peers/setup.sh [FAMILIES]   FAMILIES: comma-separated families of the peers' catalogue
#        (scripts/peers/catalogue.json: torch, ort, ov, jax, ggml, hf, hfq, zentorch; default those marked default,
#        the five peers; hf is transformers, for attnlab.hf's tests, with torch; hfq the backends of
#        transformers' QuantizedCache, HQQ and optimum-quanto, for scripts/models_hf.py). The pins and the
#        imports that check them are the catalogue's. Says which it could install; exits 1 when a requested
#        family cannot be imported afterwards.
# Sizes: ort ~60 MB (onnxruntime + onnx), ov ~50 MB (openvino), jax ~150 MB, torch ~3 GB (PyPI's wheel brings its
# CUDA libraries even for CPU use; the lab runs it on the CPU only); ggml ~10 MB (ggml-python
# builds its bundled ggml from source with the machine's compiler: seconds); hf ~12 MB (transformers
# and its small dependencies); hfq ~5 MB (quanto compiles its CPU kernels with ninja on first use: ~90 s);
# zentorch ~3 GB in .venv-zentorch (torch 2.14 and zentorch's 27 MB wheel).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${ATTN_PEERS_VENV:-$ROOT/.venv-peers}"
catalogue=(/usr/bin/python3 "$ROOT/scripts/peers/catalogue.py")
families="${1:-$("${catalogue[@]}" defaults)}"
COMMON="numpy==2.4.6 pytest==9.2.0"

IFS=',' read -r -a wanted <<<"$families"
declare -A PINS=() IMPORTS=() VENVS=()
for f in "${wanted[@]}"; do
  PINS[$f]="$("${catalogue[@]}" pins "$f" 2>/dev/null)" ||
    { echo "peers-setup: unknown family '$f'; allowed: $("${catalogue[@]}" families)" >&2; exit 2; }
  IMPORTS[$f]="$("${catalogue[@]}" imports "$f")"
  own="$("${catalogue[@]}" venv "$f")"
  VENVS[$f]="$VENV"
  [[ "$own" == .venv-peers ]] || VENVS[$f]="$ROOT/$own"
done

"$ROOT/scripts/setup.sh"  # python3-venv among the lab's packages
declare -A READY=()
venv_ready() {  # creates venv $1 once, with the common pins
  [[ -n "${READY[$1]:-}" ]] && return 0
  if [[ ! -x "$1/bin/python" ]]; then
    echo "peers-setup: creating $1 (/usr/bin/python3 -m venv)" >&2
    /usr/bin/python3 -m venv "$1"
  fi
  # shellcheck disable=SC2086  # the pins are words
  "$1/bin/python" -m pip install --quiet --disable-pip-version-check $COMMON
  READY[$1]=1
}

rc=0
summary=()
for f in "${wanted[@]}"; do
  start=$SECONDS
  v="${VENVS[$f]}"
  venv_ready "$v"
  # shellcheck disable=SC2086  # the pins are words
  if "$v/bin/python" -m pip install --quiet --disable-pip-version-check ${PINS[$f]} &&
    "$v/bin/python" -c "import ${IMPORTS[$f]}" 2>/dev/null; then
    summary+=("$f: installed in $v (${PINS[$f]}; $((SECONDS - start)) s)")
  else
    summary+=("$f: NOT installed in $v (pip install ${PINS[$f]} failed or the import fails)")
    rc=1
  fi
done
echo "peers-setup:" >&2
printf '  %s\n' "${summary[@]}" >&2
exit "$rc"
