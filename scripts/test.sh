#!/usr/bin/env bash
# Set up a virtual environment (if none is active) and run the whole test suite.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
python -m ruff check src tests bench
python -m pytest -q "$@"
