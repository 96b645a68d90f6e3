#!/usr/bin/env bash
# The peers' virtual environment (.venv-peers, ignored by git): Debian's python3 -m venv, then
# pinned wheels from PyPI. Nothing else in the lab depends on it; `attnlab sweep --peers` finds
# it (or $ATTN_PEERS_PYTHON). Idempotent: what is installed at the pinned version stays.
# Usage: scripts/peers/setup.sh [FAMILIES]   FAMILIES: comma-separated families of the peers' catalogue
#        (scripts/peers/catalogue.json: torch, ort, ov, jax, ggml, hf, hfq; default those marked default,
#        the five peers; hf is transformers, for attnlab.hf's tests, with torch; hfq the backends of
#        transformers' QuantizedCache, HQQ and optimum-quanto, for scripts/models_hf.py). The pins and the
#        imports that check them are the catalogue's. Says which it could install; exits 1 when a requested
#        family cannot be imported afterwards.
# Sizes: ort ~60 MB (onnxruntime + onnx), ov ~50 MB (openvino), jax ~150 MB, torch ~3 GB (PyPI's wheel brings its
# CUDA libraries even for CPU use; the lab runs it on the CPU only); ggml ~10 MB (ggml-python
# builds its bundled ggml from source with the machine's compiler: seconds); hf ~12 MB (transformers
# and its small dependencies); hfq ~5 MB (quanto compiles its CPU kernels with ninja on first use: ~90 s).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${ATTN_PEERS_VENV:-$ROOT/.venv-peers}"
catalogue=(/usr/bin/python3 "$ROOT/scripts/peers/catalogue.py")
families="${1:-$("${catalogue[@]}" defaults)}"
COMMON="numpy==2.4.6 pytest==9.2.0"

IFS=',' read -r -a wanted <<<"$families"
declare -A PINS=() IMPORTS=()
for f in "${wanted[@]}"; do
  PINS[$f]="$("${catalogue[@]}" pins "$f" 2>/dev/null)" ||
    { echo "peers-setup: unknown family '$f'; allowed: $("${catalogue[@]}" families)" >&2; exit 2; }
  IMPORTS[$f]="$("${catalogue[@]}" imports "$f")"
done

"$ROOT/scripts/setup.sh"  # python3-venv among the lab's packages
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "peers-setup: creating $VENV (/usr/bin/python3 -m venv)" >&2
  /usr/bin/python3 -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" $COMMON

rc=0
summary=()
for f in "${wanted[@]}"; do
  start=$SECONDS
  # shellcheck disable=SC2086  # the pins are words
  if "${pip[@]}" ${PINS[$f]} && "$VENV/bin/python" -c "import ${IMPORTS[$f]}" 2>/dev/null; then
    summary+=("$f: installed (${PINS[$f]}; $((SECONDS - start)) s)")
  else
    summary+=("$f: NOT installed (pip install ${PINS[$f]} failed or the import fails)")
    rc=1
  fi
done
echo "peers-setup ($VENV):" >&2
printf '  %s\n' "${summary[@]}" >&2
exit "$rc"
