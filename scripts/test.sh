#!/usr/bin/env bash
# Set up a virtual environment (if none is active) and run the whole test suite, the slow
# end-to-end tests included (markers only label them). Exits non-zero on any failure.
# Usage: bash scripts/test.sh [pytest args]
#
# First ruff, then `lint-imports` (the import rules of docs/architecture.md as import-linter
# contracts, pyproject.toml), then pytest.
#
# The tests run in DRAFTGEN_TEST_WORKERS pytest-xdist processes (default 2; 0: in this
# process), a test file per process at a time (`--dist loadfile`: a file's module fixtures
# are built once). On 2 cores: 563 s against 818 s in one process, most tests waiting on the
# subprocesses and servers they start.
#
# The real-engine tests need llama-server (bash scripts/build_llama_server.sh, cached in
# ~/.cache/draftgen): without it they are skipped, unless DRAFTGEN_REQUIRE_ENGINE=1 (.ci/run
# sets it), which makes a missing engine a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
if ! python -c 'import sys; from draftgen.assets import find_llama_server as f; sys.exit(f() is None)'
then
  if [ "${DRAFTGEN_REQUIRE_ENGINE:-0}" = "1" ]; then
    echo "test.sh: DRAFTGEN_REQUIRE_ENGINE=1 but no llama-server was found;" \
         "build it with: bash scripts/build_llama_server.sh" >&2
    exit 1
  fi
  echo "test.sh: no llama-server: the real-engine tests will be skipped" \
       "(build it with: bash scripts/build_llama_server.sh)" >&2
fi
python -m ruff check src tests bench
lint-imports
python -m pytest -q -n "${DRAFTGEN_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
  --durations=20 "$@"
