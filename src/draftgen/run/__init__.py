"""One run of `draftgen run`: `plan` (what it will send, rendered), `resume` (a session's start
on its folder), `dispatch` (datasets in turn, admission, backend slots), `request` (one
request's life), `answer_record` (an answer made the `Record` it is written as), `state` (phase
and outcome), `session` (the `Runner`: lock, start-up, signals, what the session leaves in
run.json).

`pending` holds what the queues hold, `render` the prompts rendered within the context length,
`turns` the conversations of `turns: all` datasets walked turn by turn, `free_space` the guard
that stops sending before the output disk is full.

The names below are imported on first use, so that `draftgen.run.plan` (which `run --dry-run`
needs) does not import the dispatcher and the backends."""

from typing import TYPE_CHECKING

from draftgen.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from draftgen.run.answer_record import make_record
    from draftgen.run.pending import Pending
    from draftgen.run.plan import DatasetPlan, Plan, prepare
    from draftgen.run.render import PromptTooLong, render_each, render_within
    from draftgen.run.resume import SettingsChanged
    from draftgen.run.session import Runner
    from draftgen.run.state import Outcome, RunState

__getattr__ = lazy_exports(__name__, {
    "draftgen.run.pending": ("Pending",),
    "draftgen.run.plan": ("DatasetPlan", "Plan", "prepare"),
    "draftgen.run.render": ("PromptTooLong", "render_each", "render_within"),
    "draftgen.run.answer_record": ("make_record",),
    "draftgen.run.resume": ("SettingsChanged",),
    "draftgen.run.session": ("Runner",),
    "draftgen.run.state": ("Outcome", "RunState"),
})

__all__ = [
    "DatasetPlan",
    "Outcome",
    "Pending",
    "Plan",
    "PromptTooLong",
    "RunState",
    "Runner",
    "SettingsChanged",
    "make_record",
    "prepare",
    "render_each",
    "render_within",
]
