"""run.yaml, validated. Secrets never live here: a backend names the env var that holds its key."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

import orjson
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import ErrorDetails

from draftgen.assets import resolve_builtin
from draftgen.errors import DraftgenError
from draftgen.redact import REDACTED, keep_secret, redact_value
from draftgen.store.layout import SHARDS_DIR

BackendType = Literal["openai", "openrouter", "vllm", "sglang", "llamacpp"]
RESERVED_FOLDERS = frozenset({SHARDS_DIR})
"""Folders of a run folder that are not datasets: no dataset may take their names."""
MANAGED_BODY_KEYS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "max_new_tokens", "n_predict",
    "n", "stream", "stream_options", "logprobs", "input_ids", "prompt", "text",
    "return_token_ids", "return_tokens", "sampling_params",
})
"""Request keys draftgen sets itself (the clamped answer length, the prompt and its IDs, one
streamed or not answer with logprobs): `sampling.extra` or `extra_body` overriding one would
break the budget (`max_tokens` is what the reservation counts on) or the token-exact record."""


def _refuse_managed_keys(extra: dict[str, Any]) -> dict[str, Any]:
    managed = sorted(MANAGED_BODY_KEYS & set(extra))
    if managed:
        raise ValueError(
            f"{', '.join(managed)}: set by draftgen itself on every request (the answer length "
            "from sampling.max_tokens and the budgets, the prompt, stream and logprobs from "
            "the backend's settings); remove them from here")
    return extra


class ConfigError(DraftgenError):
    """A config that cannot be used; the message names the file and the key."""


INT64_MAX = 2**63 - 1
TOKENS_MAX = 2**31 - 1
"""The most tokens a count can say: engines and APIs hold token counts as 32-bit integers."""
MAX_CONFIG_VALUES = 100_000
"""A config expanding to more values than this (YAML aliases repeated: an "anchor bomb") is
refused before anything uses it: a real run.yaml has a few hundred."""


class _Strict(BaseModel):
    """Unknown keys are errors, and values are not coerced across types: `concurrency: true`
    or `max_tokens: 1e20` is refused, not taken as 1 or as a float made an integer."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*")
    @classmethod
    def _fits_in_64_bits(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
            raise ValueError(f"must be at most {INT64_MAX:,} in size")
        if isinstance(value, dict) and value and not isinstance(value, BaseModel):
            try:  # free-form objects go into request bodies and run.json as JSON
                orjson.dumps(value)
            except orjson.JSONEncodeError as e:
                raise ValueError(f"cannot be sent as JSON: {e}") from None
        return value


class ModelConfig(_Strict):
    name: str
    """Sent as "model" to OpenAI-compatible backends."""
    format: str
    """Model family: a key of the formats registry (qwen3, qwen3-thinking, ...)."""
    tokenizer: str
    """A tokenizer.json file, or a HF tokenizer folder (one without tokenizer.json, such as
    Kimi's tiktoken tokenizer, loads through transformers with trust_remote_code)."""
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


class SamplingConfig(_Strict):
    temperature: float | None = 0.6
    """Sampling temperature (null: the server's default)."""
    top_p: float | None = 0.95
    """Nucleus sampling (null: the server's default)."""
    top_k: int | None = None
    """Top-k sampling (null: the server's default)."""
    max_tokens: int = Field(4096, gt=0, le=TOKENS_MAX)
    """The most output tokens of one answer: what the token and dollar budgets reserve before a
    request is sent (cut to what a dataset's token budget has left)."""
    seed: int | None = None
    """Sent as the request's seed; also seeds the `sampling_mix` draw."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Extra fields merged into every request body (OpenAI) or sampling_params (SGLang); not
    the keys draftgen sets itself (MANAGED_BODY_KEYS)."""

    _no_managed_keys = field_validator("extra")(_refuse_managed_keys)


class Price(_Strict):
    """USD per million tokens."""

    prompt: float = Field(ge=0)
    """USD per million prompt tokens."""
    completion: float = Field(ge=0)
    """USD per million output tokens."""

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt + completion_tokens * self.completion) / 1e6


