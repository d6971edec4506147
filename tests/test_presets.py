"""Dataset presets (presets.yaml): every preset read offline from a row written in its
dataset's real schema, mixes shared out by weight, user fields overriding the preset's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from draftgen.config import ConfigError, DatasetConfig, RowMapping, load_config
from draftgen.datasets import load_prompt_table, load_prompts
from draftgen.datasets.conversations import iter_conversations
from draftgen.presets import expand_datasets, registry

SPECFORGE = "SpecForge scripts/prepare_data.py"
SPECULATORS = "speculators 0.9.0 data_generation/configs.py"


@dataclass
class Fixture:
    source: str
    """Where the row's schema comes from."""
    row: dict[str, Any]
    prompt: list[dict[str, Any]]
    """The first turn's prompt messages."""
    conversation: list[tuple[str, str]] = field(default_factory=list)
    """The whole conversation's (role, content), where it differs from the prompt."""
    tools: list[str] | None = None
    """The tools' function names."""


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _pair(question: str, answer: str) -> list[tuple[str, str]]:
    return [("user", question), ("assistant", answer)]


NEMOTRON_ROW = {  # speculators' _normalize_nemotron: `input` messages, then `output`
    "input": [{"role": "user", "content": "Is 91 prime?"}], "output": "No: 7 × 13.",
    "category": "math", "license": "cc-by-4.0", "reasoning": "off",
    "generator": "Qwen-2.5-Math-7B-Instruct", "system_prompt": "detailed thinking off",
    "used_in_training": "Ultra, Super, Nano", "version": "v1",
}
SHAREGPT_CONVERSATION = [{"from": "human", "value": "Hi there"},
                         {"from": "gpt", "value": "Hello! How can I help?"}]
SHAREGPT_PAIR = _pair("Hi there", "Hello! How can I help?")

