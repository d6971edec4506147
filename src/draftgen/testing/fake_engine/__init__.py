"""A local fake inference engine that speaks the real wire protocols, for tests and benchmarks.

It serves, on loopback:

- `POST /v1/chat/completions` and `POST /api/v1/chat/completions`: OpenAI chat completions as
  OpenRouter and vLLM answer them (JSON and SSE streaming, reasoning fields, structured tool
  calls, `usage` with cost, vLLM's `return_token_ids`, `logprobs` with `bytes` and `id`);
- `POST /generate`: SGLang's native endpoint (`input_ids` or `text` in, `output_ids` out);
- `GET /v1/models`, `GET /api/v1/models`, `GET /health`, and `GET /stats` (counters for tests);
- `GET /api/v1/generation?id=...`: OpenRouter's record of one chat answer (`total_cost`, token
  counts), known from the moment the answer starts, also when the client went away.

The answers come from a deterministic fake model that uses the real Qwen3 tokenizer: for a
prompt (and the request's `seed`) it writes some reasoning and some content, lays them out as a
Qwen3 model would emit them, and reports the tokenizer's encoding of that text as the native
output IDs. Layout "qwen3" (hybrid models, the model writes `<think>` itself)::

    "<think>\\n" + reasoning + "\\n</think>\\n\\n" + content + "<|im_end|>"

Layout "qwen3-thinking" (2507 Thinking models, `<think>\\n` ends the prompt)::

    reasoning + "\\n</think>\\n\\n" + content + "<|im_end|>"

A tool-call answer (the request has `tools`, or for `/generate` the prompt has `<tools>`, and
the last user message says "weather" or holds the directive `[[tool_call]]`) puts
``content + ("\\n" if content) + "<tool_call>\\n{...}\\n</tool_call>"`` where the content goes;
the call is always `get_weather` with `{"city": "Paris"}`.

How the chat endpoint shows reasoning and content (`ServerConfig`):

- default: reasoning is exactly the text between `<think>\\n` and `\\n</think>`, content the text
  after `</think>\\n\\n` (without `<|im_end|>`; for a tool call, without the `\\n<tool_call>...`
  block). Re-wrapping them in the layout above gives the native text back exactly.
- `raw_slices=True`: what vLLM's Qwen3 reasoning parser returns: reasoning is everything
  between `<think>` and `</think>` (so it starts and ends with a newline) and content is
  everything after `</think>` (it starts with `\\n\\n`).
- `strip_whitespace=True`: both `.strip()`ed, as some gateways do. This loses information for
  the answers whose own text begins or ends with whitespace (`edge_whitespace_rate`).
- `reasoning_field`, `tool_call_display` (structured `tool_calls`, or the raw tool block left
  in the content), `tools_supported=False` (tools ignored), `logprobs_scope` (all tokens,
  content tokens only, none): the endpoint behaviours `draftgen probe` tells apart.

Token IDs: `usage.completion_tokens` is always the number of IDs the engine reports (vLLM's
`token_ids`, SGLang's `output_ids`, the `logprobs` entries), except that with
`generate_omits_stop_id` the matched stop ID is counted but left out of `output_ids`. With
`noncanonical_rate`, one token of an answer is replaced by two vocabulary tokens with the same
bytes, as an engine can sample: the text is unchanged, the reported IDs differ from
re-encoding it. A `max_tokens` cut keeps
the first IDs (finish_reason "length", no `<|im_end|>`); a cut inside a UTF-8 character shows
U+FFFD at the end of the text.

Faults are injected either at random (`ServerConfig.fault_rates`, drawn per request from an RNG
seeded with `ServerConfig.seed`) or by a directive in the last user message (for `/generate`: in
the last user turn of the decoded prompt): `[[fault:KIND]]` fails every time, `[[fault:KIND*N]]`
fails the first N requests with that last user message. See `FAULT_KINDS` for the kinds and
their wire behaviour.

Use `TestServer` in-process (a context manager running the server on its own thread), or run
`python -m draftgen.testing.fake_engine --port 0 ...`, which prints `LISTENING http://HOST:PORT`.

The modules, lower ones first: `kinds` (shared types), `language` (the fake model's text),
`faults` (the fault kinds and their picker), `config` (`ServerConfig`), `vocab` (token bytes),
`answers` (an answer as a request sees it), `model` (writes and caches the answers), `request`
(what a chat request asks for), `stats` (counters), `shapes` (usage, errors, listings), `chat`
(the chat endpoint's JSON and SSE answers), `sglang` (`/generate`), `responses` (aiohttp
bodies), `engine` (the handlers and the app), `server` (`serve`, `TestServer`), `cli`.
"""

from draftgen.testing.fake_engine.answers import Completion
from draftgen.testing.fake_engine.cli import config_from_args, main, serve_until_signal
from draftgen.testing.fake_engine.config import Prices, ServerConfig
from draftgen.testing.fake_engine.engine import GENERATIONS_KEPT, FakeEngine, create_app
from draftgen.testing.fake_engine.faults import (
    BAD_IDS,
    BAD_TOOL_CALLS,
    ERRORS,
    FAULT_KINDS,
    IGNORES_MAX_TOKENS,
    SHIFTED_IDS,
    TOO_MANY_IDS,
    ErrorSpec,
    FaultPicker,
)
from draftgen.testing.fake_engine.kinds import (
    BadRequest,
    Layout,
    LogprobsScope,
    Mode,
    ReasoningField,
    ToolCallDisplay,
)
from draftgen.testing.fake_engine.language import TOOL_ARGUMENTS, TOOL_NAME, fake_text, native_text
from draftgen.testing.fake_engine.model import FakeModel
from draftgen.testing.fake_engine.server import TestServer, serve
from draftgen.testing.fake_engine.stats import ServerStats
from draftgen.testing.fake_engine.vocab import Vocab, load_vocab

__all__ = [
    "BAD_IDS",
    "BAD_TOOL_CALLS",
    "ERRORS",
    "FAULT_KINDS",
    "GENERATIONS_KEPT",
    "IGNORES_MAX_TOKENS",
    "SHIFTED_IDS",
    "TOOL_ARGUMENTS",
    "TOOL_NAME",
    "TOO_MANY_IDS",
    "BadRequest",
    "Completion",
    "ErrorSpec",
    "FakeEngine",
    "FakeModel",
    "FaultPicker",
    "Layout",
    "LogprobsScope",
    "Mode",
    "Prices",
    "ReasoningField",
    "ServerConfig",
    "ServerStats",
    "TestServer",
    "ToolCallDisplay",
    "Vocab",
    "config_from_args",
    "create_app",
    "fake_text",
    "load_vocab",
    "main",
    "native_text",
    "serve",
    "serve_until_signal",
]
