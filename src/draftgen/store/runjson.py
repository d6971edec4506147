"""`RunInfo`: run.json as the readers (status, audit, export, report) and the run's own checks
read it, decoded once (`read_run_info`; `store.reader.Run.open` holds one per folder).

`store.runjson_writer` writes the file (a dict, key by key, so that a newer version's keys
survive an older writer); this is its type. Every field has a default and unknown keys are
ignored, so that a run.json written by any earlier version still reads (the first ones had no
settings, dataset totals, probe or unsettled bills); a field of the wrong type makes the whole
file damaged (`RunJsonDamaged`, naming the file and the field), the same for the writer, which
sets it aside and rebuilds it, as for the readers, which say so.

Free-form parts stay dicts: a backend's probe result (`probe.model.BackendProbe` reads it), the
sampling and format options a run was given, a session's flat `settings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import orjson

from draftgen.assets import resolve_builtin
from draftgen.store.appender import StoreError
from draftgen.store.journal import as_usd


class StoredTokenizer(msgspec.Struct, kw_only=True):
    """The tokenizer the latest session loaded."""

    path: str | None = None
    sha256: str | None = None


class StoredModel(msgspec.Struct, kw_only=True):
    name: str | None = None
    format: str | None = None
    tokenizer: str | None = None
    """The tokenizer the config named (`tokenizer.path` is where it was loaded from)."""
    format_options: dict[str, Any] | None = None


class StoredDataset(msgspec.Struct, kw_only=True):
    name: str | None = None
    turns: str | None = None
    """`first`, `last` or `all` (a trajectory, docs/trajectories.md)."""


class StoredBackend(msgspec.Struct, kw_only=True):
    name: str | None = None
    provider: dict[str, Any] | None = None
    """OpenRouter's provider routing, which audit checks who served each answer against."""


class StoredBudget(msgspec.Struct, kw_only=True):
    usd: float | None = None
    """budget.usd: the whole run's dollar budget, all sessions together."""


class StoredConfig(msgspec.Struct, kw_only=True):
    """The parts of the latest session's config (secrets removed) that the readers use."""

    model: StoredModel = msgspec.field(default_factory=StoredModel)
    budget: StoredBudget = msgspec.field(default_factory=StoredBudget)
    sampling: dict[str, Any] | None = None
    datasets: list[StoredDataset] = []
    backends: list[StoredBackend] = []
    max_attempts: int | None = None

    @property
    def dataset_names(self) -> list[str]:
        return [d.name for d in self.datasets if d.name is not None]

    @property
    def trajectory_datasets(self) -> set[str]:
        """The datasets given `turns: all`."""
        return {d.name for d in self.datasets if d.turns == "all" and d.name is not None}

    @property
    def routing(self) -> dict[str, dict[str, Any]]:
        """Each backend's provider routing, by backend name."""
        return {str(b.name): b.provider for b in self.backends if b.provider is not None}


class Summary(msgspec.Struct, kw_only=True):
    """What a session counted at its end (`run.session.Session._summary`)."""

    done_now: int | None = None
    failed_now: int | None = None
    done_total: int | None = None
    skipped_budget: int | None = None
    total: int | None = None
    output_tokens_now: int | None = None
    cost_usd_now: float | None = None
    cost_usd_total: float | None = None
    unsettled_usd: float | None = None
    """Aborted requests at their worst case, answers no disk would take at their bill."""
    cost_reports_refused: int = 0
    cost_reports_implausible: int = 0
    rescued: int = 0
    rescue_file: str | None = None

    @property
    def may_have_answered(self) -> bool:
        """Whether it leaves room for answers the session wrote (none counted: older ones)."""
        return self.done_now is None or bool(self.done_now or self.rescued)


