"""Dataset presets and mixes: `datasets: - {preset: ultrachat}` or `- {preset_mix: NAME}` in
run.yaml stand for the datasets described in presets.yaml (data, not code per dataset).

`expand_datasets` runs while the config loads (config.RunConfig): a `preset` entry becomes a
dataset entry with the preset's fields (name, hub path, subset, split, `rows` mapping), the
entry's own keys overriding them (`rows` merged key by key); a preset with parts becomes one
entry per part; a `preset_mix` entry becomes one entry per set of the mix, its totals
(`max_output_tokens`, `max_prompts`, `limit`) shared among the sets by weight, `sets:`
overriding a set's fields by its name. An expanded entry names the preset (and mix) it came
from, and expands to itself again.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from draftgen.errors import DraftgenError

if TYPE_CHECKING:
    from rich.console import Console

Kind = Literal["chat", "code", "math", "science", "reasoning", "tools"]
SHARED_TOTALS = ("max_output_tokens", "max_prompts", "limit")
"""A mix's (or a preset's parts') totals, shared among its datasets by weight."""
PART_SEPARATOR = "/"


class PresetError(DraftgenError):
    """presets.yaml is not valid (a packaging bug), or an entry names no known preset."""


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Part(_Data):
    """One dataset of a preset that spans several subsets or hub repositories."""

    subset: str | None = None
    path: str | None = None
    weight: float = Field(1.0, gt=0)


class Preset(_Data):
    name: str = ""
    hub: str
    subset: str | None = None
    split: str = "train"
    kind: Kind
    size: str
    """Approximate rows, as the dataset card gives them."""
    licence: str
    about: str
    rows: dict[str, Any] | None = None
    """How a row becomes messages and tools (`config.RowMapping`, checked when the entry it
    expands to is); None: its schema is detected."""
    parts: dict[str, Part] = Field(default_factory=dict)

    def dataset_fields(self, part: str | None = None) -> dict[str, Any]:
        """The run.yaml dataset keys this preset (or one of its parts) stands for."""
        fields: dict[str, Any] = {"name": self.name, "path": self.hub, "split": self.split,
                                  "preset": self.name}
        if self.subset is not None:
            fields["subset"] = self.subset
        if self.rows is not None:
            fields["rows"] = dict(self.rows)
        if part is not None:
            chosen = self.parts[part]
            fields["name"] = f"{self.name}-{part}"
            fields["preset"] = f"{self.name}{PART_SEPARATOR}{part}"
            if chosen.subset is not None:
                fields["subset"] = chosen.subset
            if chosen.path is not None:
                fields["path"] = chosen.path
        return fields


class MixSet(_Data):
    preset: str
    weight: float = Field(gt=0)


class Mix(_Data):
    name: str = ""
    about: str
    max_output_tokens: int | None = Field(None, gt=0)
    """The mix's total output-token budget, shared among its sets by weight."""
    sets: list[MixSet] = Field(min_length=1)


class Registry(_Data):
    presets: dict[str, Preset]
    mixes: dict[str, Mix]


@cache
def registry() -> Registry:
    """presets.yaml, read once and checked: every mix names known presets."""
    text = resources.files("draftgen").joinpath("presets.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    for kind in ("presets", "mixes"):
        for name, entry in data.get(kind, {}).items():
            entry["name"] = name
    try:
        found = Registry.model_validate(data)
    except ValidationError as e:
        raise PresetError(f"presets.yaml: {e}") from None
    for mix in found.mixes.values():
        for member in mix.sets:
            _preset_and_part(found, member.preset)
    return found


def _preset_and_part(reg: Registry, name: str) -> tuple[Preset, str | None]:
    base, _, part = name.partition(PART_SEPARATOR)
    preset = reg.presets.get(base)
    if preset is None:
        raise PresetError(f"unknown preset {name!r} (draftgen datasets lists them: "
                          f"{', '.join(sorted(reg.presets))})")
    if part and part not in preset.parts:
        raise PresetError(f"preset {base!r} has no part {part!r} (parts: "
                          f"{', '.join(preset.parts) or 'none'})")
    return preset, part or None


def expand_datasets(entries: list[Any]) -> list[Any]:
    """run.yaml's `datasets` with every preset and mix entry expanded (other entries as
    they are). `ValueError` (which the config reports under `datasets`) for an unknown
    name or a malformed entry."""
    out: list[Any] = []
    for index, entry in enumerate(entries):
        try:
            out += _expand(entry)
        except PresetError as e:
            raise ValueError(f"datasets.{index}: {e}") from None
    return out


def _expand(entry: Any) -> list[Any]:
    if not isinstance(entry, dict):
        return [entry]
    if "preset" in entry:
        return _expand_preset(entry)
    if "preset_mix" in entry:
        return _expand_mix(entry)
    return [entry]


def _expand_preset(entry: dict[str, Any]) -> list[dict[str, Any]]:
    name = entry["preset"]
    if not isinstance(name, str):
        raise PresetError(f"preset must be a name, got {name!r}")
    preset, part = _preset_and_part(registry(), name)
    if part is None and preset.parts:
        prefix = entry.get("name", preset.name)
        members = [(f"{preset.name}{PART_SEPARATOR}{p}", spec.weight, {"name": f"{prefix}-{p}"})
                   for p, spec in preset.parts.items()]
        common = {k: v for k, v in entry.items() if k not in ("preset", "name")}
        return _shared(members, common, {})
    return [_merged(preset.dataset_fields(part), entry)]


def _expand_mix(entry: dict[str, Any]) -> list[dict[str, Any]]:
    name = entry["preset_mix"]
    mix = registry().mixes.get(name) if isinstance(name, str) else None
    if mix is None:
        raise PresetError(f"unknown preset_mix {name!r} (draftgen datasets lists them: "
                          f"{', '.join(sorted(registry().mixes))})")
    overrides = entry.get("sets", {})
    names = [m.preset.partition(PART_SEPARATOR)[0] for m in mix.sets]
    if not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in
                                                  overrides.values()):
        raise PresetError("sets: must map a set's name to the fields it overrides")
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise PresetError(f"sets: {unknown} not in mix {mix.name!r} (its sets: "
                          f"{', '.join(names)})")
    common = {k: v for k, v in entry.items() if k not in ("sets", "name")}
    if mix.max_output_tokens is not None:
        common.setdefault("max_output_tokens", mix.max_output_tokens)
    prefix = f"{entry['name']}-" if isinstance(entry.get("name"), str) else ""
    members = [(m.preset, m.weight, {"name": prefix + base} if prefix else {})
               for m, base in zip(mix.sets, names, strict=True)]
    return _shared(members, common, overrides)


