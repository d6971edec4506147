"""The README's first command, end to end: `examples/quickstart.yaml` run as
`scripts/quickstart.sh` runs it (from the checkout's root, the probe on, a managed
llama-server with the bundled SmolLM2), then `status`, `audit`, and a second `run` that
resumes with nothing left to send. Its `turns: all` set is answered turn by turn by the engine:
one record per turn, each turn's history the engine's own earlier answers, every turn's IDs the
engine's."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from tests.e2e_helpers import records_in
from tests.engine import require_engine
from tests.reliability.helpers import draftgen

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


TRAJECTORIES = "quickstart_trajectories"


def _check_trajectories(run: Path, conversations: int) -> int:
    """Every conversation of the `turns: all` set walked from turn 0 to a turn with an `end`,
    each turn once, its history the engine's earlier answers, its IDs the engine's; the number
    of turns written."""
    records = records_in(run / TRAJECTORIES / "responses.jsonl")
    by_conversation: dict[str, list[dict]] = {}
    for r in records:
        by_conversation.setdefault(r["conversation"], []).append(r)
    assert len(by_conversation) == conversations
    assert len({r["id"] for r in records}) == len(records)
    for turns in by_conversation.values():
        turns.sort(key=lambda r: r["turn"])
        assert [r["turn"] for r in turns] == list(range(len(turns)))
        assert [r["end"] is not None for r in turns] == [False] * (len(turns) - 1) + [True]
        assert all(r["token_source"] == "native" and r["token_check"] == "exact"
                   and r["sampling"] == {"max_tokens": 160} for r in turns)
        for k, r in enumerate(turns):
            history = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
            assert history == [t["content"] for t in turns[:k]]
    assert any(len(turns) > 1 for turns in by_conversation.values())
    return len(records)


def _rows(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_quickstart_runs_resumes_and_audits(tmp_path: Path) -> None:
    require_engine()
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    data = tmp_path / "examples" / "data"
    expected = {name: _rows(data / f"{name}.jsonl")
                for name in ("quickstart", "quickstart_multiturn")}

    conversations = _rows(data / f"{TRAJECTORIES}.jsonl")

    first = draftgen("run", "examples/quickstart.yaml", "--no-live", cwd=tmp_path, timeout=540)
    assert first.returncode == 0, first.stderr[-3000:]

    status = draftgen("status", "runs/quickstart", "--json", cwd=tmp_path, timeout=60)
    assert status.returncode == 0, status.stderr
    datasets = orjson.loads(status.stdout)["datasets"]
    turns = _check_trajectories(tmp_path / "runs/quickstart", conversations)
    datasets.pop(TRAJECTORIES)  # counted in turns, checked from its records
    assert {name: d["done"] for name, d in datasets.items()} == expected
    assert all(d["failed"] == 0 and d["pending"] == 0 for d in datasets.values()), datasets
    # The engine's own IDs (native /completion endpoint): nothing rebuilt by re-encoding.
    assert all(d["not_exact"] == 0 for d in datasets.values()), datasets

    audit = draftgen("audit", "runs/quickstart", cwd=tmp_path, timeout=120)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-2000:]

    again = draftgen("run", "examples/quickstart.yaml", "--no-live", cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    after = orjson.loads(draftgen("status", "runs/quickstart", "--json", cwd=tmp_path,
                                  timeout=60).stdout)["datasets"]
    after.pop(TRAJECTORIES)
    assert {name: d["done"] for name, d in after.items()} == expected
    assert _check_trajectories(tmp_path / "runs/quickstart", conversations) == turns
    for name in expected:  # one line per prompt: the resume sent nothing again
        lines = (tmp_path / "runs/quickstart" / name / "responses.jsonl").read_bytes()
        assert lines.count(b"\n") == expected[name]