class TemplateCheck(msgspec.Struct, kw_only=True):
    """What a session found at its start rendering the sample conversations with its format
    and with the model's own chat template (`formats.check.template_check`): a warning, not a
    refusal (a format can differ on purpose)."""

    format: str | None = None
    samples: int = 0
    differing: int = 0
    """How many of the `samples` conversations the two render differently."""
    first: str | None = None
    """The first that differs, and where ("sample: tools: first difference at token 150")."""
    matches: list[str] = []
    """The registered formats that render every sample as the template does."""
    error: str | None = None
    """Why the template could not be checked."""

    @property
    def warning(self) -> str | None:
        """The one-line warning, or None where they agree."""
        if self.error is not None:
            return f"the model's chat template cannot be checked: {self.error}"
        if not self.differing:
            return None
        matching = ""
        if self.matches:
            matching = (f"; format {self.matches[0]} renders them as the template does"
                        if len(self.matches) == 1 else
                        f"; formats {', '.join(self.matches)} render them as the template does")
        return (f"format {self.format!r} and the model's own chat template differ on "
                f"{self.differing} of {self.samples} sample conversations ({self.first})"
                f"{matching}; run `draftgen check-format CONFIG` to see where")


SETTINGS = "settings"
"""A session's key in run.json holding its `data_settings`."""


class Session(msgspec.Struct, kw_only=True):
    """One `draftgen run` on the folder, in start order (a session's index is its number)."""

    started_at: float | None = None
    stopped_at: float | None = None
    """None: running, or killed."""
    pid: int | None = None
    host: str | None = None
    argv: list[str] = []
    outcome: str | None = None
    settings: dict[str, Any] | None = None
    """The flat settings that define its answers (`data_settings`); None: written before
    sessions recorded them (the run's config then holds them)."""
    accepted_changes: list[str] = []
    """The changes of those settings it was allowed (`--accept-changed-settings`)."""
    summary: Summary | None = None
    """None: killed, or still running."""
    unsettled_usd: float | None = None
    """A killed session's paid requests without an answer, counted by the next session."""
    probe_usd: float | None = None
    probe_reserved_usd: float | None = None
    probe_unguarded_usd: float | None = None
    """The part of `probe_reserved_usd` held at the price alone (`run.session.ProbeHold`)."""
    changed_prompts: dict[str, int] | None = None
    """Answered prompts whose row changed under the same ID, per dataset, as it found them."""
    reasked_changed: bool = False
    template_check: TemplateCheck | None = None
    """Its format against the model's chat template; None: the model folder has none (or
    the session is from before this was recorded)."""
    rebuilt: bool = False
    """A placeholder for a session a damaged run.json had, rebuilt from the journal."""

    @property
    def unknown_bills_usd(self) -> float:
        """What its paid requests with no answer on disk may have cost: recorded at its end
        (`summary.unsettled_usd`), or by the next session's start for a killed one."""
        return as_usd(self.unsettled_usd) or as_usd(
            self.summary.unsettled_usd if self.summary else None)

    @property
    def probe_spent_usd(self) -> float:
        return as_usd(self.probe_usd)

    @property
    def may_have_answered(self) -> bool:
        """A killed session has no summary; answers it could not write are added by the next
        one, under its number."""
        return self.summary is None or self.summary.may_have_answered

    @property
    def changed_left(self) -> int:
        """Changed prompts it found and did not ask again."""
        return 0 if self.reasked_changed else sum((self.changed_prompts or {}).values())


class DatasetTotals(msgspec.Struct, kw_only=True):
    """A dataset's totals at the latest session's start and end (`record_datasets`)."""

    total: int | None = None
    rows: int | None = None
    bad_rows: int | None = None
    duplicates: int | None = None
    skipped_budget: int | None = None
    out_of_attempts: int | None = None


class StoredProbe(msgspec.Struct, kw_only=True):
    backends: dict[str, dict[str, Any]] = {}
    """One result per backend (`probe.model.BackendProbe.as_dict`)."""
    updated_at: float | None = None
    last_gate: dict[str, Any] | None = None
    """What the last run's probe decided: backends kept, dropped and why, spend."""
    commands_usd: float | None = None
    """What `draftgen probe` spent against this folder's backends, all such commands
    together: counted by every session against budget.usd, as the sessions' own probes are."""

    @property
    def commands_spent_usd(self) -> float:
        return as_usd(self.commands_usd)


