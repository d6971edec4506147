"""Each backend type has its own config model, picked by `type`: a key of another type is
refused naming the backend, the key and the types that take it; every backend still dumps
every type's keys (run.json and the probe's cache key read as before); what a backend does
follows its class's capabilities, never the type's name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from draftgen.backends import (
    LlamaCppChatBackend,
    LlamaCppNativeBackend,
    OpenAIChatBackend,
    OpenRouterBackend,
    SGLangBackend,
    VLLMChatBackend,
    capabilities_of,
)
from draftgen.backends.llamacpp import LlamaCppConfig
from draftgen.backends.openrouter import OpenRouterConfig
from draftgen.backends.sglang import SGLangConfig
from draftgen.config import ConfigError, load_config
from draftgen.config.backends import backend_types, parse_backend, register

URL = "http://127.0.0.1:1"
BACKEND_TYPES = backend_types()
OWN = {"openai": {}, "vllm": {}, "sglang": {},
       "openrouter": {"provider": {"ignore": ["x"]}, "reasoning": {"effort": "low"}},
       "llamacpp": {"endpoint": "chat", "stream": True, "logprobs": False}}


def _load(tmp_path: Path, backend: dict[str, Any]) -> Any:
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent("""\
        output_dir: out
        model: {name: m, format: qwen3, tokenizer: t.json}
        datasets: [{name: d, path: d.jsonl}]
    """) + f"backends: [{json.dumps(backend)}]\n")  # JSON is YAML
    return load_config(path)


def _error(tmp_path: Path, backend: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, backend)
    return str(e.value)


@pytest.mark.parametrize("type_", list(BACKEND_TYPES))
def test_each_type_loads_its_own_keys(tmp_path: Path, type_: str) -> None:
    cfg = _load(tmp_path, {"name": "b", "type": type_, "url": URL, **OWN[type_]})
    assert isinstance(cfg.backends[0], BACKEND_TYPES[type_])


@pytest.mark.parametrize("type_,key,value,owners", [
    ("sglang", "provider", {"order": ["a"]}, "openrouter"),
    ("openai", "provider", {"order": ["a"]}, "openrouter"),
    ("openrouter", "server_args", ["-t", "2"], "llamacpp"),
    ("vllm", "endpoint", "chat", "llamacpp"),
    ("openai", "model", "x.gguf", "llamacpp"),
    ("sglang", "stream", True, "openai, openrouter, vllm or llamacpp"),
])
def test_a_key_of_another_type_is_refused_naming_backend_key_and_types(
        tmp_path: Path, type_: str, key: str, value: Any, owners: str) -> None:
    message = _error(tmp_path, {"name": "gpu", "type": type_, "url": URL, key: value})
    assert f"backends.0.{key}: only for type {owners}; backend 'gpu' is type {type_}" \
        in message, message


def test_unknown_and_missing_keys_say_what_they_said(tmp_path: Path) -> None:
    assert "backends.0.concurency: unknown key; did you mean `concurrency`?" in _error(
        tmp_path, {"name": "b", "type": "sglang", "url": URL, "concurency": 3})
    assert "backends.0.type: Field required" in _error(tmp_path, {"name": "b", "url": URL})
    assert ("backends.0.type: Input should be 'openai', 'openrouter', 'vllm', 'sglang' or "
            "'llamacpp'") in _error(tmp_path, {"name": "b", "type": "tgi", "url": URL})
    assert "backends.0: url: required" in _error(
        tmp_path, {"name": "b", "type": "openai"})
    assert "backends.0: llamacpp: give exactly one of url" in _error(
        tmp_path, {"name": "b", "type": "llamacpp"})


def _run_error(tmp_path: Path, yaml_text: str) -> str:
    """The error of a valid config with `yaml_text`'s keys put in."""
    config = {"output_dir": "out", "model": {"name": "m", "format": "qwen3", "tokenizer": "t"},
              "datasets": [{"name": "d", "path": "d.jsonl"}],
              "backends": [{"name": "b", "type": "sglang", "url": URL}],
              **yaml.safe_load(yaml_text)}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    return str(e.value)


