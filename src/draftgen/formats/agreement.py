"""Whether an answer's token IDs are its text: the IDs decoded and split by the model format
beside the text fields the endpoint sent. The audit asks it of every stored record, and the run
of every answer whose engine sent both (an ID list that decodes to another text is not the
answer's, however in range its IDs are)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from draftgen.formats.base import ParsedAnswer


def no_space(text: str | None) -> str:
    """The text without any whitespace (providers strip or keep it at will)."""
    return "".join((text or "").split())


def _words(text: str | None) -> list[str]:
    """The text's whitespace-separated words: equal lists mean equal but for whitespace
    (added, removed or changed between words, never inside one)."""
    return (text or "").split()


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return no_space(value)
    return value


def _calls(calls: Any) -> list[tuple[str, Any]]:
    out = []
    for c in calls or []:
        fn = (c.get("function") or c) if isinstance(c, dict) else {}
        out.append((str(fn.get("name")), _args(fn.get("arguments"))))
    return out


def text_problems(parsed: ParsedAnswer, stored: ParsedAnswer, flags: Sequence[str],
                  cut_off: bool) -> list[str]:
    """Where an answer's decoded IDs (`parsed`) and its text fields (`stored`) disagree,
    whitespace-insensitively: `reasoning_mismatch`, `content_mismatch`,
    `tool_calls_mismatch`; [] where the IDs are the text's. `flags`: the answer's (a
    `reasoning_dropped` one has no reasoning to compare); `cut_off`: it ended at its token
    limit (a cut inside a UTF-8 character shows U+FFFD on one side only)."""
    def same(a: str | None, b: str | None) -> bool:
        x, y = _words(a), _words(b)
        if x == y:
            return True
        # A cut inside a UTF-8 character shows U+FFFD on one side only.
        return cut_off and no_space(a).rstrip("\ufffd") == no_space(b).rstrip("\ufffd")

    problems = []
    if "reasoning_dropped" not in flags and not same(parsed.reasoning, stored.reasoning):
        problems.append("reasoning_mismatch")
    stored_calls, parsed_calls = _calls(stored.tool_calls), _calls(parsed.tool_calls)
    if stored_calls and not parsed_calls:
        # The tool text stayed in the decoded content (it did not render back exactly).
        content_ok = no_space(parsed.content).startswith(no_space(stored.content))
        calls_ok = all(name in (parsed.content or "") for name, _ in stored_calls)
    elif parsed_calls and not stored_calls:
        # The provider left the tool text in the content (no tool parser).
        content_ok = no_space(stored.content).startswith(no_space(parsed.content))
        calls_ok = all(name in (stored.content or "") for name, _ in parsed_calls)
    else:
        content_ok = same(parsed.content, stored.content)
        calls_ok = parsed_calls == stored_calls
    if not content_ok:
        problems.append("content_mismatch")
    if not calls_ok:
        problems.append("tool_calls_mismatch")
    return problems
