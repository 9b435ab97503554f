"""Lineage plans on a real store: which cells rebuild what a version could not save, from where,
and when re-running them is refused."""

from __future__ import annotations

import dataclasses

import pytest

from fabric.closure.effects import unsafe
from fabric.snapshot import Manifest, Store, lineage


def _history(store: Store, cells: list[tuple[str, list[str]]]) -> Manifest:
    """Commit one version per (source, unsaved names); the head manifest."""
    head, manifest = None, None
    for count, (source, unsaved) in enumerate(cells, 1):
        manifest = Manifest(session="s", version=count, parent=head,
                            cell={"execution_count": count, "source": source, "status": "ok",
                                  "unsaved": unsaved, "run": 0.5})
        store.set_head("s", store.put_manifest(manifest.encode()), head)
        head = store.head("s")
    assert manifest is not None
    return manifest


def test_the_chain_starts_at_the_last_version_that_saved_everything(tmp_path) -> None:
    store = Store(tmp_path)
    head = _history(store, [("import torch\nx = torch.ones(2)", []), ("g = iter(x)", ["g"]),
                            ("y = 1", ["g"]), ("first = next(g)", ["g"])])
    plan = lineage.plan(store, head)
    assert plan is not None and plan.names == ["g"] and plan.start.version == 1
    assert [c["execution_count"] for c in plan.cells] == [2, 3, 4] and plan.seconds == 1.5


def test_nothing_to_rebuild_when_everything_was_saved(tmp_path) -> None:
    assert lineage.plan(Store(tmp_path), _history(Store(tmp_path), [("x = 1", [])])) is None


def test_a_chain_that_writes_outside_the_session_is_refused(tmp_path) -> None:
    store = Store(tmp_path)
    head = _history(store, [("x = 1", []), ("g = iter([x])", ["g"]), ("!rm -rf data", ["g"])])
    with pytest.raises(lineage.NotReplayable, match="cell 3 runs a shell command"):
        lineage.plan(store, head)


def test_before_the_first_cell_no_rng_state_was_recorded(tmp_path) -> None:
    store = Store(tmp_path)
    drawn = _history(store, [("import random\ng = iter([random.random()])", ["g"])])
    with pytest.raises(lineage.NotReplayable, match="random"):
        lineage.plan(Store(tmp_path), drawn)
    plain = _history(Store(tmp_path / "b"), [("g = (i for i in range(3))", ["g"])])
    plan = lineage.plan(Store(tmp_path / "b"), plain)
    assert plan is not None and plan.start.version == 0 and len(plan.cells) == 1


def test_a_checkout_has_the_lineage_of_the_version_it_copies(tmp_path) -> None:
    store = Store(tmp_path)
    made = _history(store, [("x = 1", []), ("g = iter([x])", ["g"]), ("del g", [])])
    version_2 = Manifest.decode(store.get_manifest(made.parent))
    checkout = dataclasses.replace(version_2, version=4, parent=store.head("s"),
                                   cell={"execution_count": 3, "source": "", "checkout": 2})
    plan = lineage.plan(store, checkout)
    assert plan is not None and plan.names == ["g"] and [c["source"] for c in plan.cells] == [
        "g = iter([x])"]


@pytest.mark.parametrize(("source", "why"), [
    ("loss = ((model(x) - y) ** 2).mean()", ""),
    ("%%capture out\nprint(next(g))", ""),
    ("%time y = sum(g)", ""),
    ("with open('data.csv') as f:\n    rows = f.read()", ""),
    ("f = open('log.txt', 'a')", "opens a file for writing"),
    ("torch.save(model.state_dict(), 'm.pt')", "calls save"),
    ("df.to_csv('out.csv')", "calls to_csv"),
    ("print('x', file=f)", "passes file="),
    ("%%writefile m.py\nx = 1", "runs %writefile"),
    ("%%capture\n!ls", "runs a shell command"),
    ("files = !ls", "runs a shell command"),
    ("import requests", "imports requests"),
    ("from urllib.request import urlopen", "imports urllib.request"),
    ("http.get(url)", "uses http"),
    ("eval(code)", "uses eval"),
    ("get_ipython().user_ns['x'] = 1", "uses get_ipython"),
    ("x = (", "does not parse"),
])
def test_only_cells_without_outside_effects_are_run_again(source: str, why: str) -> None:
    assert unsafe(source, {"http": "httpx"}) == why
