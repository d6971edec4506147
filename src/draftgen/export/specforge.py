"""What `--format specforge` needs beyond the rows: SpecForge chat templates that match
draftgen's formats, the check of which rows keep exact IDs through each text route, and a
launcher that registers the templates before running a SpecForge script.

SpecForge (0.2.0) has three data paths for EAGLE-3:

* online `data.prompts_path`: pre-tokenized JSONL (`pretokenized.jsonl`), exact by construction;
* online `data.train_data_path` + `is_preformatted: true`: a `text` column (`text.jsonl`, the
  decoded IDs) that SpecForge re-tokenizes: exact where decode → encode gives the IDs back;
* offline `scripts/prepare_hidden_states.py --data-path`: only `conversations` (+ `tools`) are
  read (its generator drops every other column, `text` too), rendered with the target's chat
  template and re-tokenized: exact where that rendering is the run's prompt plus the canonical
  answer text. Its template then adds one token after the stop token (Qwen3: `\\n` after
  `<|im_end|>`), which the offline dataset's last-position mask zeroes.

`python -m draftgen.export.specforge SCRIPT ARGS...` (also under `torchrun -m`) registers the
`draftgen-*` templates and runs SCRIPT, so `--chat-template draftgen-qwen3` is known to it.
With `--pretokenized FILE` first, SpecForge's `build_eagle3_dataset` (which re-tokenizes the
conversations) gives FILE's exact rows instead: the offline capture then sees the recorded IDs
and loss masks. FILE must be the pretokenized.jsonl exported with the conversations.jsonl the
script reads (same rows, same order; checked by count).
"""

from __future__ import annotations

import runpy
import sys
from dataclasses import dataclass
from typing import Any

from draftgen.errors import DraftgenError
from draftgen.export.rows import answer_message
from draftgen.formats import Format, FormatError
from draftgen.store.record import Record
from draftgen.tokenize import Tokenizer

IM_START_USER = "<|im_start|>user\n"


@dataclass(frozen=True)
class SpecForgeTemplate:
    """A SpecForge `ChatTemplate` whose loss-mask spans are draftgen's answers."""

    name: str
    assistant_header: str
    """The tail of the generation prompt: the answer (loss mask 1) starts right after it."""
    end_of_turn_token: str
    """The stop token: the span ends with it, so the mask covers it as draftgen's does."""
    user_header: str
    stock_text: str
    """The stock SpecForge template whose spans are the same for pre-formatted text (where
    its system prompt is never used)."""
    stock_conversations: str | None
    """A stock template that renders conversations as this one does, if SpecForge has one."""
    after_answer: str = "\n"
    """What the target's chat template writes after the stop token of a finished turn."""

    def chat_template_fields(self) -> dict[str, Any]:
        """The keyword arguments of `specforge.data.template.ChatTemplate`. No system prompt:
        SpecForge would insert it into every conversation that has none, which the run's
        prompts did not have. The thinking parser keeps `reasoning_content`."""
        return {
            "assistant_header": self.assistant_header,
            "user_header": self.user_header,
            "system_prompt": None,
            "end_of_turn_token": self.end_of_turn_token,
            "parser_type": "thinking",
            "enable_thinking": True,
        }


TEMPLATES: dict[str, SpecForgeTemplate] = {
    "qwen3": SpecForgeTemplate(
        name="draftgen-qwen3",
        assistant_header="<|im_start|>assistant\n",
        end_of_turn_token="<|im_end|>",
        user_header=IM_START_USER,
        stock_text="qwen3-thinking",
        stock_conversations=None,
    ),
    "qwen3-thinking": SpecForgeTemplate(
        name="draftgen-qwen3-thinking",
        assistant_header="<|im_start|>assistant\n<think>\n",
        end_of_turn_token="<|im_end|>",
        user_header=IM_START_USER,
        stock_text="qwen3-next-thinking",
        stock_conversations="qwen3.5",
    ),
}
"""By draftgen format name. Formats not listed have no checked SpecForge template yet."""


def template_for(format_name: str | None) -> SpecForgeTemplate | None:
    return TEMPLATES.get(format_name or "")


def register_templates() -> list[str]:
    """Register every `draftgen-*` template in SpecForge's TEMPLATE_REGISTRY (idempotent)."""
    from specforge.data.template import TEMPLATE_REGISTRY, ChatTemplate

    for template in TEMPLATES.values():
        TEMPLATE_REGISTRY.register(template.name, ChatTemplate(**template.chat_template_fields()),
                                   override=True)
    return [t.name for t in TEMPLATES.values()]


# ---- which rows keep their IDs through the text routes --------------------------------------


@dataclass(frozen=True)
class RoundTrip:
    text: bool
    """encode(decode(input_ids)) == input_ids: text.jsonl gives SpecForge these IDs."""
    conversation: bool
    """The chat template's rendering of the conversation (prompt messages, then the answer as
    an assistant message) encodes to these IDs, then the template's `after_answer`."""


