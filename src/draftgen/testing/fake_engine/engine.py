"""The engine: the aiohttp request handlers, and the application that wires them."""

from __future__ import annotations

import asyncio
import hmac
import time
import zlib
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from draftgen.testing.fake_engine.answers import Completion, empty_completion
from draftgen.testing.fake_engine.chat import SSE_DONE, ChatReply, generation_json, with_comments
from draftgen.testing.fake_engine.config import ServerConfig
from draftgen.testing.fake_engine.faults import ERRORS, IGNORES_MAX_TOKENS, FaultPicker
from draftgen.testing.fake_engine.kinds import BadRequest, Json
from draftgen.testing.fake_engine.model import AnswerKey, FakeModel, digest
from draftgen.testing.fake_engine.request import (
    ChatRequest,
    asks_for_tool_call,
    declines,
    last_user_text,
    render_prompt,
)
from draftgen.testing.fake_engine.responses import (
    abort,
    bad_request,
    huge_pieces,
    json_response,
    write_in_pieces,
)
from draftgen.testing.fake_engine.sglang import (
    GenerateParams,
    generate_json,
    generate_prompt,
    last_user_turn,
)
from draftgen.testing.fake_engine.shapes import (
    ReplyContext,
    echoed,
    endpoints_json,
    error_json,
    generation_id,
    models_json,
)
from draftgen.testing.fake_engine.stats import ServerStats
from draftgen.testing.fake_engine.vocab import load_vocab

_ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/api/v1/chat/completions": "chat",
    "/generate": "generate",
    "/v1/models": "models",
    "/api/v1/models": "models",
    "/health": "health",
    "/stats": "stats",
    "/api/v1/generation": "generation",
}
_MODEL_CALLS = frozenset({"chat", "generate"})
GENERATIONS_KEPT = 100_000
_CUT_STREAM = frozenset({"sse_error", "no_done", "reset_stream"})
"""Faults that end a stream after about half of its deltas."""
_OPEN_PATHS = frozenset({"/health", "/stats"})
_LABEL_CHARS = 200
"""`stats["per_prompt"]` keys are the last user message, cut to this length."""


