"""Reference tables generated from the code, so they cannot drift from it.

- ``llfabric-settings``: every field of `fabric.config.Config`, its default, and its meaning
  (the comment above or beside it in fabric/config.py; one comment covers the fields that follow
  it up to the next comment).
- ``llfabric-protocol``: every request and event of `fabric.messages`, with its fields.
- ``llfabric-metrics``: every Prometheus metric a server and a cluster's front door define.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import os
import re
import tokenize
import typing
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]
METRIC_SOURCES = ("fabric/metrics.py", "fabric/cluster/metrics.py")
METRIC_KINDS = {"Counter": "counter", "Histogram": "histogram", "Gauge": "gauge",
                "GaugeMetricFamily": "gauge", "CounterMetricFamily": "counter"}


def field_comments(cls: type) -> dict[str, str]:
    """Each dataclass field of `cls` with the comment that explains it: the one above it and
    the one beside it; a field with neither shares the previous field's (a comment heads the
    fields that follow it, up to the next comment)."""
    source, _ = inspect.getsourcelines(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO("".join(source)).readline)
                if token.type == tokenize.COMMENT}
    found: dict[str, str] = {}
    block: list[str] = []  # the comment lines read since the last field
    shared = ""
    for number, line in enumerate(source, start=1):
        text = line.strip()
        match = re.match(r"(\w+)\s*:", text)
        if text.startswith("#"):
            block.append(comments[number])
        elif match and match.group(1) in names and len(line) - len(line.lstrip()) == 4:
            beside = comments.get(number, "")
            if block or beside:
                shared = " ".join([*block, beside]).strip()
            found[match.group(1)] = shared
            block = []
        else:
            block = []  # a comment that explains no field
    return found


def setting_default(config_field: dataclasses.Field) -> str:
    """The default as a user reads it: a path under their home or runtime folder spelled so."""
    if config_field.default is not dataclasses.MISSING:
        return repr(config_field.default)
    spelled = {"HOME": "/HOME", "XDG_RUNTIME_DIR": "/XDG_RUNTIME_DIR", "XDG_DATA_HOME": None,
               "XDG_CONFIG_HOME": None}
    saved = {key: os.environ.get(key) for key in spelled}
    try:
        for key, value in spelled.items():
            _set(key, value)
        value = str(config_field.default_factory())  # type: ignore[misc]
    finally:
        for key, value_saved in saved.items():
            _set(key, value_saved)
    return value.replace("/HOME", "~").replace("/XDG_RUNTIME_DIR", "$XDG_RUNTIME_DIR")


def _set(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def rst(text: str) -> str:
    """Comment or docstring text (Markdown-like: `code` or ``code``) as reStructuredText."""
    parts = " ".join(text.split()).replace("``", "`").split("`")
    out = []
    for index, part in enumerate(parts):
        if index % 2 == 0:
            out.append(re.sub(r"([\\*_|<>\[\]])", r"\\\1", part))
        elif part:
            before = "\\ " if out and out[-1][-1:].isalnum() else ""
            after = "\\ " if index + 1 < len(parts) and parts[index + 1][:1].isalnum() else ""
            out.append(f"{before}``{part}``{after}")
    return "".join(out)


def list_table(header: list[str], rows: list[list[str]], widths: str) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}",
             "   :width: 100%", ""]
    for row in [header, *rows]:
        for index, cell in enumerate(row):
            lines.append(f"   {'* -' if index == 0 else '  -'} {cell or '..'}")
    return lines


def type_name(kind: Any) -> str:
    kind = typing.get_args(kind)[0] if type(None) in typing.get_args(kind) else kind
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")


class _Generated(SphinxDirective):
    """A directive whose content is reStructuredText built from the code."""

    def lines(self) -> list[str]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        # the pages are MyST Markdown, which parses a directive's content as Markdown: the
        # generated reStructuredText goes through its eval-rst directive
        lines = ["````{eval-rst}", *self.lines(), "````"]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]),
                                self.content_offset, container)
        return container.children


class Settings(_Generated):
    def lines(self) -> list[str]:
        from fabric.config import Config

        self.env.note_dependency(str(ROOT / "fabric" / "config.py"))
        meanings = field_comments(Config)
        rows = [[f"``{f.name}`` ``LLFABRIC_{f.name.upper()}``", f"``{f.type}``",
                 f"``{setting_default(f)}``", rst(meanings[f.name])]
                for f in dataclasses.fields(Config)]
        return list_table(["Key and variable", "Type", "Default", "Meaning"], rows,
                          "22 8 18 52")


class Protocol(_Generated):
    def lines(self) -> list[str]:
        from fabric import messages

        self.env.note_dependency(str(ROOT / "fabric" / "messages.py"))
        out: list[str] = []
        for title, table, key in (("Requests", messages.REQUESTS, "op"),
                                  ("Events", messages.EVENTS, "event")):
            out += [f".. rubric:: {title}", ""]
            for name, cls in table.items():
                out += [f".. rubric:: ``{name}``", ""]
                out += [f"``{key}: {name!r}`` (``fabric.messages.{cls.__name__}``). "
                        + rst(inspect.getdoc(cls) if cls.__doc__ else ""), ""]
                out += self.fields(cls)
        return out

    @staticmethod
    def fields(cls: type) -> list[str]:
        hints = typing.get_type_hints(cls)
        meanings = field_comments(cls)
        rows = [[f"``{f.name}``", f"``{type_name(hints[f.name])}``",
                 "required" if f.default is dataclasses.MISSING else
                 "optional" if f.default is None else f"``{f.default!r}``",
                 rst(meanings.get(f.name, ""))] for f in dataclasses.fields(cls)]
        if not rows:
            return ["No fields beyond its name.", ""]
        return [*list_table(["Field", "Type", "Default", "Meaning"], rows, "16 14 14 56"), ""]


def metrics_of(path: Path) -> list[tuple[str, str, str, str]]:
    """(name, kind, labels, help) of each metric `path` constructs, from its syntax tree."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in METRIC_KINDS and len(node.args) >= 2):
            continue
        name, text = (_literal(arg) for arg in node.args[:2])
        labels = node.args[2] if len(node.args) > 2 else next(
            (k.value for k in node.keywords if k.arg in ("labels", "labelnames")), None)
        label_names = ", ".join(_literal(e) for e in labels.elts) if isinstance(
            labels, ast.List) else ""
        kind = METRIC_KINDS[node.func.id]
        found.append((name + ("_total" if kind == "counter" else ""), kind, label_names, text))
    return found


def _literal(node: ast.expr) -> str:
    """A string literal, or an f-string with its fields left as {name}."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_literal(v) if isinstance(v, ast.Constant) else
                       "{" + ast.unparse(v.value) + "}" for v in node.values)
    return ast.unparse(node)


class Metrics(_Generated):
    def lines(self) -> list[str]:
        out: list[str] = []
        for source in METRIC_SOURCES:
            self.env.note_dependency(str(ROOT / source))
            rows = [[f"``{name}``", kind, rst(f"`{labels}`") if labels else "", rst(text)]
                    for name, kind, labels, text in metrics_of(ROOT / source)]
            title = {"fabric/metrics.py": "A host's server",
                     "fabric/cluster/metrics.py": "A cluster's front door"}[source]
            out += [f".. rubric:: {title}", "", f"Defined in ``{source}``.", ""]
            out += [*list_table(["Metric", "Type", "Labels", "Meaning"], rows, "30 10 14 46"),
                    ""]
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("llfabric-settings", Settings)
    app.add_directive("llfabric-protocol", Protocol)
    app.add_directive("llfabric-metrics", Metrics)
    return {"parallel_read_safe": True, "version": "1"}