class RunInfo(msgspec.Struct, kw_only=True):
    """run.json. An empty one (every field at its default) for a folder without the file."""

    created_at: float | None = None
    config: StoredConfig | None = None
    """The latest session's config; None in a rebuilt run.json before a session starts."""
    tokenizer: StoredTokenizer = msgspec.field(default_factory=StoredTokenizer)
    versions: dict[str, str] = {}
    sessions: list[Session] = []
    datasets: dict[str, DatasetTotals] = {}
    probe: StoredProbe | None = None
    rebuilt_from: str | None = None
    """The name the damaged file was set aside under, in a rebuilt run.json."""

    @property
    def probe_commands_usd(self) -> float:
        """What `draftgen probe` commands spent (`StoredProbe.commands_usd`)."""
        return self.probe.commands_spent_usd if self.probe is not None else 0.0

    def spent_outside_answers(self, sessions: int | None = None) -> float:
        """What the run spent beyond its datasets' files, by run.json: the probes (the
        sessions' and `draftgen probe` commands') and the requests sessions left unsettled
        (the first `sessions` sessions; None: all)."""
        return self.probe_commands_usd + sum(s.unknown_bills_usd + s.probe_spent_usd
                                             for s in self.sessions[:sessions])

    @property
    def recorded(self) -> bool:
        """Whether the file holds anything (a shard folder just created has none)."""
        return self != _EMPTY

    @property
    def stored_config(self) -> StoredConfig:
        return self.config if self.config is not None else StoredConfig()

    def settings_of(self, index: int | None = None) -> dict[str, Any] | None:
        """The settings of session `index` (default: the latest), or, for sessions from before
        they were recorded, those of the stored config; None where it holds neither."""
        if index is None and self.sessions:
            index = len(self.sessions) - 1
        if index is not None and 0 <= index < len(self.sessions):
            recorded = self.sessions[index].settings
            if recorded is not None:
                return recorded
        if self.config is None:
            return None
        return flat_settings(self.config, self.tokenizer)


_EMPTY = RunInfo()


# ---- reading -------------------------------------------------------------------------------


class RunJsonDamaged(StoreError):
    """run.json is there but is not one (truncated, empty, garbage, a field of the wrong type)."""

    def __init__(self, path: Path, why: str) -> None:
        self.path, self.why = path, why
        super().__init__(f"{path}: damaged, {why}; `draftgen run` with the run's config "
                         "rebuilds it from the journal and the answers (keeping the damaged "
                         "file beside it)")


def load_run_json(path: Path) -> tuple[dict[str, Any], RunInfo]:
    """run.json as a dict and as its type ({} and an empty one when there is none);
    RunJsonDamaged, saying how to recover, when it is not JSON or not a run.json."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}, RunInfo()
    except orjson.JSONDecodeError as e:
        raise RunJsonDamaged(path, f"not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise RunJsonDamaged(path, f"not a JSON object (a {type(data).__name__})")
    try:
        return data, msgspec.convert(data, RunInfo)
    except msgspec.ValidationError as e:
        raise RunJsonDamaged(path, f"not a run.json: {e}") from None


def read_run_info(path: Path) -> RunInfo:
    """run.json decoded (an empty one when there is none); RunJsonDamaged as `load_run_json`."""
    return load_run_json(path)[1]


# ---- the settings that define the data ------------------------------------------------------


def flat_settings(config: StoredConfig, tokenizer: StoredTokenizer) -> dict[str, Any]:
    """What defines the answers a session writes, as flat dotted keys: the model, its format
    and the format's (chat template's) options, the tokenizer's hash and path, the sampling.
    Concurrency, backends' URLs, budgets and the like do not change an answer's meaning."""
    model = config.model
    flat: dict[str, Any] = {"model.name": model.name, "model.format": model.format}
    _flatten("model.format_options", model.format_options, flat)
    flat["tokenizer.sha256"] = tokenizer.sha256
    flat["tokenizer.path"] = tokenizer.path
    _flatten("sampling", config.sampling, flat)
    return flat


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


NOT_DATA = frozenset({"tokenizer.path"})
"""Kept with a session's settings (where its tokenizer was) but free to change: the same file
moved is the same tokenizer (its hash says so)."""


def changed_settings(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each data-defining key whose value differs, as "key: old → new"."""
    keys = [k for k in dict.fromkeys([*before, *now]) if k not in NOT_DATA]
    return [f"{k}: {_shown(k, before.get(k))} → {_shown(k, now.get(k))}"
            for k in keys if before.get(k) != now.get(k)]