class FakeEngine:
    """The request handlers. `create_app` wires them into an aiohttp application."""

    def __init__(self, config: ServerConfig, stats: ServerStats | None = None) -> None:
        self.config = config
        self.stats = stats if stats is not None else ServerStats()
        self.vocab = load_vocab(config.tokenizer_file())
        self.model = FakeModel(config, self.vocab)
        self.faults = FaultPicker(config.fault_rates, config.seed)
        self.generations: dict[str, Json] = {}
        """The latest chat answers' `GET /api/v1/generation` records, by generation ID
        (OpenRouter mode; at most GENERATIONS_KEPT)."""

    # ---- middleware

    @web.middleware
    async def observe(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        endpoint = _ENDPOINTS.get(request.path, "other")
        in_flight = endpoint in _MODEL_CALLS
        self.stats.begin(endpoint, in_flight, request.query.keys())
        outcome = "cancelled"
        try:
            response: web.StreamResponse = await handler(request)
            outcome = str(response.status)
        except web.HTTPException as e:  # 404, 405 from the router
            outcome = str(e.status)
            raise
        except _Dropped:
            outcome = "reset"
            raise asyncio.CancelledError from None
        finally:
            self.stats.end(outcome, in_flight)
        if not response.prepared:
            response.headers.setdefault("X-Generation-Id", generation_id())
        return response

    @web.middleware
    async def authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        key = self.config.api_key
        if key is None or request.path in _OPEN_PATHS:
            return await handler(request)
        given = request.headers.get("Authorization", "").encode()
        if hmac.compare_digest(given, f"Bearer {key}".encode()):
            return await handler(request)
        message = echoed("No auth credentials found", given.decode(), self.config)
        return json_response({"error": {"code": 401, "message": message}}, status=401)

    # ---- simple endpoints

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def models(self, request: web.Request) -> web.Response:
        return json_response(models_json(self.config))

    async def endpoints(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.config.model:
            return json_response({"error": {"code": 404, "message": "Model not found"}}, 404)
        return json_response(endpoints_json(self.config))

    def _keep_generation(self, reply: ChatReply) -> None:
        self.generations[reply.ctx.gen_id] = generation_json(reply)
        if len(self.generations) > GENERATIONS_KEPT:  # a benchmark's millions: oldest first
            del self.generations[next(iter(self.generations))]

    async def generation(self, request: web.Request) -> web.Response:
        record = self.generations.get(request.query.get("id", ""))
        if record is None:
            return json_response({"error": {"code": 404, "message": "Generation not found"}},
                                  404)
        return json_response({"data": record})

    async def stats_endpoint(self, request: web.Request) -> web.Response:
        with_bodies = request.query.get("bodies", "1") != "0"
        return json_response(self.stats.snapshot(bodies=with_bodies))

    # ---- model calls

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            req = ChatRequest.parse(body)
            label = last_user_text(req.messages)
            fault = await self._before_answer(request, label)
        except BadRequest as e:
            return bad_request(str(e))
        prompt = render_prompt(req.messages, req.tools, self.config.layout)
        ctx = self._context(label, await self.model.encode(prompt))
        early = self._fault_response(fault, req.stream, ctx, label, request)
        if early is not None:
            return early
        key = AnswerKey(
            digest(req.messages, req.seed, self.config.seed),
            req.wants_tool_call(label, self.config.tools_supported)
            and not declines(self.config, label),
        )
        comp = await self._completion(fault, key, req.max_tokens, self.vocab.stop_ids)
        reply = ChatReply(self.config, req, ctx, comp, fault)
        if self.config.price is not None:
            self.stats.bill(self.config.price.cost(len(ctx.prompt_ids), len(comp.ids)))
        if self.config.mode == "openrouter":
            self._keep_generation(reply)
        if req.stream:
            return await self._stream(request, reply, fault)
        return await self._send_json(request, reply.json(), fault, ctx)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            prompt_ids = await generate_prompt(body, self.vocab, self.model)
            params = GenerateParams.parse(body.get("sampling_params"), self.vocab.stop_ids)
            prompt_text = self.vocab.text(prompt_ids)
            label = last_user_turn(prompt_text)
            fault = await self._before_answer(request, label)
        except BadRequest as e:
            return bad_request(str(e))
        ctx = self._context(label, prompt_ids)
        early = self._fault_response(fault, False, ctx, label, request)
        if early is not None:
            return early
        tool = (self.config.tools_supported and "<tools>" in prompt_text
                and asks_for_tool_call(label) and not declines(self.config, label))
        key = AnswerKey(digest(prompt_ids, params.seed, self.config.seed), tool)
        limit = params.max_new_tokens
        if limit is None:
            limit = self.config.generate_default_max_new_tokens
        comp = await self._completion(fault, key, limit, params.stop_ids)
        payload = generate_json(
            self.config, self.vocab, ctx, comp, limit, params.skip_special_tokens, fault
        )
        return await self._send_json(request, payload, fault, ctx)

    # ---- shared steps

    async def _body(self, request: web.Request) -> Json:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise BadRequest("the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        self.stats.received(body)
        return body

    async def _before_answer(self, request: web.Request, label: str) -> str | None:
        """Count the prompt, pick the fault, wait; `reset` and `slow` happen here."""
        self.stats.count("per_prompt", label[:_LABEL_CHARS])
        fault = self.faults.pick(label)
        if fault is not None:
            self.stats.count("faults", fault)
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        if fault == "slow":
            await asyncio.sleep(3600)
        if fault == "reset":
            abort(request)
            raise _Dropped
        return fault

    def _context(self, label: str, prompt_ids: list[int]) -> ReplyContext:
        providers = self.config.providers
        provider = providers[zlib.crc32(label.encode()) % len(providers)]
        created = int(time.time())
        return ReplyContext(generation_id(), created, provider, time.perf_counter(), prompt_ids)

    def _fault_response(
        self, fault: str | None, stream: bool, ctx: ReplyContext, label: str,
        request: web.Request,
    ) -> web.Response | None:
        if fault == "sse_error" and not stream:
            fault = "error_body"
        if fault not in ERRORS:
            return None
        spec = ERRORS[fault]
        headers = {"X-Generation-Id": ctx.gen_id}
        if spec.retry_after:
            headers["Retry-After"] = spec.retry_after
        auth = request.headers.get("Authorization", "")
        body = error_json(fault, ctx, label, self.config, auth)
        if "usage" in body and self.config.price is not None:
            self.stats.bill(self.config.price.cost(len(ctx.prompt_ids), 0))
        return json_response(body, spec.status, headers)

    async def _completion(
        self, fault: str | None, key: AnswerKey, limit: int | None, stops: frozenset[int]
    ) -> Completion:
        if fault == "empty":
            return empty_completion(self.vocab, self.config)
        if fault == IGNORES_MAX_TOKENS:
            limit = None
        comp = await self.model.completion(key, limit, stops)
        if comp.noncanonical:
            self.stats.count("faults", "noncanonical")
        return comp

    async def _send_json(
        self, request: web.Request, body: Json, fault: str | None, ctx: ReplyContext
    ) -> web.StreamResponse:
        data = orjson.dumps(body)
        headers = {"X-Generation-Id": ctx.gen_id}
        if fault == "malformed":
            data = data[: len(data) // 2]
        if fault == "gzip_bomb":
            gzip = zlib.compressobj(1, wbits=31)  # gzip framing
            pieces = huge_pieces(data, self.config.huge_body_mb)
            data = b"".join([*map(gzip.compress, pieces), gzip.flush()])
            headers["Content-Encoding"] = "gzip"
        if fault in ("huge_body", "huge_chunked"):
            return await write_in_pieces(request, data, self.config.huge_body_mb, headers,
                                         declared=fault == "huge_body")
        if fault != "reset_stream":
            return web.Response(body=data, content_type="application/json", headers=headers)
        response = web.StreamResponse(headers=headers)
        response.content_type = "application/json"
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        abort(request)
        return response

    async def _stream(
        self, request: web.Request, reply: ChatReply, fault: str | None
    ) -> web.StreamResponse:
        if fault in ("malformed", "gzip_bomb", "huge_chunked"):
            return await self._send_json(request, reply.json(), fault, reply.ctx)
        response = web.StreamResponse(
            headers={"Cache-Control": "no-cache", "X-Generation-Id": reply.ctx.gen_id}
        )
        response.content_type = "text/event-stream"
        if fault == "no_done":
            response.force_close()
        await response.prepare(request)
        events, carried = reply.delta_events()
        events += reply.fault_events(carried)
        if fault in _CUT_STREAM:
            events = events[: max(1, len(events) // 2)]
        if fault == "sse_error":
            events += [reply.error_event(request.headers.get("Authorization", "")), SSE_DONE]
        elif fault not in _CUT_STREAM:
            events += reply.closing_events(carried)
        if self.config.mode == "openrouter":
            events = with_comments(events)
        await self._write_events(response, events)
        if fault == "reset_stream":
            abort(request)
            return response
        await response.write_eof()
        return response

    async def _write_events(self, response: web.StreamResponse, events: list[bytes]) -> None:
        per_write = 8 if self.config.stream_interval_s > 0 else 32
        for n in range(0, len(events), per_write):
            if n and self.config.stream_interval_s > 0:
                await asyncio.sleep(self.config.stream_interval_s)
            await response.write(b"".join(events[n : n + per_write]))


class _Dropped(Exception):
    """Raised after the connection was aborted on purpose (the `reset` fault)."""


def create_app(config: ServerConfig, stats: ServerStats | None = None) -> web.Application:
    """The aiohttp application (for aiohttp's own test utilities, or to mount elsewhere)."""
    engine = FakeEngine(config, stats)
    app = web.Application(
        middlewares=[engine.observe, engine.authenticate], client_max_size=256 * 1024 * 1024
    )
    chat_paths = [p for p, e in _ENDPOINTS.items() if e == "chat"]
    model_paths = [p for p, e in _ENDPOINTS.items() if e == "models"]
    app.add_routes(
        [
            *(web.post(path, engine.chat) for path in chat_paths),
            *(web.get(path, engine.models) for path in model_paths),
            *(web.get(path + "/{model:.+}/endpoints", engine.endpoints) for path in model_paths),
            web.post("/generate", engine.generate),
            web.get("/health", engine.health),
            web.get("/stats", engine.stats_endpoint),
            web.get("/api/v1/generation", engine.generation),
        ]
    )
    return app
