"""The docs cannot drift from the code or break: the generated reference pages are what
scripts/gen_docs.py makes of the code now, every field has the docstring that is its row, every
relative link of the README and of docs/ reaches a file and a heading that exist (as GitHub
and the site resolve them), every page is in the site's nav, the README's first real run
is a config that loads, and the reference pages' code blocks fit 80 columns. (.ci/run also
builds the site with `mkdocs build --strict`.)"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

from draftgen.config import RunConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gen_docs = _gen_docs()


def test_the_generated_pages_are_what_the_code_gives_now() -> None:
    assert gen_docs.stale_pages() == [], "run: python scripts/gen_docs.py"


def test_the_configuration_page_names_every_key_of_run_yaml() -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for section in gen_docs.sections(RunConfig):
        assert f"### {section.title}\n" in page
        for model in section.models:
            for key in model.model_fields:
                assert re.search(rf"^\| `{key}` \|", page.split(f"### {section.title}\n")[1],
                                 re.M), f"{section.path}.{key} is not in docs/configuration.md"


def test_a_field_without_a_docstring_stops_the_generator() -> None:
    class Documented(BaseModel):
        kept: int = 1
        """A documented key."""
        forgotten: int = 2

    assert gen_docs.attribute_docstrings(Documented) == {"kept": "A documented key."}
    with pytest.raises(gen_docs.UndocumentedField, match=r"Documented\.forgotten"):
        list(gen_docs._section_table(gen_docs.Section("x", [Documented]), str))


def _headings(path: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks), as GitHub and the site make
    them; a repeated heading gets -1, -2, ... as on GitHub."""
    anchors: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+?)\s*$", line)):
            anchor = gen_docs.slug(m.group(1).replace("`", ""))
            n, unique = 0, anchor
            while unique in anchors:
                n += 1
                unique = f"{anchor}-{n}"
            anchors.add(unique)
    return anchors


def _links(path: Path) -> list[str]:
    """The relative link targets of a page's text (code blocks and code spans left out)."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text)
            if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_relative_link_reaches_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for target in _links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _headings(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_every_docs_page_is_in_the_site_nav() -> None:
    nav = re.findall(r"^\s+- [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == sorted(p.name for p in PAGES)


def _yaml_blocks(path: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_first_real_run_is_a_config_that_loads(page: str, tmp_path: Path) -> None:
    (first,) = [b for b in _yaml_blocks(ROOT / page) if b.startswith("# run.yaml")]
    path = tmp_path / "run.yaml"
    path.write_text(first, encoding="utf-8")
    config = load_config(path)
    assert config.budget.usd is not None and config.backends[0].is_paid


CODE_COLUMNS = 80
"""What a code block of the site shows without scrolling, beside the navigation."""


@pytest.mark.parametrize("page", ["configuration.md", "run-folder.md"])
def test_the_reference_pages_code_blocks_fit_80_columns(page: str) -> None:
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", (DOCS / page).read_text(encoding="utf-8"),
                        re.S | re.M)
    long = [line for block in blocks for line in block.splitlines()
            if len(line) > CODE_COLUMNS]
    assert not long, f"docs/{page}: code lines cut off on the right: {long}"
