"""3. Bad input: each bad dataset, config or endpoint is met on a run folder that already
holds answers (a good run first, then the bad one on a copy of it). Each gives a clear message
naming the file, row or key, exits or skips as appropriate, and leaves every answer already
written as it was."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.reliability.helpers import (
    DRAFTGEN,
    Base,
    ServerProcess,
    check_folder,
    completed_run,
    draftgen,
    merge_config,
    no_probe,
    prompt_rows,
    write_jsonl,
)

pytestmark = pytest.mark.slow  # one `draftgen run` subprocess each

SCENARIO = "3. Bad input"
GOOD = 20


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Iterator[Base]:
    """A run folder holding GOOD answers from a good run."""
    with completed_run(tmp_path_factory.mktemp("bad_input"), qwen3_dir, prompt_rows(GOOD, "g"),
                       latency_s=0.01, tokens=(5, 20), max_tokens=64) as base:
        yield base


def _bad_run(base: Base, tmp_path: Path, *, extra_lines: list[bytes] = (), new_rows: int = 3,
             cfg: dict[str, Any] | None = None, env: dict[str, str] | None = None,
             timeout: float = 120, args: tuple[str, ...] = (),
             damage: Callable[[Path], None] | None = None) -> tuple[Any, Path, bytes, Path]:
    """Copy the good run folder (and `damage` the copy), write a dataset (the good rows, new
    good rows, the bad lines), run `draftgen run` on the copy. Returns the process, the run
    folder, the bytes of responses.jsonl before, and the dataset path."""
    run_dir = tmp_path / "run"
    shutil.copytree(base.run_dir, run_dir)
    if damage is not None:
        damage(run_dir)
    before = (run_dir / "d" / "responses.jsonl").read_bytes()
    data = tmp_path / "d.jsonl"
    good = b"".join(orjson.dumps(r) + b"\n" for r in prompt_rows(GOOD, "g"))
    new = b"".join(orjson.dumps(r) + b"\n" for r in prompt_rows(new_rows, "n"))
    data.write_bytes(good + b"".join(line + b"\n" for line in extra_lines) + new)
    config = {**base.cfg, "output_dir": str(run_dir),
              "datasets": [{"name": "d", "path": str(data)}]}
    if cfg:
        config = merge_config(config, cfg)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = draftgen("run", str(path), "--no-live", *args, env=env, timeout=timeout)
    return proc, run_dir, before, data


def _intact(case: Any, proc: Any, run_dir: Path, before: bytes) -> None:
    """What every bad-input case must keep: old answers byte for byte, every line whole, no
    duplicate, no traceback."""
    after = (run_dir / "d" / "responses.jsonl").read_bytes()
    check = check_folder(run_dir)
    case.runs += 1
    case.lost += sum(1 for line in before.splitlines() if line not in after)
    case.corrupt += len(check.corrupt) + (not after.startswith(before))
    case.duplicated += check.duplicated
    case.crashed += "Traceback" in proc.stderr or proc.returncode not in (0, 1, 2)
    assert after.startswith(before), "answers written before were changed"
    assert not check.corrupt and not check.duplicated
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _answered(run_dir: Path) -> set[str]:
    return {i.split("/", 1)[1] for i in check_folder(run_dir).ids("d")}


BAD_ROWS: list[tuple[str, list[bytes], str | None]] = [
    ("malformed JSONL lines", [b'{"messages": [{"role": "user", "content": "unterminated',
                               b"not json at all", b'{"prompt": "x",}'], "not valid JSON"),
    ("wrong types", [b'{"messages": "not a list"}', b'{"prompt": 42}',
                     b'{"messages": [{"role": "user", "content": 5}]}', b"[1, 2, 3]",
                     b'"just a string"'], None),
    ("empty prompts", [b'{"prompt": ""}', b'{"messages": [{"role": "user", "content": "  "}]}',
                       b'{"messages": []}'], None),
    ("non-UTF-8 bytes", [b'{"prompt": "caf\xe9 au lait"}', b'{"prompt": "\xff\xfe"}'],
     "not UTF-8"),
    ("rows of an unknown schema", [b'{"foo": "bar"}', b'{"text_a": "x", "label": 1}'], None),
]


@pytest.mark.parametrize("kinds", [BAD_ROWS[:2], BAD_ROWS[2:]], ids=["json-types", "content"])
def test_bad_rows_are_named_and_skipped(base: Base, tmp_path: Path, reliability,
                                        kinds: list[tuple[str, list[bytes], str | None]]) -> None:
    """Kinds of bad rows in one dataset, one run (the log names the first 10 bad rows): each
    row named by file:line (and why), skipped; the good rows around them answered."""
    cases = [reliability(SCENARIO, f"{what}: each row named by file:line (and why) in the log "
                         "and skipped; the rest answered") for what, _, _ in kinds]
    lines = [line for _, group, _ in kinds for line in group]
    assert len(lines) <= 10
    proc, run_dir, before, data = _bad_run(base, tmp_path, extra_lines=lines)
    for case in cases:
        _intact(case, proc, run_dir, before)
    assert proc.returncode == 0, proc.stderr[-2000:]
    n = GOOD + 1
    for case, (_what, group, reason) in zip(cases, kinds, strict=True):
        named = [x for x in proc.stderr.splitlines()
                 if any(f"{data}:{i} " in x or x.endswith(f"{data}:{i}")
                        or f"{data}:{i}:" in x for i in range(n, n + len(group)))]
        case.note(f"exit {proc.returncode}; {len(named)}/{len(group)} rows named, e.g. "
                  f"`{named[0].split(' ', 2)[-1] if named else ''}`; the {GOOD} earlier "
                  "answers untouched")
        assert len(named) == len(group), (group, proc.stderr[-3000:])
        assert reason is None or all(reason in x for x in named), named
        n += len(group)
    assert _answered(run_dir) == {f"g{i}" for i in range(GOOD)} | {"n0", "n1", "n2"}


def test_a_dataset_of_nothing_but_unknown_rows(base: Base, tmp_path: Path, reliability) -> None:
    case = reliability(SCENARIO, "a dataset whose every row has an unknown schema: named, "
                       "'no prompts to send', the other dataset carries on")
    other = write_jsonl(tmp_path / "u.jsonl", [{"foo": i} for i in range(5)])
    cfg = {"datasets": [{"name": "d", "path": str(tmp_path / "d.jsonl")},
                        {"name": "u", "path": str(other)}]}
    proc, run_dir, before, _ = _bad_run(base, tmp_path, cfg=cfg)
    _intact(case, proc, run_dir, before)
    case.note(f"exit {proc.returncode}; `u: no prompts to send (5 rows → 0 prompts (5 bad …))`")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{other}:1" in proc.stderr and "u: no prompts to send" in proc.stderr


@pytest.mark.parametrize("what,cfg,rc,message", [
    ("missing dataset file", {"datasets": [{"name": "d", "path": "/nonexistent/d.jsonl"}]}, 2,
     "/nonexistent/d.jsonl: no such file or folder"),
    ("missing dataset file with rich markup in its name",
     {"datasets": [{"name": "d", "path": "/nonexistent/[bold]d.jsonl"}]}, 2,
     "/nonexistent/[bold]d.jsonl: no such file or folder"),
    ("dataset path typo that looks like a hub name",
     {"datasets": [{"name": "d", "path": "data/chta.jsonl"}]}, 2,
     "data/chta.jsonl: no such file or folder"),
    ("unknown dataset file format", {"datasets": [{"name": "d", "path": "__CSV__"}]}, 2,
     "unknown dataset format"),
    ("config key typo", {"backends": [{"name": "local", "type": "sglang",
                                       "url": "http://127.0.0.1:9", "concurency": 4}]}, 2,
     "backends.0.concurency: unknown key; did you mean `concurrency`?"),
    ("wrong type in the config", {"sampling": {"max_tokens": "lots"}}, 2,
     "sampling.max_tokens: Input should be a valid integer"),
    ("max_tokens: 1e20 (a float)", {"sampling": {"max_tokens": 1e20}}, 2,
     "sampling.max_tokens: Input should be a valid integer"),
    ("max_tokens past any engine's 32-bit count", {"sampling": {"max_tokens": 2**40}}, 2,
     "sampling.max_tokens: Input should be less than or equal to 2147483647"),
    ("sampling.extra that is no JSON (a YAML !!set)", {"sampling": {"extra": {"x": {1, 2}}}},
     2, "sampling.extra: cannot be sent as JSON"),
    ("concurrency: true", {"backends": [{"name": "local", "type": "sglang",
                                          "url": "http://127.0.0.1:9", "concurrency": True}]},
     2, "backends.0.concurrency: Input should be a valid integer"),
    ("missing env var for the API key", {"backends": [{
        "name": "or", "type": "openrouter", "url": "http://127.0.0.1:9",
        "api_key_env": "DRAFTGEN_TEST_SURELY_UNSET_KEY"}]}, 2,
     "environment variable DRAFTGEN_TEST_SURELY_UNSET_KEY (api_key_env) is not set"),
])
def test_bad_config_exits_with_the_key_named(base: Base, tmp_path: Path, reliability, what: str,
                                             cfg: dict[str, Any], rc: int, message: str) -> None:
    case = reliability(SCENARIO, f"{what}: exit {rc}, the file/key named, nothing sent")
    if cfg.get("datasets", [{}])[0].get("path") == "__CSV__":
        (tmp_path / "d.csv").write_text("prompt\nhello\n")
        cfg = {"datasets": [{"name": "d", "path": str(tmp_path / "d.csv")}]}
    sent = sum(base.server.stats["requests"].values())
    proc, run_dir, before, _ = _bad_run(base, tmp_path, cfg=cfg)
    _intact(case, proc, run_dir, before)
    said = " ".join(x.strip() for x in proc.stderr.strip().splitlines())
    case.note(f"exit {proc.returncode}: `{said[:250]}`")
    assert proc.returncode == rc, proc.stderr
    assert message in proc.stderr, proc.stderr
    if what == "config key typo":
        assert "run.yaml" in proc.stderr
    assert sum(base.server.stats["requests"].values()) == sent


def test_prompt_over_the_context_is_recorded_not_sent(base: Base, tmp_path: Path,
                                                      reliability) -> None:
    case = reliability(SCENARIO, "a prompt over model.context_length: recorded as failed "
                       "(`prompt_too_long`, file:line named), never sent")
    long_row = orjson.dumps({"id": "long", "prompt": "word " * 400})
    proc, run_dir, before, data = _bad_run(base, tmp_path, extra_lines=[long_row],
                                           cfg={"model": {"context_length": 256}})
    _intact(case, proc, run_dir, before)
    failures = check_folder(run_dir).failed["d"]
    case.note(f"exit {proc.returncode}; failures.jsonl: `{failures[0]['message']}`")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [(f["id"], f["kind"]) for f in failures] == [("d/long", "prompt_too_long")]
    assert f"{data}:{GOOD + 1}" in failures[0]["message"]
    assert not any("word word" in label for label in base.server.stats["per_prompt"])
    assert _answered(run_dir) >= {"n0", "n1", "n2"}


def test_a_100_mb_line(base: Base, tmp_path: Path, reliability) -> None:
    case = reliability(SCENARIO, "a 100 MB line (one 100 MB prompt): refused as "
                       "`prompt_too_long` without tokenizing it, the rest answered")
    huge = b'{"id": "huge", "prompt": "' + b"word " * (20 * 1024 * 1024) + b'"}'
    t0 = time.monotonic()
    proc, run_dir, before, data = _bad_run(base, tmp_path, extra_lines=[huge],
                                           cfg={"model": {"context_length": 32768}})
    wall = time.monotonic() - t0
    _intact(case, proc, run_dir, before)
    failures = check_folder(run_dir).failed["d"]
    case.note(f"exit {proc.returncode} after {wall:.0f}s; `{failures[0]['message']}`")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [(f["id"], f["kind"]) for f in failures] == [("d/huge", "prompt_too_long")]
    assert f"{data}:{GOOD + 1}" in failures[0]["message"]
    assert _answered(run_dir) >= {"n0", "n1", "n2"}
    assert wall < 60


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("probe", [True, False], ids=["probe", "no-probe"])
def test_an_unreachable_url(base: Base, tmp_path: Path, reliability, probe: bool) -> None:
    how = "with the probe" if probe else "with --no-probe"
    case = reliability(SCENARIO, f"an unreachable URL (connection refused; {how}): refused "
                       "at start in one line naming the URL, nothing sent, nothing lost")
    if not probe and not no_probe():
        pytest.skip("draftgen run has no probe to skip")
    port = _closed_port()
    cfg = {"backends": [{"name": "gone", "type": "openai", "url": f"http://127.0.0.1:{port}",
                         "max_retries": 1, "backoff_base_s": 0.01, "backoff_max_s": 0.1,
                         "concurrency": 2}]}
    t0 = time.monotonic()
    proc, run_dir, before, _ = _bad_run(base, tmp_path, cfg=cfg,
                                        args=() if probe else no_probe())
    wall = time.monotonic() - t0
    _intact(case, proc, run_dir, before)
    failures = check_folder(run_dir).failed.get("d", [])
    first = next((x for x in proc.stderr.splitlines() if str(port) in x), "")
    case.note(f"exit {proc.returncode} after {wall:.0f}s; {len(failures)} prompts recorded as "
              f"failed; `{first.strip()[:200]}`")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"http://127.0.0.1:{port}: connection refused" in first
    assert "unsafe" not in proc.stderr
    assert not failures  # the three new prompts stay pending, their attempts not spent
    assert wall < 60


@pytest.mark.parametrize("what,content", [
    ("truncated", None), ("empty", b""), ("garbage", b"\x00\xff garbage {"),
    ("not an object", b"[1, 2]")])
def test_a_damaged_run_json(base: Base, tmp_path: Path, reliability, what: str,
                            content: bytes | None) -> None:
    case = reliability(SCENARIO, f"a {what} run.json: status, audit and export name it and "
                       "say how to recover; `draftgen run` sets it aside and rebuilds it")
    original = (base.run_dir / "run.json").read_bytes()
    bad = original[: len(original) // 2] if content is None else content

    def damage(run_dir: Path) -> None:
        (run_dir / "run.json").write_bytes(bad)
        for command in (("status",), ("audit",), ("export", "-f", "parquet", "-o",
                                                   str(tmp_path / "out"))):
            proc = draftgen(*command, str(run_dir))
            case.crashed += "Traceback" in proc.stderr
            assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
            assert proc.returncode in (1, 2), proc.stderr
            assert f"{run_dir / 'run.json'}: damaged" in proc.stderr, proc.stderr
            assert "`draftgen run` with the run's config rebuilds it" in proc.stderr

    proc, run_dir, before, _ = _bad_run(base, tmp_path, damage=damage)
    _intact(case, proc, run_dir, before)
    kept = sorted(run_dir.glob("run.json.damaged-*"))
    said = next((x for x in proc.stderr.splitlines() if "run.json: damaged" in x), "")
    case.note(f"exit {proc.returncode}; `{said.split(' ', 2)[-1][:200]}`")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.read_bytes() for p in kept] == [bad], "the damaged file was not kept as it was"
    assert "rebuilt" in said
    assert _answered(run_dir) == {f"g{i}" for i in range(GOOD)} | {"n0", "n1", "n2"}
    status = draftgen("status", "--json", str(run_dir))
    assert status.returncode == 0, status.stderr
    assert orjson.loads(status.stdout)["total"]["done"] == GOOD + 3


def test_a_dataset_reordered_with_the_same_size_and_mtime(base: Base, tmp_path: Path,
                                                          reliability) -> None:
    case = reliability(SCENARIO, "a dataset reordered keeping its size and mtime (the prompt "
                       "cache's key cannot tell): found at load, read in full, the run completes")
    rows = prompt_rows(GOOD, "g") + prompt_rows(4, "n")
    proc, run_dir, before, data = _bad_run(
        base, tmp_path, new_rows=4, args=no_probe(), cfg={"datasets": [
            {"name": "d", "path": str(tmp_path / "d.jsonl"), "max_prompts": GOOD + 1}]})
    assert proc.returncode == 0, proc.stderr[-3000:]
    stat = data.stat()
    rows[-3:] = rows[-3:][::-1]  # n1, n2, n3 reversed: same size, IDs at other offsets
    write_jsonl(data, rows)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    path = tmp_path / "run.yaml"
    config = yaml.safe_load(path.read_text())
    config["datasets"] = [{"name": "d", "path": str(data)}]
    path.write_text(yaml.safe_dump(config))
    proc = draftgen("run", str(path), "--no-live", *no_probe())
    _intact(case, proc, run_dir, before)
    said = next((x for x in proc.stderr.splitlines() if f"{data}:" in x), "")
    case.note(f"exit {proc.returncode}: `{said.split(' ', 2)[-1][:250]}`")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reading it in full" in said, proc.stderr[-3000:]
    assert _answered(run_dir) == {f"g{i}" for i in range(GOOD)} | {f"n{i}" for i in range(4)}


@contextlib.contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """`folder` read-only for this user: a read-only bind mount for root (who ignores
    permission bits), the permission bits for anyone else."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
        for p in modes:
            p.chmod(p.stat().st_mode & ~0o222)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    if subprocess.run(["mount", "--bind", str(folder), str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here to make a folder read-only")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot remount a bind mount read-only here")
        yield
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.mark.parametrize("what", ["report on a read-only run folder", "report --out FILE",
                                  "stop FILE", "audit --quarantine FILE"])
def test_a_command_on_the_wrong_kind_of_path(base: Base, tmp_path: Path, reliability,
                                             what: str) -> None:
    case = reliability(SCENARIO, f"{what}: exit 2, the path named and what to do")
    run_dir = tmp_path / "run"
    shutil.copytree(base.run_dir, run_dir)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    if what.startswith("report on"):
        with _read_only(run_dir):
            proc = draftgen("report", str(run_dir))
        named = str(run_dir / "report")
    else:
        args = {"report --out FILE": ("report", str(run_dir), "--out", str(a_file)),
                "stop FILE": ("stop", str(a_file)),
                "audit --quarantine FILE": ("audit", "--quarantine", str(a_file))}[what]
        proc = draftgen(*args)
        named = str(a_file)
    said = proc.stderr.strip()
    case.runs += 1
    case.crashed += "Traceback" in proc.stderr or proc.returncode != 2
    case.note(f"exit {proc.returncode}: `{said.splitlines()[-1][:250] if said else ''}`")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2 and len(said.splitlines()) == 1, said
    assert named in said, said
    assert a_file.read_text() == "mine\n"


@pytest.mark.parametrize("below", [False, True], ids=["file", "under-a-file"])
def test_an_output_dir_that_is_a_file(base: Base, tmp_path: Path, reliability,
                                      below: bool) -> None:
    case = reliability(SCENARIO, "output_dir naming a file" + (" (or a folder under one)"
                       if below else "") + ": exit 2, the file named, the file untouched")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    cfg = {"output_dir": str(a_file / "run" if below else a_file)}
    proc, run_dir, before, _ = _bad_run(base, tmp_path, cfg=cfg, args=no_probe())
    _intact(case, proc, run_dir, before)
    said = proc.stderr.strip()
    case.note(f"exit {proc.returncode}: `{said[:250]}`")
    assert proc.returncode == 2 and said.count("\n") == 0, said
    assert f"{a_file}: a file, not a folder" in said, said
    assert a_file.read_text() == "mine\n"


BOMB = "".join(f"      {x}: &{x} [{', '.join([f'*{p}' if p else '0' for _ in range(9)])}]\n"
               for p, x in zip(["", *"abcdefgh"], "abcdefghi", strict=True))
"""A billion values in under 1 kB: each line lists the line above nine times."""


@pytest.mark.parametrize("what,tail,message", [
    ("a key written twice", "budget:\n  usd: 5\n  usd: 50\n",
     ":{line2}: key 'usd' is written twice (first at line {line1}); keep one"),
    ("an anchor bomb in sampling.extra", "sampling:\n  max_tokens: 64\n  extra:\n"
     "    bomb:\n" + BOMB, ": sampling.extra.bomb: the config expands to more than"),
])
def test_a_config_yaml_refused_before_use(base: Base, tmp_path: Path, reliability, what: str,
                                          tail: str, message: str) -> None:
    case = reliability(SCENARIO, f"{what} in run.yaml: `--dry-run` and `run` refuse it at once "
                       "(exit 2, the file, key and line named)")
    config = {k: v for k, v in base.cfg.items() if k != "sampling"}
    head = yaml.safe_dump({**config, "output_dir": str(tmp_path / "run")})
    path = tmp_path / "run.yaml"
    path.write_text(head + tail)
    first = head.count("\n") + 2
    message = message.format(line1=first, line2=first + 1)
    for args in (("--dry-run",), ("--no-live", *no_probe())):
        t0 = time.monotonic()
        proc = draftgen("run", str(path), *args, timeout=60)
        wall = time.monotonic() - t0
        said = proc.stderr.strip()
        case.runs += 1
        case.crashed += "Traceback" in proc.stderr or proc.returncode != 2
        case.note(f"run {' '.join(args)}: exit {proc.returncode} after {wall:.1f}s: "
                  f"`{said[:200]}`")
        assert proc.returncode == 2 and "\n" not in said, said[-3000:]
        assert f"{path}{message}" in said, said
        assert wall < 30
    assert not (tmp_path / "run").exists()


def _signalled_during_probe(args: list[str], sig: signal.Signals) -> tuple[int, str]:
    """`draftgen ARGS`, sent `sig` once its probe has a request in flight: exit code, stderr."""
    proc = subprocess.Popen(
        [*DRAFTGEN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    assert proc.stderr is not None
    said = ""
    while "probing backend" not in said and proc.poll() is None:
        said += proc.stderr.readline()
    time.sleep(0.5)  # the probe's first request waits on the server's latency
    proc.send_signal(sig)
    rest = proc.stderr.read()
    return proc.wait(timeout=60), said + rest


@pytest.mark.parametrize("command", ["probe", "run"])
def test_sigterm_and_sigint_during_the_probe_are_alike(base: Base, tmp_path: Path,
                                                      reliability, command: str) -> None:
    case = reliability(SCENARIO, f"SIGTERM or SIGINT while `draftgen {command}` probes: the "
                       "same exit and message, nothing lost, no traceback")
    endings: dict[str, tuple[int, str]] = {}
    with ServerProcess("--latency", "3") as server:
        for sig in (signal.SIGTERM, signal.SIGINT):
            folder = tmp_path / sig.name
            folder.mkdir()
            cfg = {"backends": [{"name": "slow", "type": "openai", "url": server.url}]}
            proc, run_dir, before, _ = _bad_run(base, folder, cfg=cfg, args=("--dry-run",))
            assert proc.returncode == 0, proc.stderr[-2000:]
            args = [command, str(folder / "run.yaml")] + (["--no-live"] if command == "run"
                                                          else [])
            code, said = _signalled_during_probe(args, sig)
            case.runs += 1
            case.crashed += "Traceback" in said or code not in (0, 130)
            last = said.strip().splitlines()[-1] if said.strip() else ""
            case.note(f"{sig.name}: exit {code}, `{last[:200]}`")
            assert "Traceback" not in said, said[-3000:]
            assert (run_dir / "d" / "responses.jsonl").read_bytes() == before
            endings[sig.name] = (code, last.replace(sig.name, "SIGNAL"))
    assert endings["SIGTERM"] == endings["SIGINT"], endings
    assert endings["SIGTERM"][0] in (0, 130)


EVIL_PROVIDER = "\x1b[2J\x1b[31mEvil[bold]Co\x1b[0m\x1b]0;pwned\x07\u202e"
"""Clears the screen, colours, sets the window title, reverses the text: all to be dropped."""


def test_terminal_escapes_from_a_server_are_never_printed(base: Base, tmp_path: Path,
                                                          reliability) -> None:
    case = reliability(SCENARIO, "a provider name carrying terminal escapes and rich markup: "
                       "audit, status, report and probe print it inert")
    with ServerProcess("--providers", EVIL_PROVIDER) as server:
        cfg = {"backends": [{"name": "evil", "type": "openai", "url": server.url}]}
        proc, run_dir, before, _ = _bad_run(base, tmp_path, cfg=cfg, args=no_probe())
        _intact(case, proc, run_dir, before)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs = {
            "audit": draftgen("audit", str(run_dir), "--all-checks", env={"COLUMNS": "200"}),
            "status": draftgen("status", str(run_dir), "--wide", env={"COLUMNS": "200"}),
            "report": draftgen("report", str(run_dir), "--out", str(tmp_path / "report")),
            "probe": draftgen("probe", str(tmp_path / "run.yaml"), "--no-save",
                              env={"COLUMNS": "300"}),
        }
    page = (tmp_path / "report" / "index.html").read_text()
    for command, out in {**outputs, "report page": page}.items():
        text = out if isinstance(out, str) else out.stdout + out.stderr
        raw = [c for c in ("\x1b", "\x07", "\u202e") if c in text]
        case.runs += 1
        case.crashed += bool(raw) or "Traceback" in text
        case.note(f"{command}: {'escapes printed raw: ' + repr(raw) if raw else 'inert'}")
        assert not raw, (command, text[-2000:])
        if command in ("audit", "status", "probe"):  # they show it (report: in a PNG)
            assert "Evil[bold]Co" in text, (command, text[-2000:])