@pytest.mark.parametrize("yaml_text,says", [
    ("output_dri: x\n", "  output_dri: unknown key; did you mean `output_dir`?"),
    ("budget: {uds: 1}\n", "  budget.uds: unknown key; did you mean `usd`?"),
    ("sampling: {temprature: 1.0}\n",
     "  sampling.temprature: unknown key; did you mean `temperature`?"),
    ("datasets: [{name: d, path: d.jsonl, sampling_mix: [{weight: 1, top_pp: 0.9}]}]\n",
     "  datasets.0.sampling_mix.0.top_pp: unknown key; did you mean `top_p`?"),
    ("datasets: [{name: d, path: d.jsonl, rows: {answr: x}}]\n",
     "  datasets.0.rows.answr: unknown key; did you mean `answer`?"),
    ("zzz: 1\n", "  zzz: unknown key (typo?)"),
])
def test_an_unknown_key_names_the_closest_key_of_its_model(tmp_path: Path, yaml_text: str,
                                                            says: str) -> None:
    assert says in _error_lines(_run_error(tmp_path, yaml_text))


def _error_lines(message: str) -> list[str]:
    return message.splitlines()[1:]


@pytest.mark.parametrize("backend,says", [
    ({"type": "llamacpp", "url": URL, "server_arg": ["-t"]},
     "backends.0.server_arg: unknown key; did you mean `server_args`?"),
    ({"type": "openrouter", "url": URL, "reasonning": {"effort": "low"}},
     "backends.0.reasonning: unknown key; did you mean `reasoning`?"),
    ({"type": "openai", "url": URL, "price": {"promt": 1.0, "completion": 1.0}},
     "backends.0.price.promt: unknown key; did you mean `prompt`?"),
])
def test_an_unknown_backend_key_names_the_closest_key_of_its_type(
        tmp_path: Path, backend: dict[str, Any], says: str) -> None:
    assert f"  {says}" in _error_lines(_error(tmp_path, {"name": "b", **backend}))


def test_no_error_says_value_error(tmp_path: Path) -> None:
    message = _run_error(tmp_path, "sampling: {extra: {max_tokens: 5}}\n"
                                   "budget: {usd: -1}\n")
    assert "sampling.extra: max_tokens: set by draftgen itself" in message, message
    assert "Value error" not in message, message


def test_every_backend_dumps_every_type_key() -> None:
    """run.json and the probe's cache key hold the keys one model once held for every type,
    another type's at its default."""
    keys = {key for model in BACKEND_TYPES.values() for key in model.model_fields}
    dumps = {t: parse_backend({"name": "b", "type": t, "url": URL}).model_dump(mode="json")
             for t in BACKEND_TYPES}
    for dump in dumps.values():
        assert set(dump) == keys
    assert dumps["sglang"]["provider"] is None and dumps["sglang"]["endpoint"] == "native"
    assert dumps["openai"]["server_args"] == [] and dumps["sglang"]["logprobs"] is True
    assert "provider" not in parse_backend({"name": "b", "type": "sglang", "url": URL}
                                           ).model_dump(exclude={"provider"})


@pytest.mark.parametrize("cfg,cls", [
    ({"type": "openai"}, OpenAIChatBackend), ({"type": "vllm"}, VLLMChatBackend),
    ({"type": "openrouter"}, OpenRouterBackend), ({"type": "sglang"}, SGLangBackend),
    ({"type": "llamacpp"}, LlamaCppNativeBackend),
    ({"type": "llamacpp", "endpoint": "chat"}, LlamaCppChatBackend),
])
def test_each_type_has_its_class_and_capabilities(cfg: dict[str, Any], cls: type) -> None:
    backend = parse_backend({"name": "b", "url": URL, **cfg})
    assert backend.backend_class() is cls
    caps = capabilities_of(backend)
    openrouter = cfg["type"] == "openrouter"
    assert (caps.reports_cost, caps.looks_up_bills, caps.hosted) == (openrouter,) * 3
    assert caps.native_ids == (cls in (VLLMChatBackend, SGLangBackend, LlamaCppNativeBackend))
    assert caps.needs_prompt_ids == (cls in (SGLangBackend, LlamaCppNativeBackend))


