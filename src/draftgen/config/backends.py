"""The backend types: what every backend's config takes (`BackendConfigBase`), and the registry
of types that run.yaml's `type` picks from.

A backend type is one module of `draftgen.backends`: its config model, a `BackendConfigBase`
subclass with `type: Literal["NAME"]` and the keys only it takes, decorated with `@register`,
beside the `Backend` class it makes (`backend_class`). The module's name in `BACKEND_MODULES`
is its registration: the registry imports those modules by name when it is first asked for the
types, so the config (below the backends) validates every type without importing one."""

from __future__ import annotations

import copy
import functools
import importlib
import os
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Self, TypeVar

from pydantic import (
    Field,
    GetCoreSchemaHandler,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import CoreSchema, ErrorDetails

from draftgen.config.base import ConfigError, StrictModel, refuse_managed_keys, unknown_key
from draftgen.redact import keep_secret, keep_url_secrets
from draftgen.urls import strip_trailing_slash

BACKEND_MODULES = ("openai_chat", "openrouter", "vllm", "sglang", "llamacpp")
"""The modules of `draftgen.backends` that hold the backend types, in the order their types are
listed (docs, errors): importing one registers its types (`backend_types` imports them all)."""

_REGISTRY: dict[str, type[BackendConfigBase]] = {}


class Price(StrictModel):
    """USD per million tokens."""

    prompt: float = Field(ge=0)
    """USD per million prompt tokens."""
    completion: float = Field(ge=0)
    """USD per million output tokens."""

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        """USD for these tokens (a mean's fractions too)."""
        return (prompt_tokens * self.prompt + completion_tokens * self.completion) / 1e6


class FleetConfig(StrictModel):
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


class BackendConfigBase(StrictModel):
    """What every backend type takes. Each type's model (`@register`) adds its own keys; a
    key of another type is refused, naming the types it belongs to."""

    name: str
    """The backend's name in records, status and logs."""
    type: str
    """Which server or API it is: picks the keys it takes (below)."""
    url: str | None = None
    """The server's base URL. A `llamacpp` backend may give `model` instead. A query string
    (`?key=...`) is sent with every request; its values are redacted wherever the URL is
    shown or stored (but `api-version`, `version`, `id`)."""
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
    """The most bytes the run's answers hold together while they are read (bodies, streams'
    bytes so far), the probe's included: the answer whose bytes would go past it fails as
    `memory_bound` (retried). One bound for the whole run, the largest of its backends'
    (never their sum). Parsing holds about as much again (the text decoded from the bytes);
    one answer is also held to what its `max_tokens` allows (`bad_response` past it)."""
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

    _no_managed_keys = field_validator("extra_body")(refuse_managed_keys)

    def backend_class(self) -> type:
        """The `backends.base.Backend` subclass that serves a backend of this config (each
        registered type says; not imported here: base imports this module)."""
        raise NotImplementedError(f"backend type {self.type!r} names no backend class")

    @field_validator("url")
    @classmethod
    def _url_has_scheme(cls, url: str | None) -> str | None:
        if url is None:
            return None
        keep_url_secrets(url)  # from now on, before any message could show them
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {url!r}")
        return strip_trailing_slash(url)

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
        for key, default in every_type_defaults().items():
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


_C = TypeVar("_C", bound=BackendConfigBase)


def register(model: type[_C]) -> type[_C]:
    """Class decorator: make a backend type's config model the one `type: NAME` picks (NAME:
    its `type` field's one Literal value)."""
    (name,) = typing.get_args(model.model_fields["type"].annotation)
    if _REGISTRY.setdefault(name, model) is not model:
        raise ValueError(f"backend type {name!r} registered twice: "
                         f"{_REGISTRY[name].__qualname__} and {model.__qualname__}")
    return model


def backend_types() -> dict[str, type[BackendConfigBase]]:
    """Each backend type's config model, by the `type` that picks it, in the order of their
    modules in `BACKEND_MODULES` (whichever was imported first)."""
    modules = [f"draftgen.backends.{name}" for name in BACKEND_MODULES]
    for module in modules:  # importing a backend's module registers its types
        importlib.import_module(module)
    rank = {module: i for i, module in enumerate(modules)}
    return dict(sorted(_REGISTRY.items(),
                       key=lambda item: rank.get(item[1].__module__, len(rank))))


class RegisteredTypes:
    """pydantic: a backend's config is validated as the registered model its `type` picks
    (a union discriminated by `type`), built when first validated, not when the config
    module is imported."""

    def models(self) -> list[type[BackendConfigBase]]:
        return list(backend_types().values())

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler
                                     ) -> CoreSchema:
        union = Annotated[typing.Union[tuple(self.models())],  # noqa: UP007  (built at run time)
                          Field(discriminator="type")]
        return handler.generate_schema(union)


BackendConfig = Annotated[BackendConfigBase, RegisteredTypes()]
"""One backend of run.yaml, as the model its `type` picks."""


@functools.cache
def _adapter() -> TypeAdapter[BackendConfigBase]:
    return TypeAdapter(BackendConfig)


def parse_backend(data: Mapping[str, Any]) -> BackendConfigBase:
    """One backend's config validated by its type's model (pydantic's ValidationError else)."""
    return _adapter().validate_python(data)


@functools.cache
def every_type_defaults() -> dict[str, Any]:
    """Each key of any backend type and its default (the same in every type that has it)."""
    defaults: dict[str, Any] = {}
    for model in backend_types().values():
        for key, field in model.model_fields.items():
            if not field.is_required():
                defaults.setdefault(key, field.get_default(call_default_factory=True))
    return defaults


def _types_with_key(key: str) -> list[str]:
    return [name for name, model in backend_types().items() if key in model.model_fields]


def backend_error(e: ErrorDetails, data: Any) -> tuple[tuple[int | str, ...], str]:
    """An error under `backends`, where and what, as if one model held every backend type's
    keys: without the type pydantic puts in the location (`backends.0.sglang.provider`), a
    missing or unknown type said of `type`, another type's key named as such, and an unknown
    key with the type's key closest to it."""
    loc, msg = e["loc"], e["msg"]
    types = backend_types()
    if e["type"] == "union_tag_not_found":
        return (*loc, "type"), "Field required"
    if e["type"] == "union_tag_invalid":
        return (*loc, "type"), "Input should be " + either([repr(t) for t in types])
    if len(loc) < 3 or loc[2] not in types:
        return loc, msg
    backend_type, loc = loc[2], (*loc[:2], *loc[3:])
    if e["type"] != "extra_forbidden":
        return loc, msg
    owners = _types_with_key(str(loc[-1]))
    if len(loc) == 3 and owners:
        return loc, (f"only for type {either(owners)}; backend {_backend_name(data, loc[1])}"
                     f"is type {backend_type}")
    return loc, unknown_key(types[backend_type], loc[2:])


def either(names: Sequence[str]) -> str:
    """"a, b or c"."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def _backend_name(data: Any, index: int | str) -> str:
    """`'NAME' ` of backend `index` of the raw config, where it has a name ('' if not)."""
    try:
        name = data["backends"][index]["name"]
    except (KeyError, IndexError, TypeError):
        return ""
    return f"{name!r} " if isinstance(name, str) else ""
