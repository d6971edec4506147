"""gpt-oss prompt rendering, in one run: draftgen's default (openai-harmony renders the system and
developer messages, once per distinct header; the turns are written in Python), the whole
conversation through openai-harmony (as vLLM does), and the Python harmony prompt draftgen had
before (`renderer: hf_template` without a template file); beside them the tokenization every
prompt gets anyway (`encode_batch` of the texts, the gpt-oss test tokenizer: the Qwen3 BPE with
harmony's special tokens). Both harmony sides are checked to give the same texts.

The prompts are N conversations of four kinds in turn: a user question; a system prompt and a
question; a tool declaration and a question; a tool loop (question, reasoning + call, result).
Each side renders all N texts, alternately, REPEAT times; the best pass of each is compared.

    python bench/gpt_oss_render.py [--n 5000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city.",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "The city."},
        "unit": {"type": "string", "enum": ["C", "F"], "default": "C"},
        "days": {"type": "array", "items": {"type": "integer"}}}}}}


def conversations(n: int) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    question = "Explain, in a few sentences, how a {i}-stage pipeline hides latency."
    out: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []
    for i in range(n):
        user = {"role": "user", "content": question.format(i=i)}
        kind = i % 4
        if kind == 0:
            out.append(([user], None))
        elif kind == 1:
            out.append(([{"role": "system", "content": "You are terse."}, user], None))
        elif kind == 2:
            out.append(([user], [WEATHER]))
        else:
            call = {"id": "c", "type": "function",
                    "function": {"name": "get_weather", "arguments": f'{{"city": "C{i}"}}'}}
            out.append(([user, {"role": "assistant", "content": None, "reasoning": "Need it.",
                                "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c", "content": "21C"}], [WEATHER]))
    return out


def best_pass(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def full_harmony(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The whole conversation through openai-harmony (the way vLLM renders it): system,
    developer and turns, one render_conversation_for_completion call."""
    import openai_harmony as oh

    from draftgen.formats.harmony import harmony_encoding

    system = oh.SystemContent.new().with_conversation_start_date("2025-08-05")
    out = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
    developer = oh.DeveloperContent.new()
    if messages[0]["role"] == "system":
        developer = developer.with_instructions(messages[0]["content"])
    if tools:
        developer = developer.with_function_tools([oh.ToolDescription.new(
            t["function"]["name"], t["function"]["description"],
            parameters=t["function"]["parameters"]) for t in tools])
    if tools or messages[0]["role"] == "system":
        out.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer))
    for m in messages:
        if m["role"] == "user":
            out.append(oh.Message.from_role_and_content(oh.Role.USER, m["content"]))
        elif m["role"] == "assistant":
            out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, m["reasoning"])
                       .with_channel("analysis"))
            fn = m["tool_calls"][0]["function"]
            out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, fn["arguments"])
                       .with_channel("commentary").with_recipient(f"functions.{fn['name']}")
                       .with_content_type("json"))
        elif m["role"] == "tool":
            out.append(oh.Message.from_author_and_content(
                oh.Author.new(oh.Role.TOOL, "functions.get_weather"), m["content"])
                .with_channel("commentary").with_recipient("assistant"))
    enc = harmony_encoding()
    ids = enc.render_conversation_for_completion(oh.Conversation.from_messages(out),
                                                 oh.Role.ASSISTANT)
    return enc.decode_utf8(ids)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    from draftgen.formats import get_format
    from draftgen.formats.harmony import harmony_encoding
    from draftgen.testing.assets import family_tokenizer

    common.print_machine()
    tok = family_tokenizer("gpt-oss")
    options = {"current_date": "2025-08-05"}
    draftgen = get_format("gpt-oss", tok, options)
    python = get_format("gpt-oss", tok, {**options, "renderer": "hf_template"})
    convs = conversations(args.n)
    t = time.perf_counter()
    harmony_encoding()
    load_s = time.perf_counter() - t
    texts = [draftgen.prompt_text(m, tools) for m, tools in convs]
    assert texts == [full_harmony(m, tools) for m, tools in convs]

    sides = {
        "draftgen (harmony header + turns)": lambda: [draftgen.prompt_text(*c) for c in convs],
        "openai-harmony, whole prompt": lambda: [full_harmony(*c) for c in convs],
        "python (before)": lambda: [python.prompt_text(*c) for c in convs],
        "tokenize (encode_batch)": lambda: tok.encode_batch(texts),
    }
    best = {name: float("inf") for name in sides}
    for _ in range(args.repeat):  # the sides in turn, so that each sees the same machine
        for name, fn in sides.items():
            best[name] = min(best[name], best_pass(fn, 1))
    print(f"prompts: {args.n} (the same texts on both harmony sides), best of {args.repeat}; "
          f"openai-harmony load once: {load_s:.2f} s")
    base = best["python (before)"]
    for name, s in best.items():
        print(f"{name:36s} {s / args.n * 1e6:8.1f} us/prompt  {s / base:6.1f} x python")
    return 0


if __name__ == "__main__":
    sys.exit(main())
