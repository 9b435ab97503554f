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


def test_a_name_only_deleted_needs_no_value() -> None:
    assert analyze("del a, b\nprint(c)").only_deleted == {"a", "b"}
    assert analyze("print(a)\ndel a").only_deleted == frozenset()  # its value is read too
    assert analyze("def f():\n    global a\n    del a\n").only_deleted == {"a"}
    assert analyze("a = 1\ndel a").only_deleted == frozenset()  # the cell's own value


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


def test_eval_of_a_string_built_at_run_time_is_dynamic() -> None:
    cell = analyze("r = eval(expr)\n")
    assert cell.dynamic
    assert cell.forced_by == "eval"


def test_eval_and_exec_of_a_literal_at_top_level_are_read_as_code() -> None:
    cell = analyze("r = eval('a + b')\nexec('y = x')\nprint(y)\n")
    assert not cell.dynamic
    assert {"a", "b", "x", "y"} <= cell.reads  # y: the string's binding is not followed
    assert {"r", "y"} <= cell.writes
    # in a function, exec cannot bind the function's locals: a global y would be read
    assert analyze("def f():\n    exec('y = 1')\n    return y\n").dynamic


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


# Scopes, resolved as the compiler does.

def test_comprehension_variable_shadowing_a_global_is_not_a_read() -> None:
    cell = analyze("squares = [x * x for x in values]\n")
    assert "values" in cell.reads
    assert "x" not in cell.reads
    assert "x" not in cell.writes


def test_comprehension_reads_globals_in_its_element_and_conditions() -> None:
    cell = analyze("picked = {k: v * scale for k, v in table.items() if k not in skip}\n")
    assert {"table", "scale", "skip"} <= cell.reads
    assert not {"k", "v"} & cell.reads


def test_function_locals_and_parameters_are_not_reads() -> None:
    cell = analyze("def f(a, *rest, b=1, **kw):\n    c = a + b\n    return c, rest, kw, d\n")
    assert cell.reads == {"d"}
    assert cell.writes == {"f"}


def test_local_assigned_after_use_is_still_local() -> None:
    cell = analyze("def f():\n    print(v)\n    v = 2\n")
    assert "v" not in cell.reads  # an UnboundLocalError at run time, never the session's v


def test_closure_variable_of_an_enclosing_function_is_not_a_read() -> None:
    source = "def outer():\n    n = 0\n    def inner():\n        nonlocal n\n        n += step\n" \
             "        return n\n    return inner\n"
    cell = analyze(source)
    assert cell.reads == {"step"}


def test_class_body_reads_a_global() -> None:
    cell = analyze("class Config:\n    size = DEFAULT_SIZE\n    half = size // 2\n")
    assert "DEFAULT_SIZE" in cell.reads
    assert "Config" in cell.writes
    assert "size" not in cell.writes  # a class attribute, not a session variable


def test_method_does_not_see_class_attributes_as_locals() -> None:
    cell = analyze("class A:\n    rate = 1\n    def f(self):\n        return rate\n")
    assert "rate" in cell.reads  # a method's `rate` is the global, not A.rate


def test_function_default_reads_a_global_at_definition() -> None:
    cell = analyze("def f(lr=LR):\n    LR = 0\n    return lr\n")
    assert "LR" in cell.reads


def test_annotations_evaluated_at_definition_are_reads() -> None:
    cell = analyze("def f(x: Tensor) -> Result:\n    y: Local = x\n    return y\n")
    assert {"Tensor", "Result"} <= cell.reads


def test_walrus_in_a_comprehension_binds_the_global() -> None:
    cell = analyze("hits = [y for x in data if (y := f(x))]\nprint(y)\n")
    assert "y" in cell.writes
    assert {"data", "f"} <= cell.reads


def test_global_declaration_makes_a_function_write_the_session() -> None:
    cell = analyze("def reset():\n    global state\n    state = None\n")
    assert "state" in cell.writes
    assert "state" not in cell.reads