def round_trip(tokenizer: Tokenizer, fmt: Format | None, record: Record,
               ids: list[int], text: str, cut: bool) -> RoundTrip:
    """`text` is `tokenizer.decode(ids)`. A row cut at --max-len never round-trips as a
    conversation (the conversation holds the whole answer)."""
    template = template_for(fmt.name if fmt else None)
    conversation = (not cut and fmt is not None and template is not None
                    and _conversation_ids(tokenizer, fmt, template, record) == ids)
    return RoundTrip(tokenizer.encode(text) == ids, conversation)


def _conversation_ids(tokenizer: Tokenizer, fmt: Format, template: SpecForgeTemplate,
                      record: Record) -> list[int] | None:
    """The IDs SpecForge reads for this conversation, less the template's tail after the
    answer; None when the rendering does not end with that tail. The format renders the
    answer as a history turn, as the chat template does (edge newlines of reasoning and
    content stripped, tool-call separators of its own)."""
    messages = [*record.messages, answer_message(record)]
    # prompt_text ends with the generation prompt (the template's assistant header): the
    # rendering with add_generation_prompt=False is what precedes it.
    try:
        rendered = fmt.prompt_text(messages, record.tools or None)
    except FormatError:  # an answer the template cannot render (the row is not exact)
        return None
    tail = template.after_answer + template.assistant_header
    if not rendered.endswith(tail):
        return None
    return tokenizer.encode(rendered[: -len(tail)])


# ---- the launcher ---------------------------------------------------------------------------


USAGE = """usage: python -m draftgen.export.specforge [--pretokenized FILE] SCRIPT [ARGS...]
Registers the SpecForge chat templates {names} and runs SCRIPT (e.g. SpecForge's
scripts/prepare_hidden_states.py) with ARGS. --pretokenized FILE: SpecForge's
build_eagle3_dataset returns FILE's rows (exact IDs and loss masks) instead of re-tokenizing."""


class LauncherError(DraftgenError):
    """Bad launcher arguments or a pre-tokenized file that does not fit the script's data."""


def pretokenized_builder(path: str) -> Any:
    """A stand-in for `specforge.data.preprocessing.build_eagle3_dataset` that returns the rows
    of `path` (draftgen's pretokenized.jsonl) shaped as SpecForge's own: `input_ids`,
    `loss_mask`, `attention_mask` of shape (1, n), torch format, shuffled with its seed, cut to
    `max_length`, filtered as it filters. The dataset it is handed stands for the same rows
    (the conversations.jsonl of the same export): only its length is used."""
    import orjson
    from datasets import Dataset

    def build(dataset: Any, tokenizer: Any = None, chat_template: str | None = None,
              max_length: int | None = 2048, shuffle_seed: int | None = 42,
              num_proc: int | None = 8, cache_dir: str | None = None,
              cache_key: str | None = None, is_preformatted: bool | None = False,
              train_only_last_turn: bool | None = False,
              minimum_valid_tokens: int | None = None,
              loss_mask_filter: Any = None) -> Any:
        with open(path, "rb") as f:
            rows = [orjson.loads(line) for line in f if line.strip()]
        rows = rows[: len(dataset)]  # the script's --num-samples takes the first rows
        ids = [[r["input_ids"][:max_length]] for r in rows]
        masks = [[r["loss_mask"][:max_length]] for r in rows]
        out = Dataset.from_dict({"input_ids": ids, "loss_mask": masks,
                                 "attention_mask": [[[1] * len(i[0])] for i in ids]})
        out = out.shuffle(seed=shuffle_seed)
        if minimum_valid_tokens is not None:
            out = out.filter(lambda row: sum(row["loss_mask"][0]) >= minimum_valid_tokens)
        if loss_mask_filter is not None:
            out = out.filter(lambda row: loss_mask_filter(row["loss_mask"]))
        out.set_format(type="torch")
        return out

    return build


def _check_same_rows(pretokenized: str, script_args: list[str]) -> None:
    """The pre-tokenized file must hold the rows of the script's `--data-path`, in order: an
    export writes both with the same rows, so equal counts catch a file of another export."""
    data_path = _option(script_args, "--data-path")
    if data_path is None:
        raise LauncherError("--pretokenized: the script's arguments have no --data-path to "
                            "check it against")
    counts = {p: _count_lines(p) for p in (pretokenized, data_path)}
    if counts[pretokenized] != counts[data_path]:
        raise LauncherError(
            f"--pretokenized {pretokenized}: {counts[pretokenized]} rows, but --data-path "
            f"{data_path} has {counts[data_path]}: pass the pretokenized.jsonl exported with "
            f"that file")


def _option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _count_lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError as e:
        raise LauncherError(f"{path}: cannot be read ({e.strerror})") from None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pretokenized = None
    if args[:1] == ["--pretokenized"]:
        if len(args) < 2:
            raise LauncherError("--pretokenized needs a FILE")
        pretokenized, args = args[1], args[2:]
    if not args or args[0] in {"-h", "--help"}:
        print(USAGE.format(names=", ".join(t.name for t in TEMPLATES.values())))
        return 0 if args else 2
    register_templates()
    if pretokenized is not None:
        _check_same_rows(pretokenized, args)
        import specforge.data.preprocessing as preprocessing

        preprocessing.build_eagle3_dataset = pretokenized_builder(pretokenized)
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LauncherError as e:
        sys.exit(f"error: {e}")