class FleetConfig(_Strict):
    """A backend whose `url` is a router in front of several engines (`sglang-router`) or a
    data-parallel endpoint (`vllm serve --data-parallel-size N`). See backends/router.py."""

    wait_for_workers: int | None = Field(None, gt=0)
    """Before dispatch, wait until the router's `GET /workers` lists this many healthy
    workers (default 1). Also the count that sizes `concurrency`: give the fleet's size."""
    wait_timeout_s: float = Field(600.0, gt=0)
    """How long to wait for the workers (or, with `workers`, for `GET /health`)."""
    slots_per_worker: int | None = Field(None, gt=0)
    """Requests in flight per worker: `concurrency` becomes workers × slots_per_worker."""
    workers: int | None = Field(None, gt=0)
    """The worker count of an endpoint that lists none (vLLM data parallel: its
    --data-parallel-size). Then only `GET /health` is waited for, not `GET /workers`."""

    @model_validator(mode="after")
    def _workers_or_wait(self) -> FleetConfig:
        if self.workers is not None and self.wait_for_workers is not None:
            raise ValueError("give workers (an endpoint without a worker list) or "
                             "wait_for_workers (a router's GET /workers), not both")
        return self


class BackendConfigBase(_Strict):
    """What every backend type takes. Each type's model (`BACKEND_TYPES`) adds its own keys; a
    key of another type is refused, naming the types it belongs to."""

    name: str
    """The backend's name in records, status and logs."""
    type: BackendType
    """Which server or API it is: picks the keys it takes (below)."""
    url: str | None = None
    """The server's base URL. A `llamacpp` backend may give `model` instead."""
    api_key_env: str | None = None
    """The environment variable holding the API key (the key never appears in a file or an
    output: echoed by a server in an error, it shows as ***)."""
    concurrency: int = Field(64, gt=0)
    """Requests in flight on this backend."""
    priority: int = 0
    """Lower runs first: a backend gets work only when every backend of a lower priority is
    saturated."""
    price: Price | None = None
    """USD per million tokens. Default: OpenRouter's /models listing for `openrouter`, 0 for
    a backend that is not paid."""
    paid: bool | None = None
    """Whether the backend bills. Default: true for `openrouter` and for any backend with an
    `api_key_env`; false otherwise (local engines)."""
    cooldown_after: int = Field(20, ge=1)
    """Consecutive failed requests that take the backend out of rotation for `cooldown_s`."""
    cooldown_s: float = Field(30.0, ge=0)
    """How long a backend rests after `cooldown_after` failures in a row."""
    timeout_s: float = Field(600.0, gt=0)
    """The most seconds one request may take."""
    connect_timeout_s: float = Field(30.0, gt=0)
    """The most seconds to open a connection."""
    max_retries: int = Field(6, ge=0)
    """Retries of one request within one run, on retryable errors."""
    backoff_base_s: float = Field(1.0, gt=0)
    """The first retry's wait; it doubles with each retry."""
    backoff_max_s: float = Field(60.0, gt=0)
    """The longest wait between retries; a Retry-After longer than this fails the request
    now."""
    max_response_mb: float = Field(256.0, gt=0)
    """The largest answer read from this backend (a body once decompressed, or a stream's
    bytes in all); a larger one fails its request as `response_too_large`."""
    max_in_flight_response_mb: float = Field(1024.0, gt=0)
    """The most this backend's answers hold together while they are read and parsed (bodies,
    streams' bytes so far), its probe's included: the answer whose bytes would go past it
    fails as `memory_bound` (retried). The process holds at most the sum over its backends."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra HTTP headers of every request (their values are redacted in run.json)."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Extra fields of every request body; not the keys draftgen sets itself
    (MANAGED_BODY_KEYS)."""
    fleet: FleetConfig | None = None
    """`url` is a router or data-parallel endpoint: wait for its workers at start and size
    `concurrency` from them (`fleet.slots_per_worker`)."""

    bills_by_default: ClassVar[bool] = False
    """Whether a backend of this type bills when the config says neither `paid` nor
    `api_key_env` (see `is_paid`)."""

    _no_managed_keys = field_validator("extra_body")(_refuse_managed_keys)

    @field_validator("url")
    @classmethod
    def _url_has_scheme(cls, url: str | None) -> str | None:
        if url is None:
            return None
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {url!r}")
        return url.rstrip("/")

    @model_validator(mode="after")
    def _where_it_answers(self) -> Self:
        self._check_url()
        if self.fleet is not None:
            self._check_fleet(self.fleet)
        return self

    def _check_url(self) -> None:
        if self.url is None:
            raise ValueError("url: required")

    def _check_fleet(self, fleet: FleetConfig) -> None:
        if self.url is None:
            raise ValueError("fleet: needs url (the router or data-parallel endpoint)")
        if fleet.slots_per_worker is not None and "concurrency" in self.model_fields_set:
            raise ValueError("give concurrency or fleet.slots_per_worker (concurrency = "
                             "workers × slots_per_worker), not both")

    @model_serializer(mode="wrap")
    def _with_every_type_key(self, handler: SerializerFunctionWrapHandler,
                             info: SerializationInfo) -> Any:
        """Dumped with every backend type's keys, the other types' at their defaults: the
        backend's entry in run.json and the probe's cache key read as they did when one model
        held every key."""
        data = handler(self)
        if not isinstance(data, dict) or info.exclude_unset or info.exclude_defaults:
            return data
        for key, default in _EVERY_TYPE_DEFAULTS.items():
            if key in data or (info.exclude_none and default is None) \
                    or (info.include is not None and key not in info.include) \
                    or (info.exclude is not None and key in info.exclude):
                continue
            data[key] = copy.deepcopy(default)
        return data

    @property
    def starts_own_server(self) -> bool:
        """draftgen starts this backend's server itself (a `llamacpp` backend given `model:`)."""
        return False

    @property
    def provider_routing(self) -> dict[str, Any] | None:
        """The provider routing object sent with each request and checked against who served
        each answer; None for a type without provider routing."""
        return None

    @property
    def is_paid(self) -> bool:
        if self.paid is not None:
            return self.paid
        return self.bills_by_default or self.api_key_env is not None

    def api_key(self) -> str | None:
        """The key from the environment; a named but unset variable is an error."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"backend {self.name!r}: environment variable {self.api_key_env} "
                "(api_key_env) is not set"
            )
        keep_secret(key)
        return key


class SamplingChoice(_Strict):
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
    """Replaces `sampling.max_tokens` (and what the token budget reserves)."""
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    """gpt-oss's effort: the request's `reasoning_effort`, and the format's for its prompt."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Merged into `sampling.extra` (not the keys draftgen sets itself)."""

    _no_managed_keys = field_validator("extra")(_refuse_managed_keys)

    def settings(self) -> dict[str, Any]:
        """The sampling keys this choice sets (its weight and unset keys left out)."""
        return {k: v for k, v in self.model_dump(exclude={"weight"}).items()
                if v is not None and v != {}}


