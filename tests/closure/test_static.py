"""Static analysis of a cell's source: what it reads, writes and imports."""

from __future__ import annotations

import time

from fabric.closure import analyze


def test_reads_and_writes_are_separated() -> None:
    cell = analyze("y = x + 1\nz = y * w\n")
    assert cell.parsed
    assert {"x", "w"} <= cell.reads
    assert {"y", "z"} <= cell.writes
    assert "x" not in cell.writes
    assert not cell.dynamic


def test_function_body_reading_a_global_counts_as_a_read() -> None:
    cell = analyze("def f(a):\n    return K * a\n")
    assert "K" in cell.reads
    assert "f" in cell.writes
    assert "f" not in cell.reads


def test_defaults_and_decorators_are_read_at_definition() -> None:
    cell = analyze("@deco\ndef f(a=DEFAULT, *, b=KW):\n    return a\n")
    assert {"deco", "DEFAULT", "KW"} <= cell.reads


def test_nested_scopes_lambda_comprehension_and_class_bodies_read_globals() -> None:
    source = (
        "class C(Base):\n"
        "    attr = SETTING\n"
        "    def m(self):\n"
        "        return [helper(i) for i in items]\n"
        "g = lambda q: q + OFFSET\n"
    )
    cell = analyze(source)
    assert {"Base", "SETTING", "helper", "items", "OFFSET"} <= cell.reads
    assert {"C", "g"} <= cell.writes


def test_augmented_assignment_reads_its_target() -> None:
    cell = analyze("total += step\n")
    assert {"total", "step"} <= cell.reads
    assert "total" in cell.writes


def test_augmented_assignment_to_attribute_and_subscript_reads_the_base() -> None:
    cell = analyze("obj.count += 1\ntable[k] -= 2\n")
    assert {"obj", "table", "k"} <= cell.reads


def test_del_reads_the_name() -> None:
    assert "victim" in analyze("del victim\n").reads


def test_global_statement_is_read_and_written() -> None:
    cell = analyze("def bump():\n    global counter\n    counter = counter + 1\n")
    assert "counter" in cell.reads
    assert "counter" in cell.writes


def test_imports_are_recorded_with_their_bound_names() -> None:
    cell = analyze("import a.b as c\nfrom x import y\nimport p.q\nfrom m import n as o\n")
    assert cell.imports >= {"a.b", "x", "p.q", "m"}
    assert cell.writes >= {"c", "y", "p", "o"}
    # the alias is bound, not the dotted module's head
    assert "a" not in cell.writes
    assert not cell.dynamic


def test_relative_import_is_not_a_module_to_preload() -> None:
    cell = analyze("from . import sibling\n")
    assert "sibling" in cell.writes
    assert cell.imports == frozenset()


def test_star_import_is_dynamic() -> None:
    cell = analyze("from os.path import *\n")
    assert cell.dynamic
    assert "os.path" in cell.imports


def test_globals_call_is_dynamic() -> None:
    assert analyze("print(globals()['x'])\n").dynamic


def test_eval_is_dynamic() -> None:
    assert analyze("r = eval('a + b')\n").dynamic


def test_user_ns_access_is_dynamic() -> None:
    assert analyze("ns = get_ipython().user_ns\n").dynamic


def test_get_ipython_alone_is_not_dynamic() -> None:
    assert not analyze("ip = get_ipython()\n").dynamic


def test_who_magic_is_dynamic() -> None:
    cell = analyze("%who\n")
    assert cell.parsed
    assert cell.dynamic


def test_plain_cell_is_not_dynamic() -> None:
    assert not analyze("a = [b, c]\nprint(len(a))\n").dynamic


def test_line_magic_exposes_the_names_in_its_argument() -> None:
    cell = analyze("%timeit f(x)\n")
    assert cell.parsed
    assert {"f", "x"} <= cell.reads
    assert not cell.dynamic
    assert "run_line_magic" in cell.source  # analysed as IPython will run it


def test_shell_line_exposes_dollar_variables() -> None:
    cell = analyze("!echo $v\n")
    assert cell.parsed
    assert "v" in cell.reads


def test_shell_assignment_writes_its_target_and_reads_its_variables() -> None:
    cell = analyze("files = !ls {folder}\n")
    assert "folder" in cell.reads
    assert "files" in cell.writes


def test_cell_magic_exposes_the_names_in_its_body() -> None:
    cell = analyze("%%time\nresult = model(batch)\n")
    assert cell.parsed
    assert {"model", "batch"} <= cell.reads
    assert "run_cell_magic" in cell.source


def test_unparsable_draft_reads_every_identifier() -> None:
    source = "for i in range(n):\n    total = total + data[i\n"
    cell = analyze(source)
    assert not cell.parsed
    assert {"n", "total", "data", "i", "range"} <= cell.reads
    assert not cell.dynamic


def test_unparsable_draft_reads_a_superset_of_what_the_finished_cell_reads() -> None:
    finished = "out = transform(frame, scale)\nprint(out)\n"
    draft = "out = transform(frame, scale\nprint(out)\n"
    assert not analyze(draft).parsed
    assert analyze(draft).reads >= analyze(finished).reads


def test_typical_cell_analyses_quickly() -> None:
    lines = [f"import mod{i % 3} as m{i % 3}" for i in range(3)]
    lines += [f"v{i} = m{i % 3}.f(v{i - 1}, w) + {i}" for i in range(1, 20)]
    lines += [
        "def step(batch, lr=LR):",
        "    for k, p in params.items():",
        "        p -= lr * grads[k]",
        "    return loss(batch)",
        "",
        "history = [step(b) for b in loader]",
        "%timeit step(first)",
        "print(history[-1])",
    ]
    source = "\n".join(lines) + f"\n# unique {time.perf_counter_ns()}\n"  # dodge the cache
    assert len(source.splitlines()) >= 30
    start = time.perf_counter()
    cell = analyze(source)
    elapsed = time.perf_counter() - start
    assert cell.parsed
    assert {"params", "grads", "loss", "loader", "first", "LR", "w"} <= cell.reads
    assert elapsed < 5  # generous: only guards against pathological blow-ups
