"""Row checks done at export time.

Two kinds, handled differently:

* structure (`structure_problem`, `damaged_problem`, `mask_problem`): a record that cannot
  become a sound training row (no prompt or no answer IDs, IDs that are not integers, a line
  that is not a record) and a finished row whose mask is all-zero, all-one or not as long as
  its IDs. Exporting such a row would silently train nothing or the wrong thing, so the export
  fails naming the record (unless `--skip-broken`).
* audit (`audit_problems`): answers whose tokens are suspect, by the token checks of
  `draftgen audit` (`draftgen.audit.checks`): a finished answer that does not end with the
  format's stop token, a cut-off one that does, a stop token in the middle, or a special-token
  string found inside reasoning/content text (reconstructed IDs would hold a control token the
  model never emitted there). These are excluded by default with the reason counted
  (`--no-checks` keeps them). Stop-token checks need the run's format and tokenizer; without
  them they are skipped and the summary says so. `draftgen audit` runs the full set.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from draftgen.audit.checks import CUT_OFF, FINISHED, Checked, TokenSpec, stop_token_problems
from draftgen.audit.checks import claim_problems as _claim_problems
from draftgen.errors import DraftgenError
from draftgen.store.record import Damaged, Record

__all__ = ["CUT_OFF", "FINISHED", "BrokenRow", "audit_problems", "damaged_problem",
           "mask_problem", "structure_problem"]


class BrokenRow(DraftgenError):
    """A row that must not be written; the message names the record."""


def _is_id_list(value: Any) -> bool:
    """A list of non-negative integers (checked in C: long answers have 100k+ tokens)."""
    if not isinstance(value, list):
        return False
    try:
        ids = array("q", value)
    except (TypeError, OverflowError):
        return False
    return not ids or int(np.frombuffer(ids, dtype=np.int64).min()) >= 0


def structure_problem(record: Record) -> str | None:
    """Why this record cannot become a training row, or None (its IDs are token IDs: its
    decoding checked them)."""
    return _empty_problem(record.input_ids, record.output_ids)


def damaged_problem(record: Damaged) -> str:
    """Why a damaged line cannot become a training row: what is wrong with its IDs, else the
    field that is not a record's."""
    return _ids_problem(record.fields) or record.error


def _ids_problem(fields: dict[str, Any]) -> str | None:
    if not isinstance(fields.get("id"), str):
        return "record has no string id"
    for key in ("input_ids", "output_ids"):
        if key not in fields:
            return f"{key} missing"
        if not _is_id_list(fields[key]):
            return f"{key} is not a list of token IDs"
    return _empty_problem(fields["input_ids"], fields["output_ids"])


def _empty_problem(input_ids: list[int], output_ids: list[int]) -> str | None:
    if not input_ids:
        return "empty input_ids (no prompt: the loss mask would be all-one)"
    if not output_ids:
        return "empty output_ids (no answer: the loss mask would be all-zero)"
    return None


def mask_problem(input_ids: Sequence[int], loss_mask: Sequence[int]) -> str | None:
    """Why a finished row's mask is broken, or None."""
    if len(loss_mask) != len(input_ids):
        return f"loss_mask has {len(loss_mask)} entries for {len(input_ids)} input_ids"
    ones = loss_mask.count(1)
    if ones + loss_mask.count(0) != len(loss_mask):
        stray = next(m for m in loss_mask if m not in (0, 1))
        return f"loss_mask holds {stray!r} (only 0 and 1 allowed)"
    if ones == 0:
        return "loss_mask is all zero (nothing to train on)"
    if ones == len(loss_mask):
        return "loss_mask is all one (the prompt would be trained on)"
    return None


def audit_problems(record: Checked, stop: int | TokenSpec | None) -> list[str]:
    """Audit reasons to exclude this answer (empty when it passes): the stop-token checks of
    `draftgen audit` (`stop`: the format's stop token ID, or its TokenSpec; None skips them)
    and the special-token text flags."""
    problems = [p for p in _claim_problems(record) if p.startswith("special_token_in_")]
    ids = record.output_ids or []
    if stop is None or not ids:
        return problems
    spec = stop if isinstance(stop, TokenSpec) else TokenSpec.of_stop(stop)
    return [*problems, *stop_token_problems(ids, record.finish_reason, spec.stop_ids,
                                            spec.continuation)]