def test_match_captures_bind_and_class_patterns_read() -> None:
    source = ("match command:\n"
              "    case Move(x=dx) if dx > LIMIT:\n        last = dx\n"
              "    case {'k': v, **rest}:\n        last = v\n"
              "    case [first, *others]:\n        last = first\n")
    cell = analyze(source)
    assert {"command", "Move", "LIMIT"} <= cell.reads
    assert {"dx", "v", "rest", "first", "others", "last"} <= cell.writes
    assert not {"dx", "v", "first"} & cell.reads


def test_except_as_and_with_as_bind() -> None:
    cell = analyze("with open(path) as fh:\n    data = fh.read()\n"
                   "try:\n    go()\nexcept Failure as err:\n    log(err)\n")
    assert {"fh", "data", "err"} <= cell.writes
    assert {"path", "go", "Failure", "log"} <= cell.reads


def test_delete_is_recorded_and_needs_the_value() -> None:
    cell = analyze("del stale\n")
    assert cell.deletes == {"stale"}
    assert "stale" in cell.reads


def test_delete_of_a_function_local_is_not_a_session_delete() -> None:
    cell = analyze("def f():\n    tmp = 1\n    del tmp\n")
    assert cell.deletes == frozenset()


def test_name_bound_earlier_in_the_cell_is_not_read_from_the_session() -> None:
    cell = analyze("x = load()\ny = x + 1\nimport numpy as np\nz = np.ones(y)\n")
    assert cell.reads >= {"load"}
    assert not {"x", "y", "np"} & cell.reads


def test_conditional_binding_does_not_hide_a_read() -> None:
    cell = analyze("if flag:\n    x = 1\nprint(x)\n")
    assert {"flag", "x"} <= cell.reads


def test_read_before_binding_in_the_same_statement_is_a_read() -> None:
    cell = analyze("x = x + 1\nx = 2\n")
    assert "x" in cell.reads


# Markers that make the closure the whole session.

def test_locals_and_vars_at_module_level_are_dynamic_but_not_in_a_function() -> None:
    assert analyze("print(locals())\n").dynamic
    assert analyze("names = vars()\n").dynamic
    assert not analyze("def f(a):\n    return locals()\n").dynamic
    assert not analyze("print(vars(obj), dir(obj))\n").dynamic


def test_exec_and_main_module_are_dynamic() -> None:
    assert analyze("exec(code)\n").dynamic
    assert analyze("import __main__\nprint(__main__.x)\n").dynamic
    assert analyze("import sys\nns = sys.modules['__main__']\n").dynamic


def test_the_construct_that_forced_the_whole_session_is_named() -> None:
    cases = {
        "import sys\nv = getattr(sys.modules['__main__'], name)\n": "sys.modules['__main__']",
        "v = sys.modules[__name__]\n": "sys.modules[__name__]",
        "m = importlib.import_module('__main__')\n": "importlib.import_module('__main__')",
        "m = __import__('__main__')\n": "__import__('__main__')",
        "v = globals()[name]\n": "globals",
        "print(vars())\n": "vars()",
        "from pylab import *\n": "from pylab import *",
        "g = sys._getframe().f_globals\n": "sys._getframe().f_globals",
        "%who\n": "%who",
    }
    for source, construct in cases.items():
        assert analyze(source).forced_by == construct, source
    assert not analyze("if __name__ == '__main__':\n    main()\n").dynamic


def test_loading_pickled_data_is_noted() -> None:
    for source in ("m = torch.load(path, weights_only=False)\n", "p = joblib.load('p.joblib')\n",
                   "o = pickle.loads(blob)\n", "df = pd.read_pickle(path)\n"):
        assert analyze(source).unpickles, source
    assert not analyze("torch.save(model, path)\n").unpickles
    assert not analyze("config = json.loads(text)\n").unpickles


def test_method_named_eval_is_not_dynamic() -> None:
    assert not analyze("model.eval()\n").dynamic
    assert not analyze("model.eval(\n").dynamic  # nor in a draft


