"""5. Secrets: a recognisable canary API key in the environment goes through every path (a run
with answers and every error kind, a backend that rejects the key, the probe, the dry run,
status, audit, export, report, verbose logs, a crash trace) and appears in no file of the run
folder or the output folders and in no output. Keys given in the config (header values) are
redacted wherever the config is echoed."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, write_config
from tests.reliability import helpers
from tests.reliability.helpers import all_bytes, has_command, prompt_rows, write_jsonl
from tests.reliability.test_faults import FAILURE_KINDS

TIMES: dict[str, float] = {}


def draftgen(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    proc = helpers.draftgen(*args, **kw)
    TIMES[" ".join(a for a in args[:3] if not a.startswith("/"))] = round(time.monotonic() - t0, 1)
    return proc


CRASH = """
import sys
from draftgen.backends.base import Backend
from draftgen.cli import app
headers_of = Backend._headers
def crashing(self):
    headers = headers_of(self)  # the key is in a local of the crashing frame
    raise RuntimeError("a bug while building the request headers")
Backend._headers = crashing
sys.argv = ["draftgen", *sys.argv[1:]]
app()
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_canary_key_appears_nowhere(tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability("5. Secrets", "canary key through run (answers, every error kind, a "
                       "rejected key), dry run, probe, status, audit, export, report, -v logs, "
                       "a crash trace")
    canary = "sk-or-v1-CANARY-" + secrets.token_hex(16)
    header_canary = "hdr-CANARY-" + secrets.token_hex(8)
    env = {"DG_TEST_CANARY_KEY": canary}
    rows = prompt_rows(24) + [
        {"id": f"fault-{k}", "messages": [{"role": "user", "content": f"[[fault:{k}]] {k}"}]}
        for k in FAILURE_KINDS]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    run_dir = tmp_path / "run"
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    with TestServer(mode="openrouter", api_key=canary, prices=(0.5, 2.5), huge_body_mb=4,
                    reasoning_tokens=(5, 20), content_tokens=(5, 20)) as paid, \
         TestServer(mode="openrouter", api_key="sk-or-v1-some-other-key") as rejecting:
        keyed = {"api_key_env": "DG_TEST_CANARY_KEY", "max_retries": 1, "timeout_s": 1.0,
                 "cooldown_after": 1000, "concurrency": 8, "max_response_mb": 2}
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("rejects", "openrouter", rejecting.url, priority=0, **keyed),
            fast_backend("json", "openrouter", paid.url, priority=1,
                         headers={"X-Extra-Auth": header_canary}, **keyed),
            fast_backend("sse", "openrouter", paid.url, priority=1, stream=True, **keyed)],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 64})
        outputs["run --dry-run -v"] = draftgen("run", str(cfg), "--dry-run", "-v", env=env)
        outputs["run -v"] = draftgen("run", str(cfg), "--no-live", "-v", env=env, timeout=240)
        if has_command("probe"):
            outputs["probe -v"] = draftgen("probe", str(cfg), "-v", "--no-save", env=env)
        outputs["crash trace"] = subprocess.run(
            [sys.executable, "-c", CRASH, "run", str(cfg), "--no-live", "-v", "--no-probe"],
            capture_output=True, text=True, timeout=120, env={**_env(), **env})
    for command in (["status"], ["audit", "--json", "-j", "1"]):
        if has_command(command[0]):
            outputs[" ".join(command)] = draftgen(*command, str(run_dir), env=env)
    outputs["export parquet"] = draftgen("export", str(run_dir), "-f", "parquet", "-o",
                                         str(tmp_path / "out_parquet"), env=env)
    outputs["report -v"] = draftgen("report", str(run_dir), "-o", str(tmp_path / "report"), "-v",
                                    env=env)
    outputs["stop (no live run)"] = draftgen("stop", str(run_dir), env=env)

    # the key was really used: the paid server answered (it checks the key), the other
    # server rejected it, and every error kind was met
    records = [orjson.loads(x) for x in (run_dir / "d" / "responses.jsonl").read_bytes()
               .splitlines()]
    failures = [orjson.loads(x) for x in (run_dir / "d" / "failures.jsonl").read_bytes()
                .splitlines()]
    assert {r["backend"] for r in records} == {"json", "sse"}
    assert {f["kind"] for f in failures} >= set(FAILURE_KINDS.values()) - {"incomplete_stream"}
    said = outputs["run -v"].stderr
    assert ("backend rejects taken out of the run" in said
            or "backend rejects left out of this run by the probe" in said), said[-3000:]
    assert "Traceback" in outputs["crash trace"].stderr + outputs["crash trace"].stdout
    assert "a bug while building the request headers" in (outputs["crash trace"].stderr
                                                          + outputs["crash trace"].stdout)
    leaks = []
    for name, proc in outputs.items():
        case.runs += 1
        for secret in (canary, header_canary):
            if secret in proc.stdout or secret in proc.stderr:
                leaks.append(f"output of {name}")
    folders = [run_dir, tmp_path / "out_parquet", tmp_path / "report"]
    files = 0
    for path, content in all_bytes(*folders):
        files += 1
        for secret in (canary, header_canary):
            if secret.encode() in content:
                leaks.append(str(path.relative_to(tmp_path)))
    case.corrupt += len(leaks)  # a leak is counted as a corrupt output
    case.extra.update(commands=len(outputs), files_scanned=files, leaks=leaks, times=TIMES)
    run_json = orjson.loads((run_dir / "run.json").read_bytes())
    echoed = {b["name"]: b.get("headers") for b in run_json["config"]["backends"]}
    case.note(f"{len(outputs)} commands ({', '.join(outputs)}) and {files} files scanned: "
              f"the key appears {len(leaks)} times; run.json echoes header values as "
              f"`{echoed['json']['X-Extra-Auth']}`")
    assert not leaks, leaks
    assert echoed["json"] == {"X-Extra-Auth": "***"}
    assert all(b["api_key_env"] == "DG_TEST_CANARY_KEY" for b in run_json["config"]["backends"])


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