def _shared(members: list[tuple[str, float, dict[str, Any]]], common: dict[str, Any],
            overrides: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One preset entry per member: `common` keys, the totals among them shared by weight,
    then the member's own keys and `overrides` under its preset's name."""
    total_weight = sum(weight for _, weight, _ in members)
    out: list[dict[str, Any]] = []
    for preset, weight, own in members:
        entry = {k: v for k, v in common.items() if k not in SHARED_TOTALS}
        for key in SHARED_TOTALS:
            total = common.get(key)
            if isinstance(total, int) and not isinstance(total, bool):
                entry[key] = max(1, int(total * weight / total_weight))
            elif total is not None:
                entry[key] = total  # not a count: validation says so, naming the key
        entry.update(own)
        entry["preset"] = preset
        entry.update(overrides.get(preset.partition(PART_SEPARATOR)[0], {}))
        out += _expand_preset(entry)
    return out


def _merged(fields: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The preset's fields with the entry's over them; `rows` merged key by key."""
    merged = {**fields, **entry}
    if isinstance(fields.get("rows"), dict) and isinstance(entry.get("rows"), dict):
        merged["rows"] = {**fields["rows"], **entry["rows"]}
    return merged


# ---------------------------------------------------------------------------------------------
# `draftgen datasets`


def print_presets(console: Console, kind: str | None = None) -> None:
    """The presets (of one kind) and the mixes, as two tables."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    reg = registry()
    presets = [p for p in reg.presets.values() if kind is None or p.kind == kind]
    if not presets:
        raise PresetError(f"no preset of kind {kind!r} (kinds: {', '.join(_kinds(reg))})")
    table = Table(title="presets: datasets: - {preset: NAME}", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("NAME, hub dataset (subset) [split]", overflow="fold")
    for column in ("kind", "size", "licence"):
        table.add_column(column, no_wrap=True)
    for p in presets:
        where = p.hub + (f" ({p.subset})" if p.subset else "") + f" [{p.split}]"
        parts = f", {len(p.parts)} parts" if p.parts else ""
        cell = Text(p.name, style="bold")
        cell.append(f"\n{where}{parts}", style="dim")
        table.add_row(cell, p.kind, p.size, p.licence)
    console.print(table)
    if kind is None:
        console.print(_mix_table(reg))


def _mix_table(reg: Registry) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title="mixes: datasets: - {preset_mix: NAME}", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("NAME", no_wrap=True)
    table.add_column("sets (weight)", ratio=1)
    table.add_column("output tokens", justify="right", no_wrap=True)
    for mix in reg.mixes.values():
        sets = ", ".join(f"{m.preset} ({m.weight:g})" for m in mix.sets)
        total = f"{mix.max_output_tokens:,}" if mix.max_output_tokens else "-"
        table.add_row(mix.name, sets, total)
    return table


def _kinds(reg: Registry) -> list[str]:
    return sorted({p.kind for p in reg.presets.values()})


def print_preset(console: Console, name: str) -> None:
    """One preset or mix in full: where it is, what it is, how its rows are read, and the
    run.yaml datasets it stands for."""
    reg = registry()
    if name in reg.mixes:
        mix = reg.mixes[name]
        lines = [f"mix {mix.name}: {mix.about}"]
        entry: dict[str, Any] = {"preset_mix": name}
    else:
        preset, _ = _preset_and_part(reg, name)
        lines = [f"preset {preset.name} ({preset.kind}, {preset.size} rows, licence "
                 f"{preset.licence}): {preset.about}"]
        entry = {"preset": name}
    expanded = expand_datasets([entry])
    lines += ["", "run.yaml:", "  datasets:", f"    - {_flow(entry)}", "",
              "stands for:", yaml.dump(expanded, Dumper=_Dumper, sort_keys=False, width=1_000,
                                       allow_unicode=True).rstrip()]
    console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=False)


class _Dumper(yaml.SafeDumper):
    """YAML with strings of several lines written quoted on one line ("a\\nb")."""


def _one_line_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text,
                                   style='"' if "\n" in text else None)


_Dumper.add_representer(str, _one_line_str)


def _flow(entry: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in entry.items()) + "}"