class SGLangConfig(BackendConfigBase):
    """SGLang's native `/generate`: prompt IDs in, sampled IDs out."""

    type: Literal["sglang"]


class ChatBackendConfig(BackendConfigBase):
    """What the OpenAI-compatible chat endpoints take (and llama.cpp's, with `endpoint: chat`)."""

    reasoning: dict[str, Any] | None = None
    """The `reasoning` request object; default {"enabled": true} on openrouter."""
    stream: bool = False
    """Ask for the answer as a stream of server-sent events."""
    logprobs: bool = True
    """Chat backends: ask for per-token logprobs, from which the sampled token IDs are
    recovered exactly where they cover the whole answer."""

    @property
    def request_reasoning(self) -> dict[str, Any] | None:
        """The `reasoning` object each request carries (None: none)."""
        return self.reasoning


class OpenAIConfig(ChatBackendConfig):
    type: Literal["openai"]


class VLLMConfig(ChatBackendConfig):
    type: Literal["vllm"]


class OpenRouterConfig(ChatBackendConfig):
    type: Literal["openrouter"]
    provider: dict[str, Any] | None = None
    """OpenRouter provider routing object, passed through unchanged."""

    bills_by_default: ClassVar[bool] = True

    @property
    def provider_routing(self) -> dict[str, Any] | None:
        return self.provider

    @property
    def request_reasoning(self) -> dict[str, Any] | None:
        return self.reasoning or {"enabled": True}


class LlamaCppConfig(ChatBackendConfig):
    """llama.cpp's `llama-server`: one that runs (`url`) or one draftgen starts (`model`)."""

    type: Literal["llamacpp"]
    endpoint: Literal["native", "chat"] = "native"
    """"native" (`/completion`, prompt as IDs, engine IDs back) or "chat" (OpenAI
    `/v1/chat/completions`, IDs recoverable from logprobs)."""
    model: str | None = None
    """A GGUF file; draftgen starts and stops its own llama-server for it (backends with the
    same model and server_args share one server)."""
    server_args: list[str] = Field(default_factory=list)
    """With `model` only: extra llama-server flags (e.g. ["--threads", "4"])."""

    @field_validator("model")
    @classmethod
    def _resolve_model(cls, path: str | None) -> str | None:
        return resolve_builtin(path) if path is not None else None

    def _check_url(self) -> None:
        if (self.url is None) == (self.model is None):
            raise ValueError("llamacpp: give exactly one of url (a running llama-server) "
                             "or model (a GGUF file: draftgen starts the server)")
        if self.server_args and self.model is None:
            raise ValueError("server_args: only with model (a server draftgen starts)")

    @property
    def starts_own_server(self) -> bool:
        return self.model is not None and self.url is None