FIXTURES: dict[str, Fixture] = {
    "ultrachat": Fixture(
        f"{SPECFORGE} process_ultrachat_row; HuggingFaceH4/ultrachat_200k card",
        {"prompt": "Write a haiku", "prompt_id": "a1b2",
         "messages": [{"role": "user", "content": "Write a haiku"},
                      {"role": "assistant", "content": "Old pond..."},
                      {"role": "user", "content": "Another"},
                      {"role": "assistant", "content": "Frog jumps..."}]},
        _user("Write a haiku"),
        [("user", "Write a haiku"), ("assistant", "Old pond..."), ("user", "Another"),
         ("assistant", "Frog jumps...")]),
    "sharegpt": Fixture(
        f"{SPECFORGE} process_sharegpt_row and ROLE_MAPPING (human, gpt, chatgpt, bing, bard)",
        {"id": "QWJhYvA_0", "conversations": [
            {"from": "human", "value": "Summarize this"},
            {"from": "bing", "value": "Searching..."},
            {"from": "human", "value": "Thanks"}]},
        _user("Summarize this"),
        [("user", "Summarize this"), ("assistant", "Searching..."), ("user", "Thanks")]),
    "eaglechat": Fixture(
        f"{SPECFORGE}: read as is, in the script's output schema {{id, conversations: "
        "[{role, content}]}",
        {"id": "7", "conversations": [{"role": "user", "content": "Hi there"},
                                      {"role": "assistant", "content": "Hello! How can I help?"}]},
        _user("Hi there"), SHAREGPT_PAIR),
    "perfectblend": Fixture(
        f"{SPECFORGE}: process_sharegpt_row on mlabonne/open-perfectblend",
        {"conversations": SHAREGPT_CONVERSATION, "source": "slimorca"},
        _user("Hi there"), SHAREGPT_PAIR),
    **{name: Fixture(
        f"{SPECFORGE}: {name} read as is ({{conversations: [{{role, content}}]}})",
        {"conversations": [{"role": "user", "content": "Hi there"},
                           {"role": "assistant", "content": "Hello! How can I help?"}]},
        _user("Hi there"), SHAREGPT_PAIR)
       for name in ("perfectblend-llama3.1-8b-instruct", "perfectblend-llama3.3-70b-instruct",
                    "perfectblend-llama4-scout-instruct", "perfectblend-llama4-maverick-instruct")},
    "magpie": Fixture(
        f"{SPECULATORS} 'magpie' (conversations, instruction); regenerate_responses' "
        "--language-filter on `language`",
        {"uuid": "u-1", "instruction": "Hi there", "response": "Hello! How can I help?",
         "conversations": SHAREGPT_CONVERSATION, "language": "EN", "difficulty": "easy"},
        _user("Hi there"), SHAREGPT_PAIR),
    "magpie-qwen2.5-pro-1m": Fixture(
        f"{SPECFORGE}: uuid renamed id, then process_sharegpt_row",
        {"uuid": "u-2", "conversations": SHAREGPT_CONVERSATION},
        _user("Hi there"), SHAREGPT_PAIR),
    **{name: Fixture(f"{SPECULATORS} _normalize_nemotron", NEMOTRON_ROW,
                     _user("Is 91 prime?"), _pair("Is 91 prime?", "No: 7 × 13."))
       for name in ("nemotron", "nemotron-code", "nemotron-math")},
    "opc": Fixture(
        f"{SPECFORGE} process_opc_sft_stage1",
        {"instruction": "Reverse a list in Python", "output": "xs[::-1]", "tag": "code"},
        _user("Reverse a list in Python"), _pair("Reverse a list in Python", "xs[::-1]")),
    "codealpaca-20k": Fixture(
        f"{SPECFORGE} process_codealpaca_row docstring (instruction, input, output)",
        {"instruction": "Fix the bug", "input": "print(1", "output": "print(1)"},
        _user("Fix the bug\n\nprint(1")),
    "opencodeinstruct": Fixture(
        f"{SPECFORGE} process_opencodeinstruct_row docstring",
        {"id": "oci-1", "input": "Write fib(n)", "output": "def fib(n): ...",
         "domain": "generic", "generation_algorithm": "self-instruct", "llm_judgement": "{}",
         "unit_tests": "[]", "tests_execution_status": "[]", "average_test_score": "1.0"},
        _user("Write fib(n)"), _pair("Write fib(n)", "def fib(n): ...")),
    "magicoder-evol-instruct": Fixture(
        f"{SPECFORGE} process_magicoder_evol_instruct_row docstring",
        {"instruction": "Sort a dict by value", "response": "sorted(d.items(), ...)"},
        _user("Sort a dict by value"), _pair("Sort a dict by value", "sorted(d.items(), ...)")),
    "opencodereasoning": Fixture(
        "nvidia/OpenCodeReasoning card (id, input, output, source, license, dataset, split, "
        "difficulty, solution)",
        {"id": "ocr-1", "input": "Read n; print n*2.", "output": "<think>easy</think>print(...)",
         "source": "codeforces", "license": "cc-by-4.0", "dataset": "code_contests",
         "split": "train", "difficulty": "1", "solution": "print(int(input())*2)"},
        _user("Read n; print n*2."),
        _pair("Read n; print n*2.", "<think>easy</think>print(...)")),
    "gsm8k": Fixture(
        f"{SPECFORGE} process_gsm8k_row; {SPECULATORS} _normalize_gsm8k",
        {"question": "2 apples + 3 apples?", "answer": "2 + 3 = 5\n#### 5"},
        _user("2 apples + 3 apples?"), _pair("2 apples + 3 apples?", "2 + 3 = 5\n#### 5")),
    "hendrycks_math": Fixture(
        f"{SPECFORGE} process_hendrycks_math_row docstring",
        {"problem": "Solve $x+1=2$.", "level": "Level 1", "type": "Algebra",
         "solution": "$x=\\boxed{1}$"},
        _user("Solve $x+1=2$."), _pair("Solve $x+1=2$.", "$x=\\boxed{1}$")),
    "math_qa": Fixture(
        f"{SPECFORGE} process_math_qa_row docstring",
        {"Problem": "10% of 50?", "Rationale": "50 * 0.1 = 5", "options": "a ) 5 , b ) 10",
         "correct": "a", "annotated_formula": "multiply(50, 0.1)",
         "linear_formula": "multiply(n0,const_0_1)|", "category": "gain"},
        _user("10% of 50?\na ) 5 , b ) 10"),
        _pair("10% of 50?\na ) 5 , b ) 10", "50 * 0.1 = 5")),
    "openmathreasoning": Fixture(
        "nvidia/OpenMathReasoning card (problem, generated_solution, expected_answer, ...)",
        {"expected_answer": "4", "problem_type": "has_answer_extracted",
         "problem_source": "aops_c4", "generation_model": "DeepSeek-R1",
         "pass_rate_72b_tir": "n/a", "problem": "2+2?", "generated_solution": "<think>…</think>4",
         "inference_mode": "cot"},
        _user("2+2?"), _pair("2+2?", "<think>…</think>4")),
    "sciq": Fixture(
        f"{SPECFORGE} process_sciq_row docstring",
        {"question": "What gas do plants absorb?", "distractor3": "helium",
         "distractor1": "oxygen", "distractor2": "neon", "correct_answer": "carbon dioxide",
         "support": "Photosynthesis uses CO2."},
        _user("What gas do plants absorb?\na) oxygen\nb) neon\nc) carbon dioxide\nd) helium"),
        _pair("What gas do plants absorb?\na) oxygen\nb) neon\nc) carbon dioxide\nd) helium",
              "Photosynthesis uses CO2.\nanswer: c) carbon dioxide")),
    "camel": Fixture(
        f"{SPECFORGE} process_camel_row docstring (message_1 user, message_2 assistant)",
        {"role_1": "Biologist_RoleType.ASSISTANT", "topic;": "Zoology",
         "sub_topic": "Birds", "message_1": "Why do birds migrate?",
         "message_2": "For food and breeding."},
        _user("Why do birds migrate?"), _pair("Why do birds migrate?", "For food and breeding.")),
    "openthoughts": Fixture(
        "open-thoughts/OpenThoughts-114k card (system, conversations from user/assistant)",
        {"system": "Your role as an assistant involves thoroughly exploring questions...",
         "conversations": [{"from": "user", "value": "Prove 1 < 2."},
                           {"from": "assistant", "value": "<|begin_of_thought|>..."}]},
        _user("Prove 1 < 2."), _pair("Prove 1 < 2.", "<|begin_of_thought|>...")),
    "hermes-fc": Fixture(
        "speculators 0.9.0 regenerate_responses.extract_tools (tools column, a JSON string) "
        "and _tool_result_names; hermes-function-calling-v1 card (sharegpt structure)",
        {"id": "h-1", "category": "Finance", "subcategory": "Stocks", "task": "Fundamentals",
         "tools": orjson.dumps([{"type": "function", "function": {
             "name": "get_stock_fundamentals", "description": "Fundamentals",
             "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}}}}}
         ]).decode(),
         "conversations": [
             {"from": "system", "value": "You are a function calling AI model. <tools>...</tools>"},
             {"from": "human", "value": "Fetch TSLA fundamentals"},
             {"from": "gpt", "value": "<tool_call>\n{'arguments': {'symbol': 'TSLA'}, "
                                      "'name': 'get_stock_fundamentals'}\n</tool_call>"},
             {"from": "tool", "value": "<tool_response>\n{\"name\": "
                                       "\"get_stock_fundamentals\"}\n</tool_response>"},
             {"from": "gpt", "value": "TSLA's P/E is 49.6."}]},
        _user("Fetch TSLA fundamentals"), tools=["get_stock_fundamentals"]),
    "xlam-fc": Fixture(
        "Salesforce/xlam-function-calling-60k card (id, query, answers, tools: JSON strings)",
        {"id": 3, "query": "Weather in Paris?",
         "answers": '[{"name": "weather", "arguments": {"city": "Paris"}}]',
         "tools": '[{"name": "weather", "description": "Current weather", '
                  '"parameters": {"city": {"type": "str", "description": "City"}}}]'},
        _user("Weather in Paris?"), tools=["weather"]),
}


def _preset_config(name: str, data: Path, **fields: Any) -> DatasetConfig:
    """The (first) dataset a preset entry expands to, reading `data` instead of the hub."""
    return DatasetConfig(**expand_datasets([{"preset": name, "path": str(data), **fields}])[0])


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_every_preset_maps_its_rows_with_known_keys() -> None:
    for preset in registry().presets.values():
        if preset.rows is not None:
            RowMapping.model_validate(preset.rows)


def test_every_preset_has_a_fixture_row() -> None:
    assert set(registry().presets) == set(FIXTURES)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_preset_reads_its_schema(name: str, tmp_path: Path) -> None:
    fixture = FIXTURES[name]
    data = _write_rows(tmp_path / "rows.jsonl", [fixture.row])
    [prompt], stats = load_prompts(_preset_config(name, data))
    assert stats.bad_rows == 0, (fixture.source, stats.examples)
    assert prompt.messages == fixture.prompt, fixture.source
    tools = [t["function"]["name"] for t in prompt.tools or []]
    assert tools == (fixture.tools or []), fixture.source
    if fixture.conversation:
        [plan] = iter_conversations(_preset_config(name, data, turns="all"))
        said = [(m["role"], m["content"]) for turn in plan.turns
                for m in [*turn.context, *([turn.expected] if turn.expected else [])]]
        assert said == fixture.conversation, fixture.source


def test_drop_rules_leave_rows_out_and_count_them(tmp_path: Path) -> None:
    english = FIXTURES["magpie"].row
    other = {**english, "uuid": "u-9", "language": "ZH", "conversations": [
        {"from": "human", "value": "你好"}, {"from": "gpt", "value": "你好！"}]}
    data = _write_rows(tmp_path / "rows.jsonl", [other, english])
    cfg = _preset_config("magpie", data, limit=1)
    [prompt], stats = load_prompts(cfg)
    assert prompt.id == "magpie/u-1"
    assert (stats.rows, stats.dropped, stats.bad_rows) == (1, 1, 0)
    assert "1 dropped by rows.drop" in stats.summary()


def test_cached_jsonl_rows_are_mapped_again_when_reread(tmp_path: Path) -> None:
    data = _write_rows(tmp_path / "rows.jsonl", [FIXTURES["sciq"].row])
    cfg = _preset_config("sciq", data)
    cache = tmp_path / "cache.npz"
    fresh, _ = load_prompt_table(cfg, cache)
    fresh.save_cache()
    cached, _ = load_prompt_table(cfg, cache)
    assert cache.exists()  # the rows re-read by offset gave their cached IDs: kept
    assert [p.messages for p in cached] == [p.messages for p in fresh] \
        == [FIXTURES["sciq"].prompt]


def test_a_template_field_missing_is_a_bad_row_naming_it(tmp_path: Path) -> None:
    data = _write_rows(tmp_path / "rows.jsonl", [{"question": "only a question"}])
    prompts, stats = load_prompts(_preset_config("gsm8k", data))
    assert prompts == [] and stats.bad_rows == 1
    assert "'answer'" in stats.examples[0].reason


def test_mix_shares_its_budget_by_weight_and_takes_overrides() -> None:
    mix = registry().mixes["eagle3-reasoning"]
    entries = expand_datasets([{"preset_mix": "eagle3-reasoning", "max_output_tokens": 1000,
                                "turns": "last", "sets": {"ultrachat": {"limit": 5}}}])
    weights = {s.preset: s.weight for s in mix.sets}
    assert [e["name"] for e in entries] == list(weights)
    total = sum(weights.values())
    for entry in entries:
        assert entry["max_output_tokens"] == int(1000 * weights[entry["name"]] / total)
        assert entry["turns"] == "last" and entry["preset_mix"] == "eagle3-reasoning"
    assert [e.get("limit") for e in entries] == [5] + [None] * (len(entries) - 1)
    default = expand_datasets([{"preset_mix": "eagle3-reasoning"}])
    assert sum(e["max_output_tokens"] for e in default) <= mix.max_output_tokens


def test_expanded_entries_expand_to_themselves() -> None:
    once = expand_datasets([{"preset_mix": "eagle3-chat"}, {"preset": "camel", "limit": 9}])
    assert [e["name"] for e in once] == ["ultrachat", "sharegpt", "camel-biology",
                                         "camel-chemistry", "camel-physics"]
    assert [e["limit"] for e in once[2:]] == [3, 3, 3]
    assert expand_datasets(once) == once


def test_user_fields_override_the_preset(tmp_path: Path) -> None:
    cfg = DatasetConfig(**expand_datasets([{
        "preset": "magpie", "name": "mine", "split": "test",
        "rows": {"drop": []}}])[0])
    assert (cfg.name, cfg.path, cfg.split, cfg.preset) == (
        "mine", "Magpie-Align/Magpie-Llama-3.1-Pro-300K-Filtered", "test", "magpie")
    assert cfg.rows is not None and cfg.rows.messages == "conversations" and cfg.rows.drop == []


def _config_file(tmp_path: Path, datasets: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(f"""output_dir: {tmp_path / "out"}
model: {{name: m, format: qwen3, tokenizer: t.json}}
backends: [{{name: b, type: vllm, url: "http://127.0.0.1:1"}}]
datasets:
{datasets}
""")
    return path


def test_config_expands_presets(tmp_path: Path) -> None:
    cfg = load_config(_config_file(tmp_path, "  - {preset: gsm8k, limit: 10}\n"
                                              "  - {preset_mix: eagle3-chat}\n"))
    assert [(d.name, d.path, d.subset, d.limit) for d in cfg.datasets] == [
        ("gsm8k", "openai/gsm8k", "main", 10),
        ("ultrachat", "HuggingFaceH4/ultrachat_200k", None, None),
        ("sharegpt", "Aeala/ShareGPT_Vicuna_unfiltered", None, None)]


@pytest.mark.parametrize(("entry", "says"), [
    ("{preset: ultrachet}", "datasets: datasets.0: unknown preset 'ultrachet'"),
    ("{preset: camel/maths}", "preset 'camel' has no part 'maths'"),
    ("{preset_mix: nope}", "unknown preset_mix 'nope'"),
    ("{preset_mix: eagle3-chat, sets: {gsm8k: {limit: 1}}}", "not in mix 'eagle3-chat'"),
    ("{name: d, path: d.jsonl, rows: {answer: '{x}'}}", "datasets.0.rows: answer:"),
    ("{preset: gsm8k, colour: red}", "datasets.0.colour: unknown key"),
])
def test_config_errors_name_the_entry(tmp_path: Path, entry: str, says: str) -> None:
    with pytest.raises(ConfigError, match=r"run\.yaml: invalid config") as e:
        load_config(_config_file(tmp_path, f"  - {entry}\n"))
    assert says in str(e.value)


def test_hand_written_mapping_for_any_dataset(tmp_path: Path) -> None:
    data = _write_rows(tmp_path / "rows.jsonl", [
        {"q": "What is {x}?", "turns": [{"speaker": "bot", "text": "ignored"}]}])
    cfg = DatasetConfig(name="d", path=str(data), rows={"prompt": "Q: {q} {{literal}}"})
    [prompt], _ = load_prompts(cfg)
    assert prompt.messages == _user("Q: What is {x}? {literal}")
