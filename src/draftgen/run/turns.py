"""`turns: all` datasets in the run (docs/trajectories.md): each conversation walked turn by
turn, its next turn a queued request whose prompt holds the target's own earlier answers
(`formats.trajectory.turn_messages`), each answer written as it arrives with its place in the
conversation (`conversation`, `turn`, `end`, `sampling`), and `end_after` deciding whether the
next turn is queued or the trajectory ends there.

A resumed run rebuilds each conversation from the records already written (`written_turns`):
the answers of turns 0..k give turn k+1's prompt, so no written turn is sent again; a
conversation whose last record has an `end` is done.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftgen.config import RunConfig, SamplingConfig
from draftgen.datasets.conversations import ConversationPlan
from draftgen.datasets.sampling_mix import sampling_for
from draftgen.formats import Format, get_format
from draftgen.formats.trajectory import TurnAnswer, end_after, turn_messages, with_calls_read
from draftgen.store import RunLayout
from draftgen.store.prompt_refs import LineReader
from draftgen.store.record import Record
from draftgen.types import Prompt, RawAnswer, Rebuilt

log = logging.getLogger("draftgen")

EFFORT = "reasoning_effort"
"""The sampling key that is also a format option (gpt-oss's `Reasoning:` line)."""


def turn_id(conversation: str, turn: int) -> str:
    """A turn's record ID."""
    return f"{conversation}#{turn}"


@dataclass(slots=True)
class Conversation:
    """One conversation being walked: its plan, the format its prompts are rendered with, the
    sampling it drew, and the target's answers so far."""

    plan: ConversationPlan
    fmt: Format
    drawn: dict[str, Any]
    """The settings drawn from the dataset's `sampling_mix` ({} without one): recorded on
    every record of the conversation."""
    sampling: SamplingConfig | None
    """The run's sampling with the draw laid over it; None: the run's own."""
    answers: list[TurnAnswer] = field(default_factory=list)

    @property
    def turn(self) -> int:
        """The index of the next turn to answer."""
        return len(self.answers)

    @property
    def turns_left(self) -> int:
        return len(self.plan.turns) - len(self.answers)

    @property
    def max_tokens(self) -> int | None:
        """The drawn `max_tokens`, where the draw sets one."""
        return self.sampling.max_tokens if self.sampling is not None else None

    def next_prompt(self) -> Prompt:
        """The next turn's prompt (built, not yet rendered)."""
        plan = self.plan
        return Prompt(turn_id(plan.id, self.turn), plan.dataset,
                      turn_messages(plan.turns, self.answers), plan.tools, plan.source)

    def request_sampling(self, takes_prompt_ids: bool) -> SamplingConfig | None:
        """The sampling a request of this conversation is sent with (None: the run's). A
        drawn `reasoning_effort` goes in the body of a backend that renders the messages
        itself; one that takes draftgen's prompt IDs has it in the prompt already."""
        if self.sampling is None or takes_prompt_ids or EFFORT not in self.drawn:
            return self.sampling
        extra = {**self.sampling.extra, EFFORT: self.drawn[EFFORT]}
        return self.sampling.model_copy(update={"extra": extra})

    def label(self, record: Record, raw: RawAnswer, rebuilt: Rebuilt) -> TurnAnswer:
        """Give the turn's record its place in the conversation and its `end`; the target's
        answer as later turns' history will hold it."""
        k = self.turn
        turns = self.plan.turns
        answer = with_calls_read(self.fmt, TurnAnswer.from_rebuilt(
            rebuilt, finished=raw.finish_reason != "length"))
        record.conversation = self.plan.id
        record.turn = k
        record.end = end_after(turns[k], answer, turns[k + 1] if k + 1 < len(turns) else None)
        record.sampling = self.drawn
        return answer

    def answered(self, answer: TurnAnswer) -> None:
        """The turn's record is written: later turns' history holds its answer."""
        self.answers.append(answer)


class Formats:
    """The run's format, and one per distinct set of format options a conversation's draw
    needs (a drawn gpt-oss `reasoning_effort`), each built once."""

    def __init__(self, cfg: RunConfig, fmt: Format) -> None:
        self.cfg = cfg
        self.fmt = fmt
        self._built: dict[tuple[tuple[str, Any], ...], Format] = {}

    def for_draw(self, drawn: dict[str, Any]) -> Format:
        effort = drawn.get(EFFORT)
        if effort is None or EFFORT not in type(self.fmt).option_types:
            return self.fmt
        options = {**self.cfg.model.format_options, EFFORT: effort}
        key = tuple(sorted(options.items()))
        fmt = self._built.get(key)
        if fmt is None:
            fmt = self._built[key] = get_format(self.cfg.model.format, self.fmt.tokenizer,
                                                options)
        return fmt


def drawn_sampling(run: SamplingConfig, drawn: dict[str, Any]) -> SamplingConfig | None:
    """The run's sampling with the drawn keys laid over it (`extra` merged); None without a
    draw."""
    if not drawn:
        return None
    update = {k: v for k, v in drawn.items() if k not in (EFFORT, "extra")}
    if "extra" in drawn:
        update["extra"] = {**run.extra, **drawn["extra"]}
    return run.model_copy(update=update)


def start_conversation(plan: ConversationPlan, cfg: RunConfig, formats: Formats,
                       written: Sequence[Record]) -> Conversation:
    """The conversation as its written turns leave it (`written`: its records from turn 0, in
    order)."""
    ds = next(d for d in cfg.datasets if d.name == plan.dataset)
    drawn = sampling_for(ds.sampling_mix, cfg.sampling.seed, plan.id)
    fmt = formats.for_draw(drawn)
    answers = [with_calls_read(fmt, TurnAnswer(r.reasoning, r.content, r.tool_calls,
                                               list(r.output_ids),
                                               finished=r.finish_reason != "length"))
               for r in written]
    return Conversation(plan, fmt, drawn, drawn_sampling(cfg.sampling, drawn), answers)


def is_done(written: Sequence[Record]) -> bool:
    """A conversation is done when its last written turn ended it."""
    return bool(written) and isinstance(written[-1].end, str)


def written_turns(folders: Sequence[Path], dataset: str,
                  spans: dict[str, tuple[int, int]] | None = None) -> dict[str, list[Record]]:
    """Each conversation's records on disk in the run's folders, turn 0 up to the first gap
    (a turn written twice counts once). Lines that are not records (a tail being written in
    another folder) are left out. `spans`, when given, is filled with where each turn of the
    first folder lies in its file (id -> start, end), so that the next turn may be written as
    the one it extends (`store.Store.continue_turn`)."""
    by_turn: dict[str, dict[int, Record]] = {}
    for n, folder in enumerate(folders):
        path = RunLayout(folder).responses(dataset)
        if not path.exists():
            continue
        with open(path, "rb") as f, LineReader(path) as reader:
            start = 0
            for line in f:
                record = reader.read(line, start) if line.endswith(b"\n") else None
                at, start = start, start + len(line)
                if not isinstance(record, Record) or not isinstance(record.conversation, str) \
                        or not isinstance(record.turn, int):
                    continue
                by_turn.setdefault(record.conversation, {}).setdefault(record.turn, record)
                if spans is not None and n == 0:
                    spans.setdefault(record.id, (at, start))
    out: dict[str, list[Record]] = {}
    for conversation, turns in by_turn.items():
        chain: list[Record] = []
        while len(chain) in turns:
            chain.append(turns[len(chain)])
        if len(chain) < len(turns):
            log.warning("%s: turns after %d of conversation %s are not contiguous; continued "
                        "from turn %d", dataset, len(chain), conversation, len(chain))
        out[conversation] = chain
    return out
