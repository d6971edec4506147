"""run.yaml, validated: the run-level models. Each backend type's model lives in its module
(`config/backends.py`: the types run.yaml's `type` picks). Secrets never live here: a backend
names the env var that holds its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from draftgen.assets import resolve_builtin
from draftgen.config.backends import BackendConfig, backend_error
from draftgen.config.base import (
    TOKENS_MAX,
    ConfigError,
    StrictModel,
    error_text,
    refuse_managed_keys,
    unknown_key,
)
from draftgen.redact import REDACTED, redact_value

RESERVED_FOLDERS = frozenset({"shards"})
"""Folders of a run folder that are not datasets (`store.layout.SHARDS_DIR`): no dataset may
take their names."""
MAX_CONFIG_VALUES = 100_000
"""A config expanding to more values than this (YAML aliases repeated: an "anchor bomb") is
refused before anything uses it: a real run.yaml has a few hundred."""


class ModelConfig(StrictModel):
    name: str
    """Sent as "model" to OpenAI-compatible backends."""
    format: str
    """Model family: a key of the formats registry (qwen3, qwen3-thinking, ...)."""
    tokenizer: str
    """A tokenizer.json file, or a HF tokenizer folder (one without tokenizer.json, such as
    Kimi's tiktoken tokenizer, loads through transformers with trust_remote_code), or a
    Hugging Face Hub repo ID (`Qwen/Qwen3-8B`, `Qwen/Qwen3-8B@<revision>`; a path of that
    name wins): its tokenizer files only are fetched into the Hub cache (`HF_HUB_CACHE`);
    with `HF_HUB_OFFLINE=1` the cache is read, never the network."""
    format_options: dict[str, Any] = Field(default_factory=dict)
    """Options of the model format (e.g. kimi-k2.5 {thinking: false}; chat-template
    {stop_token, end_think_token, ...})."""
    context_length: int | None = Field(None, gt=0, le=TOKENS_MAX)
    """The model's context in tokens, if known: a prompt whose rendered length leaves no room
    for one answer token is recorded as failed (`prompt_too_long`) and never sent."""

    @field_validator("tokenizer")
    @classmethod
    def _resolve_tokenizer(cls, path: str) -> str:
        return resolve_builtin(path)


class SamplingConfig(StrictModel):
    temperature: float | None = 0.6
    """Sampling temperature (null: the server's default)."""
    top_p: float | None = 0.95
    """Nucleus sampling (null: the server's default)."""
    top_k: int | None = None
    """Top-k sampling (null: the server's default)."""
    max_tokens: int = Field(4096, gt=0, le=TOKENS_MAX)
    """The most output tokens of one answer: what the token and dollar budgets reserve before a
    request is sent (cut to what a dataset's token budget has left). At most
    `model.context_length` and each dataset's `max_output_tokens` (where given, for the
    datasets it applies to); one answer's worst case at it must fit in `budget.usd`."""
    seed: int | None = None
    """Sent as the request's seed; also seeds the `sampling_mix` draw."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Extra fields merged into every request body (OpenAI) or sampling_params (SGLang); not
    the keys draftgen sets itself (MANAGED_BODY_KEYS)."""

    _no_managed_keys = field_validator("extra")(refuse_managed_keys)


class SamplingChoice(StrictModel):
    """One weighted setting of a dataset's `sampling_mix`: the sampling keys it sets replace
    the run's `sampling` ones for the conversations that draw it."""

    weight: float = Field(gt=0)
    """How often this choice is drawn, relative to the others' weights."""
    temperature: float | None = None
    """Replaces `sampling.temperature`."""
    top_p: float | None = None
    """Replaces `sampling.top_p`."""
    top_k: int | None = None
    """Replaces `sampling.top_k`."""
    max_tokens: int | None = Field(None, gt=0, le=TOKENS_MAX)
    """Replaces `sampling.max_tokens` (and what the token budget reserves); the same limits."""
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    """gpt-oss's effort: the request's `reasoning_effort`, and the format's for its prompt."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Merged into `sampling.extra` (not the keys draftgen sets itself)."""

    _no_managed_keys = field_validator("extra")(refuse_managed_keys)

    def settings(self) -> dict[str, Any]:
        """The sampling keys this choice sets (its weight and unset keys left out)."""
        return {k: v for k, v in self.model_dump(exclude={"weight"}).items()
                if v is not None and v != {}}


JsonScalar = str | int | float | bool | None


class DropRule(StrictModel):
    """Rows whose `field` holds one of these values (or not one of them) are left out."""

    field: str
    """The row's field tested."""
    one_of: list[JsonScalar] | None = None
    """Rows whose field holds one of these are left out."""
    not_one_of: list[JsonScalar] | None = None
    """Rows whose field holds none of these are left out."""

    @model_validator(mode="after")
    def _one_test(self) -> DropRule:
        if (self.one_of is None) == (self.not_one_of is None):
            raise ValueError("give one of one_of or not_one_of")
        return self


class RowMapping(StrictModel):
    """How a row in a dataset's own schema becomes messages and tools (datasets/rowmap.py):
    written by a preset, or by hand for any dataset. Without `messages` and `prompt`, rows
    keep their schema (detected) and only `drop` applies."""

    messages: str | None = None
    """The field holding the conversation (role/content or from/value messages)."""
    prompt: str | None = None
    """A user message after `messages`, from a template of `{field}`s ("{Problem}\n{options}")."""
    answer: str | None = None
    """An assistant message after those, from a template (the dataset's own answer)."""
    system: str | None = None
    """The field holding a system prompt (none unless named)."""
    tools: str | None = None
    """The field holding the tools (a list, or a JSON string of one)."""
    roles: dict[str, str] = Field(default_factory=dict)
    """Role names of this dataset → user, assistant, system or tool."""
    skip_roles: list[str] = Field(default_factory=list)
    """Messages of these roles (after `roles`) are left out."""
    drop: list[DropRule] = Field(default_factory=list)
    """Rows left out (counted as dropped)."""

    @model_validator(mode="after")
    def _reads_a_conversation(self) -> RowMapping:
        shaped = [k for k in ("answer", "system", "tools", "roles", "skip_roles")
                  if getattr(self, k)]
        if shaped and self.messages is None and self.prompt is None:
            raise ValueError(f"{', '.join(shaped)}: needs messages or prompt")
        return self


class DatasetConfig(StrictModel):
    name: str
    """The dataset's folder in the run folder (a plain folder name)."""
    path: str
    """A local .jsonl/.json/.parquet file, a HF save_to_disk folder, or a hub dataset name
    (org/name; a missing path with a file suffix or under a local folder is 'no such file',
    never a hub name)."""
    limit: int | None = Field(None, gt=0)
    """Prompts read from the dataset."""
    split: str = "train"
    """The split, for hub datasets and DatasetDict folders."""
    subset: str | None = None
    """Hub config name, when `path` is a hub dataset."""
    hub_timeout_s: float = Field(60.0, gt=0)
    """For a hub dataset: the longest wait for the hub to send the next thing (the set's files,
    its next rows) before the run stops with an error naming the hub."""
    max_output_tokens: int | None = Field(None, gt=0)
    """Token budget: answers stop being dispatched once this many output tokens are spent or
    reserved (the rest is counted as skipped). No `max_tokens` of the dataset's requests may
    be over it."""
    max_prompts: int | None = Field(None, gt=0)
    """At most this many answers for the dataset (the rest is counted as skipped); for
    `turns: all`, this many conversations. Sharded (`--shard I/N`), each shard sends its own
    prompts among the dataset's first `max_prompts`."""
    turns: Literal["first", "last", "all"] = "first"
    """Which assistant turn to regenerate: "first" (the prompt is the conversation up to the
    first assistant turn), "last" (up to the last one, earlier turns kept as history) or "all"
    (every assistant turn in order, the target's own answers as history, one record per turn:
    docs/trajectories.md)."""
    sampling_mix: list[SamplingChoice] | None = Field(None, min_length=1)
    """Weighted sampling settings, one drawn per conversation from the run's seed and the
    conversation's ID (`datasets.sampling_mix`), e.g. gpt-oss `reasoning_effort` low, medium,
    high at weights 4, 4, 2; `turns: all` only."""
    rows: RowMapping | None = None
    """How a row becomes messages and tools, where schema detection is not enough."""
    preset: str | None = None
    """The preset this dataset came from (`draftgen datasets`); its fields are filled in."""
    preset_mix: str | None = None
    """The preset mix this dataset came from."""

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, name: str) -> str:
        if not name or "/" in name or name.startswith(".") or "\\" in name:
            raise ValueError(f"must be a plain folder name, got {name!r}")
        if name in RESERVED_FOLDERS:
            raise ValueError(f"{name!r} is the name of a folder draftgen keeps in the run "
                             f"folder; reserved: {sorted(RESERVED_FOLDERS)}")
        return name


class BudgetConfig(StrictModel):
    usd: float | None = Field(None, gt=0)
    """Total spend of the run (all sessions), enforced by reservation."""
    usd_per_minute: float | None = Field(None, gt=0)
    """Spend rate: over it, paid backends get no new requests until the rate drops."""


class RunConfig(StrictModel):
    # Its schema is built when a config is first validated: the backend types' union is
    # the registry's (`backends.registry`), whose modules are imported then, not with this one.
    model_config = ConfigDict(defer_build=True)

    output_dir: str
    """The run folder."""
    model: ModelConfig
    """The target model: its name, chat format and tokenizer."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """How answers are sampled."""
    backends: list[BackendConfig]
    """Where requests go: local engines and paid APIs, in priority order."""
    datasets: list[DatasetConfig]
    """The prompt sets, each answered into its own folder of the run."""
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    """Dollar budget and spend rate of the whole run."""
    max_attempts: int = Field(3, gt=0)
    """A prompt whose requests failed this many times (across runs) is not retried on resume."""
    fsync_interval_s: float = Field(1.0, ge=0)
    """How often the output files are fsync'ed (0: after every record). Every record is
    written to the OS as it arrives whatever this says; fsync protects against a power loss."""
    min_free_mb: float = Field(256, ge=0)
    """Free space kept on the output disk: below it no new request is sent, the answers in
    flight are written, and the run stops (resumable once space is freed). 0: off."""
    unreachable_stop_s: float = Field(180.0, gt=0)
    """How long the run goes on while every request fails for want of a connection (connection
    refused, connect timeout, DNS; on every backend): then it stops, naming each backend's URL
    and last error, and exits 1. Prompts that never reached a server stay pending for the
    next run, their attempts not counted."""

    @field_validator("datasets", mode="before")
    @classmethod
    def _expand_presets(cls, datasets: Any) -> Any:
        """`preset:` and `preset_mix:` entries become the datasets they stand for."""
        if not isinstance(datasets, list) or not any(
                isinstance(d, dict) and ({"preset", "preset_mix"} & d.keys()) for d in datasets):
            return datasets
        from draftgen.presets import expand_datasets  # the registry loads on use

        return expand_datasets(datasets)

    @model_validator(mode="after")
    def _unique_names(self) -> RunConfig:
        for what, names in (
            ("backends", [b.name for b in self.backends]),
            ("datasets", [d.name for d in self.datasets]),
        ):
            seen = {n for n in names if names.count(n) > 1}
            if seen:
                raise ValueError(f"{what}: duplicate names {sorted(seen)}")
        if not self.backends:
            raise ValueError("backends: at least one backend is needed")
        if not self.datasets:
            raise ValueError("datasets: at least one dataset is needed")
        return self

    @model_validator(mode="after")
    def _answers_can_be_that_long(self) -> RunConfig:
        """No `max_tokens` a dataset's requests ask for is over `model.context_length` or the
        dataset's `max_output_tokens`: no answer could be that long, and the budget would end
        the dataset (or the run) with no word about max_tokens."""
        context = self.model.context_length
        for ds in self.datasets:
            budget = ds.max_output_tokens
            for key, tokens in self.max_tokens_of(ds):
                if context is not None and tokens > context:
                    raise ValueError(
                        f"{key}: {tokens:,} (dataset {ds.name!r}) is over model.context_length "
                        f"({context:,}): no answer can be that long; lower it")
                if budget is not None and tokens > budget:
                    raise ValueError(
                        f"{key}: {tokens:,} is over datasets[{ds.name}].max_output_tokens "
                        f"({budget:,}), the dataset's whole token budget; lower it or raise "
                        "the budget")
        return self

    def max_tokens_of(self, ds: DatasetConfig) -> list[tuple[str, int]]:
        """Each `max_tokens` the dataset's requests may ask for, with the key that sets it:
        its `sampling_mix` choices', and `sampling.max_tokens` where a choice (or no mix)
        leaves it."""
        mix = ds.sampling_mix or []
        out = [(f"datasets[{ds.name}].sampling_mix[{i}].max_tokens", tokens)
               for i, c in enumerate(mix) if (tokens := c.max_tokens) is not None]
        if len(out) < len(mix) or not mix:
            out.append(("sampling.max_tokens", self.sampling.max_tokens))
        return out

    def redacted(self) -> dict[str, Any]:
        """The config as stored in run.json: header values, URL credentials and anything
        key-like removed."""
        data = self.model_dump(mode="json")
        for backend in data["backends"]:
            backend["headers"] = {k: REDACTED for k in backend["headers"]}
        return redact_value(data)


def _format_validation_error(path: Path, err: ValidationError, data: Any) -> str:
    lines = [f"{path}: invalid config"]
    for e in err.errors():
        if e["loc"][:1] == ("backends",):
            loc, msg = backend_error(e, data)
        elif e["type"] == "extra_forbidden":
            loc, msg = e["loc"], unknown_key(RunConfig, e["loc"])
        else:
            loc, msg = e["loc"], e["msg"]
        msg = error_text(msg)
        if not loc and e["type"] == "value_error":  # a check across keys names its keys
            lines.append(f"  {msg}")
            continue
        where = ".".join(str(p) for p in loc) or "(top level)"
        lines.append(f"  {where}: {msg}")
    return "\n".join(lines)


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"key {key!r} is written twice")
        self.key, self.line, self.first = key, line, first


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, except that a key written twice in one mapping is an error (YAML's merge key
    `<<` may still bring keys that the mapping then overrides)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in first_line:
                raise _DuplicateKey(key, line, first_line[key])
            first_line.setdefault(key, line)
        return super().construct_mapping(node, deep)


def _check_size(path: Path, data: Any) -> None:
    """Count the values the config expands to, stopping at MAX_CONFIG_VALUES: aliases make a
    1 kB YAML stand for billions of values, which only blow up when something copies them."""
    stack: list[tuple[Any, str]] = [(data, "")]
    seen = 0
    while stack:
        value, where = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            under = ".".join(where.split(".")[:3]) or "(top level)"
            raise ConfigError(f"{path}: {under}: the config expands to more "
                              f"than {MAX_CONFIG_VALUES:,} values (YAML anchors and aliases "
                              "repeated?); refused")
        if isinstance(value, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{where}.{i}") for i, v in enumerate(value))


def load_config(path: str | Path) -> RunConfig:
    """Read and validate run.yaml. Errors name the file and the key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read config: {e}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as e:
        raise ConfigError(f"{path}:{e.line}: key {e.key!r} is written twice (first at line "
                          f"{e.first}); keep one") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    _check_size(path, data)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(path, e, data)) from None
