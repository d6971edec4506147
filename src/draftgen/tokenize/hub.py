"""A tokenizer named by its Hugging Face Hub repo ID (`Qwen/Qwen3-8B`, `Qwen/Qwen3-8B@<rev>`), as
vLLM and transformers take one: its tokenizer files are fetched through `huggingface_hub` into
the Hub's own cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`),
and the snapshot folder is loaded as a local folder is. `HF_HUB_OFFLINE=1` reads the cache only.

Only the files a tokenizer folder is read for are fetched (`HUB_FILES`), never the weights.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from draftgen.tokenize.base import TokenizerError

HUB_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "chat_template.jinja", "chat_template.json", "generation_config.json",
             "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
             "tiktoken.model", "*.tiktoken", "config.json", "tokenization_*.py")
"""What `load_tokenizer` and the formats read of a tokenizer folder: tokenizer.json, or what
transformers loads instead (Kimi's tiktoken files and its tokenization code), the chat
template and the special tokens."""

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?")
_TRUE = frozenset({"1", "on", "yes", "true"})


def is_hub_id(spec: str | Path) -> bool:
    """Whether `spec` names a Hub repo: `owner/name` (optionally `@revision`) that is not an
    existing path (a local folder so named wins)."""
    if not isinstance(spec, str) or not _HUB_ID.fullmatch(spec):
        return False
    return not Path(spec).expanduser().exists()


def split_hub_id(spec: str) -> tuple[str, str | None]:
    """`owner/name@rev` → ("owner/name", "rev"); no `@`: the default branch (None)."""
    repo, _, revision = spec.partition("@")
    return repo, revision or None


def hub_cache() -> Path:
    """The Hub cache folder, read from the environment at each call (huggingface_hub reads it
    once, at import)."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(os.path.expandvars(cache)).expanduser()
    home = os.environ.get("HF_HOME") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(os.path.expandvars(str(home))).expanduser() / "hub"


def hub_offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in _TRUE
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_tokenizer_folder(spec: str) -> Path:
    """The snapshot folder holding the tokenizer files of the repo `spec` names, fetched into
    the Hub cache unless there already (offline: the cache only). TokenizerError, naming the
    repo and the cache, when it cannot be had."""
    import httpx
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision = split_hub_id(spec)
    cache, offline = hub_cache(), hub_offline()
    try:
        folder = snapshot_download(repo, revision=revision, cache_dir=cache,
                                   allow_patterns=list(HUB_FILES), local_files_only=offline)
    except LocalEntryNotFoundError:  # an incomplete snapshot too
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
        raise TokenizerError(
            f"tokenizer {spec}: not in the Hugging Face cache {cache} (or only in part) and "
            f"{why}; fetch it once online (`hf download {repo}`), or give a local path"
        ) from None
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TokenizerError(f"tokenizer {spec}: not a local path, and the Hugging Face Hub "
                             f"refuses it: {first}") from None
    except (OSError, ValueError, httpx.HTTPError) as e:
        raise TokenizerError(f"tokenizer {spec}: cannot fetch it from the Hugging Face Hub "
                             f"into {cache}: {e}") from None
    return Path(folder)