def _shown(key: str, value: Any) -> str:
    if key == "tokenizer.sha256" and isinstance(value, str):
        return value[:12] + "…"
    return orjson.dumps(value).decode() if value is not None else "(unset)"


_OPTIONS = "model.format_options."


@dataclass(frozen=True)
class SessionModel:
    """A session's format, format options and tokenizer, from its flat settings."""

    format: str | None
    options: dict[str, Any]
    tokenizer_sha256: str | None
    tokenizer_path: str | None

    @classmethod
    def of(cls, settings: dict[str, Any]) -> SessionModel:
        options: dict[str, Any] = {}
        for key, value in settings.items():
            if key.startswith(_OPTIONS):
                *parents, leaf = key[len(_OPTIONS):].split(".")
                node = options
                for name in parents:
                    node = node.setdefault(name, {})
                node[leaf] = value
        return cls(_str(settings.get("model.format")), options,
                   _str(settings.get("tokenizer.sha256")), _str(settings.get("tokenizer.path")))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# ---- the run's tokenizer and format (audit, export, report) ----------------------------------

TOKENIZERS = ".tokenizers"
"""RUN/.tokenizers/<sha256>/ (hidden: no dataset can be named so): a copy of each tokenizer a
session of the run used (its tokenizer.json and the files beside it a format reads, such as
tokenizer_config.json), so that audit and export decode every session's IDs with that
session's tokenizer even after the file at its path changed."""


def kept_tokenizer(root: Path, sha256: str | None) -> Path | None:
    """The run folder's copy of the tokenizer.json whose hash is `sha256`, if it keeps one."""
    if not isinstance(sha256, str) or not sha256.isalnum():
        return None
    path = root / TOKENIZERS / sha256 / "tokenizer.json"
    return path if path.is_file() else None


def tokenizer_source(root: Path, sha256: str | None, path: str | None) -> str | None:
    """Where the tokenizer with hash `sha256` that a session of the run folder `root` used can
    be loaded: the folder's copy, else the path it was at (which may hold another file now:
    the caller compares hashes)."""
    kept = kept_tokenizer(root, sha256)
    return str(kept) if kept else (path if isinstance(path, str) and path else None)


@dataclass(frozen=True)
class RunModel:
    """The model format, its options and the tokenizer a run folder's latest session used,
    as audit and export load them."""

    format: str | None
    """None: run.json names none (config.model.format)."""
    options: dict[str, Any]
    tokenizer: str | None
    """Where to load the tokenizer: the one given instead, else the run folder's copy of the
    recorded one, else the path run.json records, else the config's (`builtin:` names
    resolved); None: run.json names none."""
    sha256: str | None
    """The recorded tokenizer's hash (None where another tokenizer was given)."""


def run_model(info: RunInfo, root: Path | None = None, override: Path | None = None
              ) -> RunModel:
    model = info.stored_config.model
    sha = info.tokenizer.sha256
    kept = kept_tokenizer(root, sha) if root is not None else None
    path = str(override) if override else next(
        (resolve_builtin(c) for c in (kept and str(kept), info.tokenizer.path, model.tokenizer)
         if c), None)
    return RunModel(model.format, dict(model.format_options or {}), path,
                    None if override else sha)
