"""SGLang's native `/generate`: token IDs (or text) in, `output_ids`, text and `meta_info` out."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from draftgen.testing.fake_engine.answers import Completion
from draftgen.testing.fake_engine.config import ServerConfig
from draftgen.testing.fake_engine.faults import sent_ids
from draftgen.testing.fake_engine.kinds import BadRequest, Json
from draftgen.testing.fake_engine.model import FakeModel
from draftgen.testing.fake_engine.request import optional_int
from draftgen.testing.fake_engine.shapes import ReplyContext
from draftgen.testing.fake_engine.vocab import Vocab


@dataclass(frozen=True)
class GenerateParams:
    """The `sampling_params` of SGLang's /generate that the fake model honours."""

    max_new_tokens: int | None
    stop_ids: frozenset[int]
    """`stop_token_ids` plus the model's own stop tokens."""
    seed: Any
    skip_special_tokens: bool

    @classmethod
    def parse(cls, params: Any, model_stop_ids: frozenset[int]) -> GenerateParams:
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        stop_ids = params.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or not all(isinstance(i, int) for i in stop_ids):
            raise BadRequest("stop_token_ids must be a list of token IDs")
        return cls(
            max_new_tokens=optional_int(params, "max_new_tokens"),
            stop_ids=model_stop_ids.union(stop_ids),
            seed=params.get("seed", params.get("sampling_seed")),
            skip_special_tokens=params.get("skip_special_tokens", True) is not False,
        )


def last_user_turn(prompt_text: str) -> str:
    """The last user turn of a ChatML prompt (the whole text when it has none)."""
    start = prompt_text.rfind("<|im_start|>user\n")
    if start < 0:
        return prompt_text
    start += len("<|im_start|>user\n")
    end = prompt_text.find("<|im_end|>", start)
    return prompt_text[start : end if end >= 0 else len(prompt_text)]


async def generate_prompt(body: Json, vocab: Vocab, model: FakeModel) -> list[int]:
    """The prompt's token IDs: `input_ids` as given, or `text` encoded."""
    if body.get("stream"):
        raise BadRequest("streaming /generate is not supported by this test server")
    ids, text = body.get("input_ids"), body.get("text")
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        if any(i not in vocab.token_bytes for i in ids):
            raise BadRequest("input_ids holds IDs outside the vocabulary")
        return ids
    if isinstance(text, str) and text:
        return await model.encode(text)
    raise BadRequest("give input_ids (a flat list of token IDs) or text (a string)")


def generate_json(
    config: ServerConfig,
    vocab: Vocab,
    ctx: ReplyContext,
    comp: Completion,
    limit: int | None,
    skip_special: bool,
    fault: str | None = None,
) -> Json:
    output_ids = comp.ids
    if config.generate_omits_stop_id and comp.matched_stop is not None:
        output_ids = output_ids[:-1]
    output_ids = sent_ids(fault, output_ids, limit)
    if comp.matched_stop is not None:
        finish: Json = {"type": "stop", "matched": comp.matched_stop}
    else:
        finish = {"type": "length", "length": limit}
    meta = {
        "id": ctx.gen_id.removeprefix("gen-"),
        "finish_reason": finish,
        "prompt_tokens": len(ctx.prompt_ids),
        "completion_tokens": len(comp.ids),
        "cached_tokens": 0,
        "e2e_latency": time.perf_counter() - ctx.started,
    }
    text = vocab.text(comp.ids, skip_special=skip_special)
    return {"text": text, "output_ids": output_ids, "meta_info": meta}
