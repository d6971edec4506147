"""Kimi-K2.5's tool declaration: OpenAI tools as a TypeScript namespace.

Kimi-K2.5's tokenizer (`tokenization_kimi.py`) overrides `apply_chat_template`: it sorts every
mapping of the tool list by key, turns the list into TypeScript-style declarations and passes
that to the chat template as `tools_ts_str`, which the `tool_declare` turn prints instead of the
JSON list. When the conversion fails, it falls back to the JSON list. This module writes the
same text; it follows the behaviour of Moonshot's `tool_declaration_ts.py`:

    # Tools

    ## functions
    namespace functions {
    // Get the weather.
    type get_weather = (_: {
      // The city.
      city: string,
      unit?: "C" | "F"
    }) => any;
    }

- an object lists its required properties first, then the optional ones (`name?`), each group
  sorted by name, two spaces deeper per level, joined by ",\\n"; an empty object is `{}`;
  `additionalProperties` adds `[k: string]: T` (`any` for true, `never` for false);
- comments above a property: its description (one `// ` line per line, empty lines kept
  empty), then its constraints sorted by name (`// maxLength: 5, minLength: 1`: string
  maxLength/minLength/pattern, number/integer maximum/minimum, array maxItems/minItems), then
  `// Default: …` (JSON, or Python's repr for numbers and booleans);
- `integer` is `number`; `enum` is `"a" | 1`; `anyOf` is `A | B`; a list of types maps
  object → `{}`, array → `Array<any>`; an array is `Array<T>`, or, when T has comments, the
  comments and T on their own lines inside `Array<` … `>`; `{}` or `true` is `any`;
- `$ref: "#/$defs/X"` is `X`, and each `$defs` entry becomes `interface X {…}` before the
  function (`$ref: "#"`, a self-reference, names the root `parameters` interface).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from draftgen.errors import DraftgenError
from draftgen.formats.common import deep_sort, tojson

INDENT = "  "
FIELD_SEP = ",\n"
_CONSTRAINTS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
    "array": ("maxItems", "minItems"),
}
_UNION_NAMES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}


class SchemaError(DraftgenError, ValueError):
    """A schema the TypeScript encoder does not take (the tokenizer then falls back to JSON)."""


def comment(text: str, indent: str = "") -> str:
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


@dataclass
class _Refs:
    """`$defs` seen so far and whether the root refers to itself."""

    defs: dict[str, Any] = field(default_factory=dict)
    self_ref: bool = False


@dataclass
class _Type:
    """A parsed schema: `render(indent)` gives the type; `doc(indent)` the comment lines."""

    schema: dict[str, Any]
    kind: str
    refs: _Refs
    constraint_keys: Sequence[str] = ()

    def doc(self, indent: str) -> str:
        lines = []
        if self.schema.get("description"):
            lines.append(comment(self.schema["description"], indent))
        constraints = {k: self.schema[k] for k in self.constraint_keys if k in self.schema}
        if constraints:
            pairs = ", ".join(f"{k}: {v}" for k, v in sorted(constraints.items()))
            lines.append(f"{indent}// {pairs}")
        return "".join(line + "\n" for line in lines)

    def render(self, indent: str = "") -> str:
        return getattr(self, f"_render_{self.kind}")(indent)

    def _render_scalar(self, indent: str) -> str:
        t = self.schema.get("type", "any")
        return "number" if t == "integer" else str(t)

    def _render_enum(self, indent: str) -> str:
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in self.schema["enum"])

    def _render_any_of(self, indent: str) -> str:
        return " | ".join(parse(s, self.refs).render(indent) for s in self.schema["anyOf"])

    def _render_union(self, indent: str) -> str:
        try:
            return " | ".join(_UNION_NAMES[t] for t in self.schema["type"])
        except (KeyError, TypeError):
            raise SchemaError(f"unsupported type list {self.schema['type']!r}") from None

    def _render_ref(self, indent: str) -> str:
        return _ref_name(self.schema["$ref"], self.refs)

    def _render_array(self, indent: str) -> str:
        items = self.schema.get("items")
        item = parse(items, self.refs) if items else _Type({}, "scalar", self.refs)
        inner = indent + INDENT
        doc = item.doc(inner)
        if doc:
            return f"Array<\n{doc}{inner}{item.render(inner)}\n{indent}>"
        return f"Array<{item.render(indent)}>"

    def _render_object(self, indent: str) -> str:
        fields = [_field(name, prop, optional, self.refs, indent + INDENT)
                  for name, prop, optional in _properties(self.schema)]
        extra = self.schema.get("additionalProperties")
        if extra is not None:
            fields.append(f"{indent}{INDENT}[k: string]: {_extra_type(extra, self.refs, indent)}")
        if not fields:
            return "{}"
        return "{\n" + FIELD_SEP.join(fields) + f"\n{indent}}}"


def _ref_name(ref: str, refs: _Refs) -> str:
    if ref == "#":
        refs.self_ref = True
        return "parameters"
    if ref.startswith("#/$defs/"):
        name = ref.split("/")[-1]
        if name not in refs.defs:
            raise SchemaError(f"reference not found: {ref}")
        return name
    raise SchemaError(f"unsupported reference: {ref}")


def _extra_type(extra: Any, refs: _Refs, indent: str) -> str:
    if extra is True:
        return "any"
    if extra is False:
        return "never"
    if isinstance(extra, dict):
        return parse(extra, refs).render(indent + INDENT)
    raise SchemaError(f"unsupported additionalProperties: {extra!r}")


def _properties(schema: dict[str, Any]) -> list[tuple[str, Any, bool]]:
    """(name, schema, optional): required ones first, then optional ones, each sorted."""
    props = schema.get("properties")
    if not schema or props is None:
        return []
    required = set(schema.get("required", []))
    rows = [(name, prop, name not in required) for name, prop in props.items()]
    return sorted(rows, key=lambda r: (r[2], r[0]))


def _field(name: str, prop: Any, optional: bool, refs: _Refs, indent: str) -> str:
    t = parse(prop, refs)
    text = t.doc(indent)
    default = prop.get("default") if isinstance(prop, dict) else None
    if default is not None:
        shown = repr(default) if isinstance(default, int | float | bool) else tojson(default)
        text += f"{indent}// Default: {shown}\n"
    return f"{text}{indent}{name}{'?' if optional else ''}: {t.render(indent)}"


def _check_enum(schema: dict[str, Any]) -> None:
    if "type" not in schema:
        return
    t = schema["type"]
    if isinstance(t, list):
        if len(t) == 2 and "null" in t:
            t = t[0] if t[0] != "null" else t[1]
        elif len(t) == 1:
            t = t[0]
        else:
            raise SchemaError(f"enum type {t!r} is not supported")
    checks = {"string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,)}
    for value in schema["enum"]:
        if value is not None and t in checks and not isinstance(value, checks[t]):
            raise SchemaError(f"enum value {value!r} is not a {t}")


def parse(schema: Any, refs: _Refs) -> _Type:
    if isinstance(schema, bool):
        return _Type({"type": "any" if schema else "null"}, "scalar", refs)
    if not isinstance(schema, dict):
        raise SchemaError(f"invalid JSON schema: {schema!r}")
    if "$ref" in schema:
        return _Type(schema, "ref", refs)
    if "anyOf" in schema:
        return _Type(schema, "any_of", refs)
    if "enum" in schema:
        _check_enum(schema)
        return _Type(schema, "enum", refs)
    if "type" not in schema:
        if schema:
            raise SchemaError(f"invalid JSON schema: {schema!r}")
        return _Type({}, "scalar", refs)
    t = schema["type"]
    if isinstance(t, list):
        return _Type(schema, "union", refs)
    if t == "object":
        refs.defs.update(schema.get("$defs") or {})
        return _Type(schema, "object", refs)
    return _Type(schema, "array" if t == "array" else "scalar", refs, _CONSTRAINTS.get(t, ()))


def _function(fn: dict[str, Any]) -> str:
    refs = _Refs()
    schema = fn.get("parameters") or {}
    refs.defs.update(schema.get("$defs") or {})
    params = _Type(schema, "object", refs)  # parameters are an object, whatever "type" says
    body = params.render()  # rendering registers nested $defs and the self-reference
    interfaces = []
    if refs.self_ref:
        # The root interface lists the properties in their (key-sorted) order.
        required = set(schema.get("required", []))
        fields = FIELD_SEP.join(_field(n, p, n not in required, refs, INDENT)
                                for n, p in (schema.get("properties") or {}).items())
        interfaces.append("interface parameters {" + (f"\n{fields}\n" if fields else "") + "}")
        body = "parameters"
    for name, definition in dict(refs.defs).items():
        note = definition.get("description")
        described = comment(note) + "\n" if note else ""
        interfaces.append(f"{described}interface {name} {parse(definition, refs).render()}")
    description = fn.get("description")
    parts = ["\n".join(interfaces), comment(description) if description else "",
             f"type {fn.get('name', 'function')} = (_: {body}) => any;"]
    return "\n".join(p for p in parts if p)


def tools_typescript(tools: Sequence[dict[str, Any]]) -> str:
    """The `tools_ts_str` of a (key-sorted) tool list; "" when no function tool is in it."""
    functions = [_function(t["function"]) for t in tools
                 if t.get("type") == "function" and t.get("function")]
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"


def declare_tools(tools: Sequence[dict[str, Any]], *, typescript: bool) -> str:
    """The body of the `tool_declare` turn: the TypeScript declaration (Kimi-K2.5) or, when
    it is not wanted or fails, the key-sorted tool list as compact JSON."""
    ordered = deep_sort(list(tools))
    if typescript:
        try:
            text = tools_typescript(ordered)
        except Exception:  # as the tokenizer does: any failure means the JSON list
            text = ""
        if text:
            return text
    return tojson(ordered, compact=True)

