"""The verdict per backend, from its probe answers.

- `unsafe`: at least one problem (each says whether it concerns every prompt or only prompts
  with tools);
- `exact`: every answer's IDs are the engine's own (engine IDs, or complete logprobs);
- `reconstructable`: IDs rebuilt from text, with every length check passing (bar one
  off-by-a-token answer, below) and the whitespace around reasoning and content either kept or
  restored in a way the length check confirms. Still not proof: a sampled non-canonical split
  of the same length goes unseen (REFERENCE.md section 1).

Length mismatches. Real engines sample a non-canonical BPE split now and then (measured: 1
answer in 20 on llama.cpp), which text reconstruction cannot see, and which usually changes the
length by one token. The probe sends only a few requests, so one such answer must not condemn
a backend: a single mismatch of at most `NONCANONICAL_DELTA` tokens among three or more
checked answers is a warning (the run marks such answers `length_mismatch` and export leaves
them out). Mismatches in half or more of the checked answers, or any larger one, are
systematic (stripped whitespace that cannot be restored, hidden or summarised reasoning,
re-serialized tool arguments, another tokenizer) and make the backend unsafe.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftgen.formats import Format
from draftgen.probe.analyze import PROMPT_IDS_DIFFER, STOP_IN_IDS, STOP_IN_TEXT
from draftgen.probe.model import AnswerReport, Problem, Scope, Verdict

NONCANONICAL_DELTA = 2


def judge(fmt: Format, answers: Sequence[AnswerReport], notes: Sequence[str], *,
          prompt_as_ids: bool) -> tuple[Verdict, list[Problem], list[str]]:
    """`prompt_as_ids`: the backend takes the prompt as IDs rendered by the format (so the
    tools certainly reached the model)."""
    problems: list[Problem] = []
    warnings = list(notes)
    ok = [a for a in answers if a.ok]
    for a in answers:
        if not a.ok:
            problems.append(Problem("request_failed", f"{a.kind} request failed: {a.error}",
                                    _scope(a)))
            continue
        problems += _answer_problems(a)
        warnings += _answer_warnings(a)
    problems += _length_problems(ok, warnings)
    problems += _reasoning_problems(fmt, ok, warnings)
    problems += _tool_problems(fmt, ok, warnings, prompt_as_ids)
    if problems:
        return "unsafe", problems, warnings
    if ok and all(a.exact for a in ok):
        return "exact", problems, warnings
    return "reconstructable", problems, warnings


def _scope(a: AnswerReport) -> Scope:
    return "tools" if a.kind == "tool" else "all"


def _answer_problems(a: AnswerReport) -> list[Problem]:
    scope = _scope(a)
    if STOP_IN_IDS in a.flags or STOP_IN_TEXT in a.flags:
        return [Problem("stop_token_in_answer",
                        f"{a.kind} answer holds a stop token before its end (the engine did not "
                        "stop on it, or left its text in the content): wrong model format or "
                        "tokenizer?", scope)]
    if a.exact:
        return []
    out: list[Problem] = []
    if (any(f.startswith("special_token_in_") for f in a.flags)
            and "reasoning_in_content" not in a.flags):
        out.append(Problem("special_token_in_text",
                           f"{a.kind} answer: special-token text inside reasoning or content",
                           scope))
    if a.token_check == "unverifiable":
        out.append(Problem("unverifiable",
                           f"{a.kind} answer: no usage.completion_tokens, so IDs rebuilt from "
                           "text cannot be checked", scope))
    if a.whitespace == "uncertain":
        out.append(Problem("whitespace_uncertain",
                           f"{a.kind} answer: whitespace around reasoning/content was stripped "
                           "and the length check cannot tell how to restore it", scope))
    if "reasoning_dropped" in a.flags:
        out.append(Problem("reasoning_dropped",
                           f"{a.kind} answer: reasoning arrived but the model format has no "
                           "reasoning layout (wrong format?)", scope))
    return out


def _answer_warnings(a: AnswerReport) -> list[str]:
    out: list[str] = []
    if a.finish_reason == "length":
        out.append(f"{a.kind} answer cut off at the probe's max_tokens: checks after the cut "
                   "could not run (raise --max-tokens)")
    if a.logprobs == "partial":
        out.append(f"{a.kind} answer: logprobs cover only part of it (reasoning left out?), "
                   "so its IDs were rebuilt from text")
    elif a.logprobs == "no_bytes":
        out.append(f"{a.kind} answer: logprobs without token bytes or IDs")
    if a.exact and a.text_rebuild == "differs":
        out.append(f"{a.kind} answer: re-encoding its text fields would not give the engine's "
                   "IDs (exact only through the engine's IDs or logprobs)")
    if a.exact and a.whitespace == "differs":
        out.append(f"{a.kind} answer: reasoning/content fields differ from the text of its IDs")
    if PROMPT_IDS_DIFFER in a.flags:
        out.append(f"{a.kind} request: the engine's prompt IDs differ from the format's "
                   "rendering (the run records the engine's)")
    return out


def _length_problems(ok: Sequence[AnswerReport], warnings: list[str]) -> list[Problem]:
    checked = [a for a in ok if not a.exact and a.length_delta is not None]
    bad = [a for a in checked if a.length_delta]
    if not bad:
        return []
    deltas = ", ".join(f"{a.kind} {a.length_delta:+d}" for a in bad)
    summary = (f"{len(bad)} of {len(checked)} answers rebuilt from text differ in length from "
               f"usage.completion_tokens ({deltas})")
    systematic = (2 * len(bad) >= len(checked)
                  or any(abs(a.length_delta or 0) > NONCANONICAL_DELTA for a in bad))
    if not systematic:
        warnings.append(f"{summary}: the signature of a sampled non-canonical split; the run "
                        "marks such answers length_mismatch")
        return []
    scope: Scope = "tools" if all(a.kind == "tool" for a in bad) else "all"
    return [Problem("length_mismatch",
                    f"{summary}: text reconstruction does not give the sampled IDs", scope)]


def _reasoning_problems(fmt: Format, ok: Sequence[AnswerReport],
                        warnings: list[str]) -> list[Problem]:
    if not fmt.end_think_token:
        return []
    missing = [a for a in ok if not a.exact and a.reasoning in ("none", "encrypted")]
    if not missing:
        return []
    kinds = ", ".join(a.kind for a in missing)
    produced = any((a.reasoning_tokens or 0) > 0 or a.length_delta or a.reasoning == "encrypted"
                   for a in missing)
    if not produced:
        warnings.append(f"no reasoning arrived in the {kinds} answer(s), and nothing shows the "
                        "model wrote any (thinking off?)")
        return []
    return [Problem("reasoning_missing",
                    f"the model reasoned but its reasoning did not arrive ({kinds}): hidden or "
                    "encrypted by the endpoint, so IDs rebuilt from text would lack it (ask for "
                    "it: OpenRouter `reasoning`, a reasoning parser on vLLM/SGLang)")]


def _tool_problems(fmt: Format, ok: Sequence[AnswerReport], warnings: list[str],
                   prompt_as_ids: bool) -> list[Problem]:
    """What the tool requests' answers show. A model may answer one without a call (its
    choice): that alone says nothing of the endpoint. An endpoint that drops or mangles calls
    shows it in the answers themselves (finish_reason tool_calls without a call, malformed or
    unparsable calls); one that ignores tools gets no call for any tool request."""
    tools = [a for a in ok if a.kind == "tool"]
    states = [a.tool_calls for a in tools]
    if "malformed" in states:
        return [Problem("tool_calls_malformed",
                        "tool calls arrived with arguments that are not a JSON object", "tools")]
    if "unsupported" in states:
        return [Problem("tool_calls_unsupported",
                        f"model format {fmt.name!r} has no layout for the tool calls that "
                        "arrived", "tools")]
    dropped = [a for a in tools if a.tool_calls == "missing" and a.finish_reason == "tool_calls"]
    if dropped:
        return [Problem("tool_calls_dropped",
                        f"{len(dropped)} tool answer(s) ended with finish_reason tool_calls but "
                        "carried no call: the endpoint's tool parser dropped them", "tools")]
    declined = states.count("missing")
    called = sum(s in ("structured", "raw_text", "ids") for s in states)
    if states and states.count("cut_off") == len(states):
        warnings.append("the tool requests were cut off before any tool call: tool calls "
                        "unchecked (raise --max-tokens)")
    elif declined and (called or prompt_as_ids):
        why = ("the endpoint passed the tools through for the others" if called
               else "its prompt went as IDs, tools included")
        warnings.append(f"the model answered {declined} of {len(states)} tool requests "
                        f"without a tool call (its own choice: {why})")
    elif declined:
        return [Problem("tool_calls_missing",
                        f"none of the {len(states)} tool requests got a tool call (the endpoint "
                        "ignores tools, or its tool parser dropped the calls)", "tools")]
    return []
