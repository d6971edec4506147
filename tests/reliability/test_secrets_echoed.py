"""5. Secrets: servers that echo the request's Authorization header in their error bodies (a
500, an error inside a 200, an SSE error event, a 401), and a key given in the backend's URL
(`http://user:KEY@host`). The keys appear in no file of the run folder and in no output; where
the echo was, `***` stands."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import orjson
import pytest

from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, write_config
from tests.reliability.helpers import all_bytes, draftgen, no_probe, prompt_rows, write_jsonl

ECHOED_FAULTS = ("500", "error_body", "sse_error")


def _with_credentials(url: str, user: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user}:{password}@{rest}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_echoed_keys_and_url_credentials_appear_nowhere(tmp_path: Path, qwen3_dir: Path,
                                                        reliability) -> None:
    case = reliability("5. Secrets", "servers echoing the Authorization header (500, error in "
                       "a 200, SSE error event, 401) and a key in the backend URL "
                       "(`http://user:KEY@host`): run -v, dry run, status, status --json")
    key = "sk-or-v1-CANARY-" + secrets.token_hex(16)
    url_key = "urlkey-CANARY-" + secrets.token_hex(8)
    env = {"DG_TEST_CANARY_KEY": key}
    rows = prompt_rows(12) + [
        {"id": f"fault-{k}", "messages": [{"role": "user", "content": f"[[fault:{k}]] {k}"}]}
        for k in ECHOED_FAULTS]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    run_dir = tmp_path / "run"
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    with TestServer(mode="openrouter", api_key=key, echo_auth=True) as keyed, \
         TestServer(mode="openrouter", api_key="sk-or-v1-some-other-key", echo_auth=True
                    ) as rejecting, \
         TestServer(echo_auth=True) as open_server:
        retry = {"max_retries": 0, "cooldown_after": 1000, "concurrency": 4}
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("rejects", "openrouter", rejecting.url, priority=0,
                         api_key_env="DG_TEST_CANARY_KEY", **retry),
            fast_backend("json", "openrouter", keyed.url, priority=1,
                         api_key_env="DG_TEST_CANARY_KEY", **retry),
            fast_backend("sse", "openrouter", keyed.url, priority=1, stream=True,
                         api_key_env="DG_TEST_CANARY_KEY", **retry),
            fast_backend("in_url", "openai", _with_credentials(open_server.url, "me", url_key),
                         priority=1, **retry)],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 64})
        outputs["run --dry-run"] = draftgen("run", str(cfg), "--dry-run", env=env)
        outputs["run -v"] = draftgen("run", str(cfg), "--no-live", "-v", *no_probe(), env=env,
                                     timeout=240)
        used_url_key = open_server.stats["requests"].get("chat", 0)
    outputs["status"] = draftgen("status", str(run_dir), env=env)
    outputs["status --json"] = draftgen("status", str(run_dir), "--json", env=env)

    failures = [orjson.loads(x) for x in (run_dir / "d" / "failures.jsonl").read_bytes()
                .splitlines()]
    records = (run_dir / "d" / "responses.jsonl").read_bytes().splitlines()
    # the echoes really happened: the servers sent the key back, draftgen shows `***`
    echoed = [f["message"] for f in failures if "Authorization: " in f["message"]]
    said = outputs["run -v"].stderr
    leaks = [f"output of {name}" for name, proc in outputs.items()
             for secret in (key, url_key) if secret in proc.stdout + proc.stderr]
    files = 0
    for path, content in all_bytes(run_dir):
        files += 1
        leaks += [str(path.relative_to(tmp_path)) for secret in (key, url_key)
                  if secret.encode() in content]
    url_shown = orjson.loads((run_dir / "run.json").read_bytes())["config"]["backends"][3]["url"]
    case.runs = len(outputs)
    case.corrupt = len(leaks)  # a leak is counted as a corrupt output
    case.extra.update(leaks=leaks, files_scanned=files)
    case.note(f"{len(outputs)} commands and {files} files scanned: the keys appear "
              f"{len(leaks)} times; {len(echoed)} failures held an echoed header, e.g. "
              f"`{echoed[0] if echoed else ''}`; run.json shows the URL as `{url_shown}`")
    assert outputs["run -v"].returncode == 0, said[-3000:]
    assert used_url_key > 0 and len(records) == 12
    assert len(echoed) == len(ECHOED_FAULTS), failures
    assert all("Authorization: Bearer ***" in m or "Authorization: Basic ***" in m
               for m in echoed), echoed
    assert "backend rejects taken out of the run" in said, said[-3000:]
    assert "Bearer ***" in said  # the 401's echo, on stderr
    assert not leaks, leaks
    assert url_shown.startswith("http://***@127.0.0.1:")
