"""`store.record.Record`: the record page (docs/record.md) names exactly its fields, and a
line the runner writes reads back as a `Record` with the same values (older lines with the defaults,
wrong types as a `RecordError` naming the field)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import orjson
import pytest

from draftgen.export.checks import damaged_problem, structure_problem
from draftgen.run import make_record
from draftgen.store.record import (
    FIELDS,
    Damaged,
    Record,
    RecordError,
    Usage,
    decode_record,
    encode_record,
    read_record,
    record_as_dict,
)
from draftgen.types import Prompt, RawAnswer, Rebuilt
from draftgen.types import Usage as RawUsage

RECORD_PAGE = Path(__file__).resolve().parents[1] / "docs" / "record.md"


def _table_rows(heading: str) -> dict[str, str]:
    """A table of docs/record.md (generated from `Record` by scripts/gen_docs.py; tests/
    test_docs.py holds it to the code): each field it names → its row's meaning."""
    text = RECORD_PAGE.read_text(encoding="utf-8")
    assert f"\n### {heading}\n" in text, f"docs/record.md has no {heading} table"
    section = text.split(f"\n### {heading}\n", 1)[1].split("\n### ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        rows[cells[0].strip("`")] = cells[-1]
    return rows


def test_the_record_page_names_every_field_and_no_other() -> None:
    rows = _table_rows("Record")
    assert list(rows) == list(FIELDS), "docs/record.md and Record disagree"
    assert all(rows.values()), "a field with no meaning"
    assert list(_table_rows("Usage")) == list(Usage.__struct_fields__)
    for name in Usage.__struct_fields__:
        assert f"`{name}`" in rows["usage"], f"the usage row does not name {name}"


def _runner_record(*, tools: bool, session: int | None) -> dict[str, Any]:
    """The JSON of the line the run writes (`run.make_record`, encoded as the store does)."""
    prompt = Prompt(id="d/7", dataset="d",
                    messages=[{"role": "user", "content": "Weather in Paris?"}],
                    tools=[{"type": "function", "function": {"name": "weather"}}] if tools
                    else None)
    raw = RawAnswer(reasoning="Look it up.", content=None, finish_reason="tool_calls",
                    usage=RawUsage(prompt_tokens=12, completion_tokens=5, reasoning_tokens=3,
                                   cost=0.00012),
                    provider="Alpha", quantization="fp8", model="m", request_id="gen-1")
    calls = [{"id": "c0", "type": "function",
              "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]
    rebuilt = Rebuilt([5, 6, 7, 8, 2], "native", "exact", "Look it up.", None, calls,
                      ["ids_from_logprobs"])
    routing = {"ignore": ["beta"]}
    backend = SimpleNamespace(name="paid", cfg=SimpleNamespace(provider_routing=routing))
    record = make_record(prompt, [1, 2, 3, 4], raw, rebuilt, backend,  # type: ignore[arg-type]
                         0.00012, 1.2345, 1, cost_source="reported", session=session)
    return orjson.loads(encode_record(record))


@pytest.mark.parametrize(("tools", "session"), [(True, 2), (False, None)])
def test_a_runner_line_reads_back_with_the_same_values(tools: bool, session: int | None
                                                       ) -> None:
    written = _runner_record(tools=tools, session=session)
    line = orjson.dumps(written)
    record = decode_record(line)
    assert isinstance(record, Record)
    assert record_as_dict(record) == orjson.loads(line)
    assert orjson.loads(encode_record(record)) == orjson.loads(line)
    assert list(orjson.loads(encode_record(record))) == list(written)  # the same key order
    assert ("tools" in written) is tools and ("session" in written) is (session is not None)
    assert read_record(line) == record


def test_an_older_line_reads_with_the_defaults() -> None:
    written = _runner_record(tools=False, session=None)
    for key in ("cost_usd", "cost_source", "session"):
        written.pop(key, None)
    record = decode_record(orjson.dumps(written))
    assert record.cost_source == "unknown" and record.cost_usd == 0.0
    assert record.session is msgspec.UNSET and record.tools is msgspec.UNSET
    assert "session" not in orjson.loads(encode_record(record))


@pytest.mark.parametrize(("change", "where"), [
    ({"input_ids": [1, "2", 3]}, "Expected `int`, got `str` - at `$.input_ids[1]`"),
    ({"output_ids": [1, -2]}, "Expected `int` >= 0 - at `$.output_ids[1]`"),
    ({"flags": "none"}, "Expected `array`, got `str` - at `$.flags`"),
    ({"usage": {"prompt_tokens": 1.5}}, "Expected `int | null`, got `float` - at "
                                        "`$.usage.prompt_tokens`"),
])
def test_a_wrong_type_is_a_record_error_naming_the_field(change: dict[str, Any],
                                                        where: str) -> None:
    line = orjson.dumps({**_runner_record(tools=True, session=0), **change})
    with pytest.raises(RecordError) as caught:
        decode_record(line)
    assert where in str(caught.value)
    damaged = read_record(line)
    assert isinstance(damaged, Damaged) and damaged.id == "d/7"
    assert where in damaged.error


def test_a_missing_field_is_named() -> None:
    written = _runner_record(tools=False, session=None)
    del written["token_check"]
    with pytest.raises(RecordError, match="missing required field `token_check`"):
        decode_record(orjson.dumps(written))


@pytest.mark.parametrize("line", [b"", b"not json", b'["not", "a", "record"]', b'"text"',
                                  b'{"id": "torn", "input_ids": [1,'])
def test_a_line_that_is_no_json_object_is_none(line: bytes) -> None:
    assert read_record(line) is None
    with pytest.raises(RecordError):
        decode_record(line)


def test_the_export_names_a_damaged_line_by_its_ids_else_by_its_field() -> None:
    good = _runner_record(tools=False, session=None)
    bad_ids = read_record(orjson.dumps({**good, "output_ids": [1, -2]}))
    no_flags = read_record(orjson.dumps({k: v for k, v in good.items() if k != "flags"}))
    assert isinstance(bad_ids, Damaged) and isinstance(no_flags, Damaged)
    assert damaged_problem(bad_ids) == "output_ids is not a list of token IDs"
    assert damaged_problem(no_flags) == "not a record: Object missing required field `flags`"
    empty = decode_record(orjson.dumps({**good, "input_ids": []}))
    assert structure_problem(empty) == ("empty input_ids (no prompt: the loss mask would be "
                                        "all-one)")
    assert structure_problem(decode_record(orjson.dumps(good))) is None