BACKEND_TYPES: dict[str, type[BackendConfigBase]] = {
    "openai": OpenAIConfig, "openrouter": OpenRouterConfig, "vllm": VLLMConfig,
    "sglang": SGLangConfig, "llamacpp": LlamaCppConfig,
}
"""Each backend type's config model: `type` picks it (see `BackendConfig`)."""

BackendConfig = Annotated[
    OpenAIConfig | OpenRouterConfig | VLLMConfig | SGLangConfig | LlamaCppConfig,
    Field(discriminator="type"),
]
"""One backend of run.yaml, as the model its `type` picks."""

_BACKEND_ADAPTER: TypeAdapter[BackendConfig] = TypeAdapter(BackendConfig)


def parse_backend(data: Mapping[str, Any]) -> BackendConfig:
    """One backend's config validated by its type's model (pydantic's ValidationError else)."""
    return _BACKEND_ADAPTER.validate_python(data)


def _defaults_of_every_type() -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    for model in BACKEND_TYPES.values():
        for key, field in model.model_fields.items():
            if not field.is_required():
                defaults.setdefault(key, field.get_default(call_default_factory=True))
    return defaults


_EVERY_TYPE_DEFAULTS = _defaults_of_every_type()
"""Each key of any backend type and its default (the same in every type that has it)."""


def _types_with_key(key: str) -> list[str]:
    return [name for name, model in BACKEND_TYPES.items() if key in model.model_fields]


JsonScalar = str | int | float | bool | None


class DropRule(_Strict):
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


class RowMapping(_Strict):
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


class DatasetConfig(_Strict):
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
    max_output_tokens: int | None = Field(None, gt=0)
    """Token budget: answers stop being dispatched once this many output tokens are spent or
    reserved (the rest is counted as skipped)."""
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


class BudgetConfig(_Strict):
    usd: float | None = Field(None, gt=0)
    """Total spend of the run (all sessions), enforced by reservation."""
    usd_per_minute: float | None = Field(None, gt=0)
    """Spend rate: over it, paid backends get no new requests until the rate drops."""


class RunConfig(_Strict):
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
        loc, msg = (e["loc"], e["msg"]) if e["loc"][:1] != ("backends",) \
            else _backend_error(e, data)
        if e["type"] == "extra_forbidden" and msg == e["msg"]:
            msg = "unknown key (typo?)"
        where = ".".join(str(p) for p in loc) or "(top level)"
        lines.append(f"  {where}: {msg}")
    return "\n".join(lines)


def _backend_error(e: ErrorDetails, data: Any) -> tuple[tuple[int | str, ...], str]:
    """An error under `backends`, where and what, as if one model held every backend type's
    keys: without the type pydantic puts in the location (`backends.0.sglang.provider`), a
    missing or unknown type said of `type`, and another type's key named as such."""
    loc, msg = e["loc"], e["msg"]
    if e["type"] == "union_tag_not_found":
        return (*loc, "type"), "Field required"
    if e["type"] == "union_tag_invalid":
        return (*loc, "type"), "Input should be " + _either([repr(t) for t in BACKEND_TYPES])
    if len(loc) < 3 or loc[2] not in BACKEND_TYPES:
        return loc, msg
    backend_type, loc = loc[2], (*loc[:2], *loc[3:])
    owners = _types_with_key(str(loc[-1])) if e["type"] == "extra_forbidden" else []
    if len(loc) == 3 and owners:
        msg = f"only for type {_either(owners)}; backend {_backend_name(data, loc[1])}" \
              f"is type {backend_type}"
    return loc, msg


def _either(names: Sequence[str]) -> str:
    """"a, b or c"."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def _backend_name(data: Any, index: int | str) -> str:
    """`'NAME' ` of backend `index` of the raw config, where it has a name ('' if not)."""
    try:
        name = data["backends"][index]["name"]
    except (KeyError, IndexError, TypeError):
        return ""
    return f"{name!r} " if isinstance(name, str) else ""


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
