"""The documentation: the site builds with warnings as errors (every internal reference
resolved), it names no file or LLFABRIC_* variable that does not exist, and nothing it generates
from the code (settings, commands) lacks its explanation."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from cli.main import main as llfabric
from fabric.config import Config, fields

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md",
         *(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
# a backticked path into the repository: `fabric/pool/criu.py`, `tests/lab`, `bench/gpu.py`
PATH = re.compile(r"`((?:fabric|cli|tests|bench|scripts|native|labextension|docs|corpus|vagrant)"
                  r"/[\w./-]*)`")
LINK = re.compile(r"\]\(([^)#:]+?)(?:#[^)]*)?\)")  # a Markdown link or image to a local file
VARIABLE = re.compile(r"\bLLFABRIC_[A-Z_]+\b")

sys.path.insert(0, str(DOCS / "_ext"))
from reference import field_comments  # noqa: E402  (docs/_ext is no package)


def test_the_site_builds_with_warnings_as_errors_and_its_generated_pages(
        tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q",
                            "-b", "html", str(DOCS), str(tmp_path)], capture_output=True,
                           text=True, timeout=600, cwd=ROOT)
    assert built.returncode == 0, built.stdout[-5000:] + built.stderr[-5000:]
    settings = (tmp_path / "reference" / "settings.html").read_text()
    assert all(f"LLFABRIC_{f.name.upper()}" in settings for f in fields(Config))
    commands = (tmp_path / "reference" / "cli.html").read_text()
    assert all(f'id="{name.replace(" ", "-")}"' in commands
               for name, _ in _commands(llfabric, "llfabric"))
    assert "llfabric_cell_visible_delay_seconds" in (
        tmp_path / "reference" / "metrics.html").read_text()
    assert "execute" in (tmp_path / "reference" / "protocol.html").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page: Path) -> None:
    text = page.read_text()
    named = [ROOT / path.rstrip(".") for path in PATH.findall(text)]
    named += [page.parent / link for link in LINK.findall(text)]
    missing = [str(p) for p in named if not p.exists()]
    assert not missing, f"{page.name} names files that do not exist: {missing}"


def test_every_llfabric_variable_the_docs_name_is_read_somewhere() -> None:
    settings = {f"LLFABRIC_{f.name.upper()}" for f in fields(Config)}
    code = "".join(p.read_text() for folder in ("fabric", "cli", "tests", "bench")
                   for p in (ROOT / folder).rglob("*.py")) + (ROOT / "Makefile").read_text()
    unknown = {name for page in PAGES for name in VARIABLE.findall(page.read_text())
               if name not in settings and f'"{name}"' not in code and f"{name}=" not in code
               and f"'{name}'" not in code}
    assert not unknown, f"the docs name variables nothing reads: {sorted(unknown)}"


def test_every_setting_has_its_meaning_in_the_code() -> None:
    meanings = field_comments(Config)
    assert set(meanings) == {f.name for f in fields(Config)}
    assert not [name for name, text in meanings.items() if not text.strip()]


def _commands(group: click.Group, prefix: str) -> list[tuple[str, click.Command]]:
    found = []
    for name, command in group.commands.items():
        found.append((f"{prefix} {name}", command))
        if isinstance(command, click.Group):
            found += _commands(command, f"{prefix} {name}")
    return found


def test_every_command_and_option_has_help() -> None:
    lacking = []
    for name, command in [("llfabric", llfabric), *_commands(llfabric, "llfabric")]:
        if not (command.help or "").strip():
            lacking.append(name)
        lacking += [f"{name} {option.opts[0]}" for option in command.params
                    if isinstance(option, click.Option) and not (option.help or "").strip()]
    assert not lacking, f"commands and options without help: {lacking}"


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