def test_cell_magic_body_is_analysed_as_code() -> None:
    cell = analyze("%%time\nx = 1\ny = x + w\n")
    assert "w" in cell.reads
    assert "x" not in cell.reads
    assert {"x", "y"} <= cell.writes


def test_dynamic_magic_in_a_cell_magic_body_is_dynamic() -> None:
    assert analyze("%%capture out\n%whos\n").dynamic


# Drafts.

def test_draft_analyses_the_blocks_that_parse_exactly() -> None:
    source = "def f(a):\n    return a * k\n\nresult = f(q\n"
    cell = analyze(source)
    assert not cell.parsed
    assert {"k", "q"} <= cell.reads
    assert "a" not in cell.reads  # the parsable block is still resolved by scope
    assert "f" in cell.writes


def test_loop_target_is_bound_inside_the_loop_but_not_after_it() -> None:
    cell = analyze("for batch in loader:\n    out = model(batch)\nprint(batch, out)\n")
    assert {"loader", "model", "batch", "out"} <= cell.reads  # zero iterations: session's


def test_loop_body_reading_its_own_target_is_not_a_read() -> None:
    cell = analyze("for x, y in loader:\n    loss = model(x) - y\n")
    assert cell.reads == {"loader", "model"}


def test_if_binding_in_both_branches_binds_surely() -> None:
    assert "x" not in analyze("if c:\n    x = 1\nelse:\n    x = 2\nprint(x)\n").reads
    assert "x" in analyze("if c:\n    x = 1\nelif d:\n    x = 2\nprint(x)\n").reads


def test_with_target_is_bound_in_the_body() -> None:
    cell = analyze("with open(p) as fh:\n    text = fh.read()\nprint(text)\n")
    assert "fh" not in cell.reads
    assert "text" in cell.reads  # a context manager may have swallowed an error


def test_try_body_binding_is_not_sure_in_handlers() -> None:
    cell = analyze("try:\n    v = risky()\nexcept E:\n    print(v)\nelse:\n    print(v)\n")
    assert "v" in cell.reads  # from the handler, where v may be the session's


def test_delete_then_read_needs_nothing_but_deleting_needs_the_value() -> None:
    cell = analyze("x = 1\ndel x\n")
    assert "x" not in cell.reads
    assert cell.deletes == {"x"}


def test_walrus_binding_is_not_sure() -> None:
    assert "y" in analyze("flag or (y := 5)\nprint(y)\n").reads


def test_reads_made_only_in_a_branch_are_maybe_reads() -> None:
    cell = analyze("if ready:\n    show(a)\nelif other:\n    show(b)\nelse:\n    c\nd\n"
                   "try:\n    e\nexcept (E, F):\n    g\nelse:\n    h\nfinally:\n    i\n"
                   "match s:\n    case [p] if guard:\n        q\n")
    # a branch's test, exception types and guards run before it is entered
    assert cell.maybe == {"show", "a", "other", "b", "c", "g", "h", "q"}
    assert {"ready", "d", "e", "E", "F", "i", "s", "guard"} <= cell.reads - cell.maybe
    assert cell.maybe <= cell.reads


def test_loops_nested_branches_and_reads_on_both_sides_are_not_maybe_reads() -> None:
    cell = analyze("for i in items:\n    if i:\n        a\nwhile w:\n    b\n"
                   "if c:\n    d\nd\nwith m:\n    if e:\n        f\n")
    assert cell.maybe == frozenset() and cell.reads >= {"a", "b", "d", "f"}


def test_a_name_bound_before_the_branch_is_no_read_and_one_bound_in_a_branch_is() -> None:
    cell = analyze("x = 1\nif c:\n    print(x, y)\nif c:\n    z = 2\nif c:\n    z\n")
    assert "x" not in cell.reads and {"y", "z"} <= cell.maybe


def test_source_that_does_not_parse_has_no_maybe_reads() -> None:
    assert analyze("if c:\n    x\ny = (\n").maybe == frozenset()
