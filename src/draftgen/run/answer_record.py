"""An answer made the `Record` the run writes (`store.record`: the type and its line), with
the flags of what it was served by."""

from __future__ import annotations

import time

import msgspec

from draftgen.backends import Backend
from draftgen.provider_routing import routing_problems
from draftgen.store.record import Record
from draftgen.types import Prompt, RawAnswer, Rebuilt


def make_record(prompt: Prompt, input_ids: list[int], raw: RawAnswer, rebuilt: Rebuilt,
                backend: Backend, cost: float, latency_s: float, retries: int, *,
                cost_source: str, session: int | None = None) -> Record:
    """The answer's record. `cost`: the answer's and its billed failed attempts'. `session`:
    which of run.json's sessions (and settings) wrote it."""
    flags = list(rebuilt.flags)
    if raw.prompt_ids is not None and raw.prompt_ids != input_ids:
        flags.append("prompt_ids_differ_from_engine")
        input_ids = raw.prompt_ids  # what the engine actually saw
    served_by = {"provider": raw.provider, "quantization": raw.quantization}
    routing = backend.cfg.provider_routing
    flags.extend(f"{p}_by_config" for p in routing_problems(served_by, routing))
    return Record(
        id=prompt.id,
        dataset=prompt.dataset,
        messages=prompt.messages,
        tools=prompt.tools if prompt.tools else msgspec.UNSET,
        input_ids=input_ids,
        output_ids=rebuilt.output_ids,
        token_source=rebuilt.token_source,
        token_check=rebuilt.token_check,
        flags=flags,
        reasoning=rebuilt.reasoning,
        content=rebuilt.content,
        tool_calls=rebuilt.tool_calls,
        finish_reason=raw.finish_reason,
        backend=backend.name,
        provider=raw.provider,
        quantization=raw.quantization,
        model=raw.model,
        usage=raw.usage,
        cost_usd=round(cost, 8),
        cost_source=cost_source,
        request_id=raw.request_id,
        latency_s=round(latency_s, 3),
        retries=retries,
        created_at=round(time.time(), 3),
        session=session if session is not None else msgspec.UNSET,
    )