def test_type_defaults_live_in_each_type_model() -> None:
    paid = OpenRouterConfig(name="b", type="openrouter", url=URL)
    assert paid.is_paid and paid.request_reasoning == {"enabled": True}
    assert paid.model_copy(update={"provider": {"order": ["a"]}}).provider_routing == {
        "order": ["a"]}
    local = SGLangConfig(name="b", type="sglang", url=URL)
    assert not local.is_paid and local.provider_routing is None and not local.starts_own_server
    keyed = SGLangConfig(name="b", type="sglang", url=URL, api_key_env="K")
    assert keyed.is_paid
    assert LlamaCppConfig(name="b", type="llamacpp", model="x.gguf").starts_own_server


def test_no_behaviour_reads_the_backend_type_name() -> None:
    """Outside the config's own models, `type` names a backend in messages and records only:
    what it does is read from its capabilities and class."""
    src = Path(__file__).resolve().parents[1] / "src" / "draftgen"
    compared = re.compile(r"""\.type\s*(==|!=|in)\s*[("'\[]""")
    offenders = [f"{path.relative_to(src)}:{n}" for path in sorted(src.rglob("*.py"))
                 if "testing" not in path.parts and path.name != "config.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if compared.search(line)]
    assert offenders == []


_PLUGIN = '''
import json, sys, textwrap
from pathlib import Path
from typing import Literal

from draftgen.config.backends import BackendConfigBase, register
from draftgen.backends.sglang import SGLangBackend


@register
class ToyConfig(BackendConfigBase):
    type: Literal["toy"]
    knob: int = 7
    """A key only this type takes."""

    def backend_class(self) -> type:
        return SGLangBackend


from draftgen.config import ConfigError, load_config

def load(backends):
    path = Path(sys.argv[1]) / "run.yaml"
    path.write_text(textwrap.dedent("""\\
        output_dir: out
        model: {name: m, format: qwen3, tokenizer: t.json}
        datasets: [{name: d, path: d.jsonl}]
    """) + f"backends: {json.dumps(backends)}\\n")
    return load_config(path)

url = "http://127.0.0.1:1"
cfg = load([{"name": "t", "type": "toy", "url": url, "knob": 3},
            {"name": "s", "type": "sglang", "url": url}])
toy, sglang = cfg.backends
try:
    load([{"name": "s", "type": "sglang", "url": url, "knob": 2}])
    refused = ""
except ConfigError as e:
    refused = str(e)
print(json.dumps({"toy": type(toy).__name__, "knob": toy.knob,
                  "class": toy.backend_class().__name__,
                  "sglang_dump_knob": sglang.model_dump()["knob"], "refused": refused}))
'''


def test_a_backend_type_is_its_module_and_its_registration(tmp_path: Path) -> None:
    """A type registered from its own module is taken by run.yaml, its keys refused on other
    types and dumped with every backend, and no module of draftgen is edited for it (run in
    a fresh interpreter: the registry is the process's)."""
    done = subprocess.run([sys.executable, "-c", _PLUGIN, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert (seen["toy"], seen["knob"], seen["class"]) == ("ToyConfig", 3, "SGLangBackend")
    assert seen["sglang_dump_knob"] == 7
    assert "backends.0.knob: only for type toy; backend 's' is type sglang" in seen["refused"]


def test_a_backend_type_registered_twice_is_refused() -> None:
    class Again(SGLangConfig):
        type: Literal["sglang"]

    with pytest.raises(ValueError, match="backend type 'sglang' registered twice"):
        register(Again)


def test_importing_the_config_imports_no_backend() -> None:
    """The config is below the backends: their modules (and aiohttp) load when a config is
    first validated, not with `draftgen.config`."""
    code = ("import sys, draftgen.config; print(sorted(m for m in sys.modules "
            "if m == 'aiohttp' or m.startswith('draftgen.backends.') "
            "and m != 'draftgen.config.backends'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
