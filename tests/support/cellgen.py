"""Generated notebooks: cell sequences built from what notebook code does to a session's state.

`programs()` is a hypothesis strategy for a list of `Step`s: before each cell, what happens to
the session's worker (kept, retired, killed, prepared by a draft), then the cell. A small model
of the namespace (which name holds what kind of value) picks cells that mostly make sense, so
examples reach deep states instead of stopping at a NameError; cells that raise are fine, they
are deterministic too. Every cell is deterministic and prints what it changed, and the last one
(`PROBE`) prints a fingerprint of every user-visible name, so a wrong state shows as a wrong
output. Random values are drawn only after the generator has seeded that RNG in an earlier cell
(the session carries RNG state from cell to cell).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from hypothesis import event
from hypothesis import strategies as st

from fabric.closure.effects import unsafe
from fabric.snapshot.lineage import RANDOM

# What happens to the session's worker before a cell:
#  keep   - nothing: the cell runs on the worker kept warm after the previous one
#  draft  - the cell's source is sent as a draft first (the worker is prepared for it)
#  edit   - a draft of another cell first, as when the user edits before running
#  retire - the server retires the worker (a checkout of the head: keep_warm=0's cold path)
#  reopen - the session is closed and opened again, as after a kernel restart
#  kill   - the kept worker is killed with SIGKILL; the cell must start on a fresh one
#  restart - the server is stopped and started again on its store, the session reopened
KEEPING = ("keep", "draft", "edit")
LOSING = ("retire", "reopen", "kill", "restart")
DISRUPTIONS = KEEPING + LOSING


class Step(NamedTuple):
    disruption: str
    source: str

    def __repr__(self) -> str:  # as a regression test writes it
        source = "PROBE" if self.source == PROBE else repr(self.source)
        return f"Step({self.disruption!r}, {source})"


NAMES = ("a", "b", "c")  # few names, so cells rebind, alias and delete each other's values

# Values that cannot be saved: the session keeps the worker that holds them, and a fresh worker
# recomputes them by re-running the cells since the last version that saved everything; where
# that is not safe (a cell in that chain writes a file or runs a shell command, or the chain
# starts before any RNG state was recorded) they are lost: losing disruptions wait until then.
FRAGILE = frozenset({"gen", "file", "graph", "boxed"})


@dataclass
class Model:
    """What the generator believes the namespace holds: name -> kind of value."""

    kinds: dict[str, str] = field(default_factory=dict)
    seeded: set[str] = field(default_factory=set)  # RNGs seeded in an earlier cell
    class_version: int = 0  # how often class C was (re)defined
    setter: str | None = None  # the global that function setg writes
    reader: str | None = None  # the global that lambda reader reads
    graphs: dict[str, str] = field(default_factory=dict)  # graph tensor -> its leaf
    views: dict[str, str] = field(default_factory=dict)  # view -> the array it was taken of
    chain: list[str] = field(default_factory=list)  # cells since nothing fragile was live
    from_root: bool = True  # that chain starts at the session's first cell
    numpy: bool = False  # `np` names numpy (a cell imported it, none rebound it since)

    def live(self, *kinds: str) -> list[str]:
        return sorted(n for n, k in self.kinds.items() if not kinds or k in kinds)

    def fragile(self) -> bool:
        return any(k in FRAGILE for k in self.kinds.values())

    def ran(self, source: str) -> None:
        if self.fragile():
            self.chain.append(source)
        else:
            self.chain, self.from_root = [], False

    def recomputable(self) -> bool:
        """Whether a fresh worker can rebuild what cannot be saved (see fabric.snapshot.lineage)."""
        return not any(unsafe(s) for s in self.chain) and not (
            self.from_root and any(RANDOM.search(s) for s in self.chain))

    def bind(self, name: str, kind: str) -> None:
        self.kinds[name] = kind
        self.graphs.pop(name, None)
        self.views.pop(name, None)


Draw = Callable  # hypothesis' draw
Action = Callable[[Draw, Model], str]


def _pick(draw: Draw, names: list[str]) -> str:
    return draw(st.sampled_from(names))


def _target(draw: Draw) -> str:
    return draw(st.sampled_from(NAMES))


def _k(draw: Draw) -> int:
    return draw(st.integers(0, 9))


LITERALS = {
    "int": lambda k: str(k),
    "str": lambda k: repr("s" * k),
    "list": lambda k: repr(list(range(k % 4))),
    "dict": lambda k: repr({"k": k}),
    "tuple": lambda k: repr((k, k + 1)),
}


def assign(draw: Draw, m: Model) -> str:
    name, kind, k = _target(draw), draw(st.sampled_from(sorted(LITERALS))), _k(draw)
    m.bind(name, kind)
    return f"{name} = {LITERALS[kind](k)}\nprint(repr({name}))"


def alias(draw: Draw, m: Model) -> str:
    live = m.live()
    if not live:
        return assign(draw, m)
    source, name = _pick(draw, live), _target(draw)
    kind = m.kinds[source]
    m.bind(name, kind)
    if source in m.graphs:
        m.graphs[name] = m.graphs[source]
    return f"{name} = {source}\nprint({name} is {source})"


AUGMENT = {"int": "{k}", "str": "'t'", "list": "[{k}]", "tuple": "({k},)"}


def contain(draw: Draw, m: Model) -> str:
    live = m.live()
    if not live:
        return assign(draw, m)
    inner, name = _pick(draw, live), _target(draw)
    # holds `inner`'s object: the two share a group (and what cannot be saved stays so)
    m.bind(name, "boxed" if m.kinds[inner] in FRAGILE else "list")
    return f"{name} = [{inner}]\nprint({name}[0] is {inner})"


def augment(draw: Draw, m: Model) -> str:
    live = m.live(*AUGMENT)
    if not live:
        return assign(draw, m)
    name, k = _pick(draw, live), _k(draw)
    return f"{name} += {AUGMENT[m.kinds[name]].format(k=k)}\nprint({name})"


def delete(draw: Draw, m: Model) -> str:
    live = m.live()
    if not live:
        return assign(draw, m)
    name = _pick(draw, live)
    del m.kinds[name]
    m.graphs.pop(name, None)
    return f"del {name}\nprint('deleted {name}')"


def exists(draw: Draw, m: Model) -> str:
    name = _target(draw)
    return (f"try:\n    {name}\nexcept NameError:\n    print('no {name}')\n"
            f"else:\n    print('has {name}')")


def mutate(draw: Draw, m: Model) -> str:
    live = m.live("list", "dict")
    if not live:
        return assign(draw, m)
    name, k = _pick(draw, live), _k(draw)
    change = f"{name}.append({k})" if m.kinds[name] == "list" else f"{name}['m{k}'] = {k}"
    return f"{change}\nprint({name})"


def identity(draw: Draw, m: Model) -> str:
    first, second = _target(draw), _target(draw)
    return f"print({first} is {second})"


def define_class(draw: Draw, m: Model) -> str:
    m.class_version += 1
    k = _k(draw)
    return (f"class C:\n    version = {m.class_version}\n\n    def __init__(self):\n"
            f"        self.x = {k}\n\n    def who(self):\n"
            f"        return (type(self).version, self.x)\nprint(C.version)")


def instance(draw: Draw, m: Model) -> str:
    if not m.class_version:
        return define_class(draw, m)
    name = _target(draw)
    m.bind(name, "obj")
    return f"{name} = C()\nprint({name}.who())"


def set_attribute(draw: Draw, m: Model) -> str:
    live = m.live("obj")
    if not live:
        return instance(draw, m)
    name, k = _pick(draw, live), _k(draw)
    return f"{name}.y = {k}\nprint(sorted(vars({name}).items()))"


def inspect_instance(draw: Draw, m: Model) -> str:
    live = m.live("obj")
    if not live:
        return instance(draw, m)
    name = _pick(draw, live)
    return f"print({name}.who(), isinstance({name}, C), type({name}) is C)"


def define_setter(draw: Draw, m: Model) -> str:
    m.setter = _target(draw)
    m.bind("setg", "func")
    return f"def setg(x):\n    global {m.setter}\n    {m.setter} = x\nprint(setg.__name__)"


def call_setter(draw: Draw, m: Model) -> str:
    if m.setter is None or m.kinds.get("setg") != "func":
        return define_setter(draw, m)
    k = _k(draw)
    m.bind(m.setter, "int")
    return f"setg({k})\nprint({m.setter})"


def define_reader(draw: Draw, m: Model) -> str:
    m.reader = _target(draw)
    m.bind("reader", "func")
    return f"reader = lambda: {m.reader}\nprint(reader.__name__)"


def call_reader(draw: Draw, m: Model) -> str:
    if m.kinds.get("reader") != "func":
        return define_reader(draw, m)
    return "print(repr(reader()))"


def define_counter(draw: Draw, m: Model) -> str:
    name, k = _target(draw), _k(draw)
    m.bind(name, "counter")
    return (f"def make_counter(start):\n    n = start\n\n    def inc():\n        nonlocal n\n"
            f"        n += 1\n        return n\n    return inc\n{name} = make_counter({k})\n"
            f"print({name}())")


def call_counter(draw: Draw, m: Model) -> str:
    live = m.live("counter")
    if not live:
        return define_counter(draw, m)
    return f"print({_pick(draw, live)}())"


def comprehension(draw: Draw, m: Model) -> str:
    shadowed, result, k = _target(draw), _target(draw), _k(draw)
    m.bind(result, draw(st.sampled_from(["list", "int"])))
    body = (f"[{shadowed} * 2 for {shadowed} in range({k % 4})]" if m.kinds[result] == "list"
            else f"sum({shadowed} for {shadowed} in range({k}))")
    if shadowed == result:  # the comprehension's own name is rebound by the assignment
        return f"{result} = {body}\nprint({result})"
    return f"{result} = {body}\nprint({result}, repr({shadowed}))"


def raise_after_writes(draw: Draw, m: Model) -> str:
    name, k = _target(draw), _k(draw)
    lines = [f"{name} = {k}"]
    lists = [n for n in m.live("list") if n != name]
    if lists and draw(st.booleans()):
        lines.append(f"{lists[0]}.append({k})")
    m.bind(name, "int")
    lines += [f"raise ValueError('stopped after writing {name}')", f"{name} = 'unreached'"]
    return "\n".join(lines)


def generator(draw: Draw, m: Model) -> str:
    name, k = _target(draw), _k(draw)
    m.bind(name, "gen")
    return f"{name} = (i * i for i in range({k + 2}))\nprint(next({name}))"


def advance_generator(draw: Draw, m: Model) -> str:
    live = m.live("gen")
    if not live:
        return generator(draw, m)
    return f"print(next({_pick(draw, live)}, 'exhausted'))"


def open_file(draw: Draw, m: Model) -> str:
    name, k = _target(draw), _k(draw)
    m.bind(name, "file")
    return f"{name} = open('f{k}.txt', 'w+')\nprint({name}.write('line {k}\\n'))"


def use_file(draw: Draw, m: Model) -> str:
    live = m.live("file", "closed")
    if not live:
        return open_file(draw, m)
    name = _pick(draw, live)
    if draw(st.booleans()):
        m.bind(name, "closed")  # a closed file is saved (as closed)
        return f"{name}.close()\nprint({name}.closed)"
    return f"{name}.seek(0)\nprint(repr({name}.read()))"


def tensor(draw: Draw, m: Model) -> str:
    name, k = _target(draw), _k(draw)
    how = draw(st.sampled_from(["seed", "draw", "leaf"]))
    if how == "draw" and "torch" not in m.seeded:
        how = "seed"
    m.bind(name, "leaf" if how == "leaf" else "tensor")
    if how == "seed":
        m.seeded.add("torch")
        return f"import torch\ntorch.manual_seed({k})\n{name} = torch.randn(3)\nprint({name})"
    if how == "draw":
        return f"import torch\n{name} = torch.randn(2)\nprint({name})"
    return f"import torch\n{name} = torch.full((2,), {k}.0, requires_grad=True)\nprint({name})"


def graph(draw: Draw, m: Model) -> str:
    leaves = m.live("leaf")
    if not leaves:
        return tensor(draw, m)
    leaf, name = _pick(draw, leaves), _target(draw)
    m.bind(name, "graph")
    m.graphs[name] = leaf
    return f"{name} = ({leaf} * 3).sum()\nprint({name})"


def backward(draw: Draw, m: Model) -> str:
    graphs = [n for n in m.live("graph") if n in m.graphs]
    if not graphs:
        return graph(draw, m)
    name = _pick(draw, graphs)
    return f"{name}.backward()\nprint({m.graphs[name]}.grad)"


def array(draw: Draw, m: Model) -> str:
    name, k = _target(draw), _k(draw)
    # np is imported again or, where it still names numpy, perhaps not
    imported = "" if m.numpy and draw(st.booleans()) else "import numpy as np\n"
    m.numpy = True
    if draw(st.booleans()):
        m.bind(name, "array")
        return f"{imported}{name} = np.arange({k + 3})\nprint({name})"
    if "numpy" not in m.seeded:  # imported here: a seed that failed would seed nothing
        m.seeded.add("numpy")
        m.bind(name, "array")
        return (f"import numpy as np\nnp.random.seed({k})\n{name} = np.random.rand(2).round(4)\n"
                f"print({name})")
    m.bind(name, "array")
    return f"{imported}{name} = np.random.rand(2).round(4)\nprint({name})"


def view(draw: Draw, m: Model) -> str:
    arrays = m.live("array")
    if not arrays:
        return array(draw, m)
    base, name = _pick(draw, arrays), _target(draw)
    m.bind(name, "view")
    m.views[name] = base
    check = "" if AVOID_ARRAY_BASE else f", {name}.base is {base}"
    return f"{name} = {base}[1:3]\nprint({name}{check})"


def write_view(draw: Draw, m: Model) -> str:
    views = m.live("view")
    if not views:
        return view(draw, m)
    name, k = _pick(draw, views), _k(draw)
    base = m.views.get(name, name)
    return f"{name}[0] = {k}\nprint({name}, {base})"


def rebind_np(draw: Draw, m: Model) -> str:
    m.numpy = draw(st.booleans())
    if m.numpy:
        return "import numpy as np\nprint(np.__name__)"
    return f"np = {_k(draw)}\nprint(np)"


def capture(draw: Draw, m: Model) -> str:
    name, k = _target(draw), _k(draw)
    m.bind(name, "captured")
    return f"%%capture {name}\nprint('captured {k}')"


def read_capture(draw: Draw, m: Model) -> str:
    live = m.live("captured")
    if not live:
        return capture(draw, m)
    return f"print(repr({_pick(draw, live)}.stdout))"


def time_magic(draw: Draw, m: Model) -> str:
    name, k = _target(draw), _k(draw)
    m.bind(name, "int")
    return f"%time {name} = {k} * 2\nprint({name})"


def shell(draw: Draw, m: Model) -> str:
    k = _k(draw)
    if draw(st.booleans()):
        return f"!echo shell {k}"
    name, expanded = _target(draw), _target(draw)
    m.bind(name, "slist")
    return f"{name} = !echo {k} ${expanded}\nprint({name})"


def result(draw: Draw, m: Model) -> str:
    return _target(draw)  # the cell's value: an execute_result, and the new `_`


def read_history(draw: Draw, m: Model) -> str:
    choice = draw(st.sampled_from(["_", "__", "Out"]))
    if choice == "Out":
        return "print(sorted(Out.items()))"
    return f"print(repr({choice}))"


def listing(draw: Draw, m: Model) -> str:
    return "print(sorted(k for k in dir() if not k.startswith('_')))"


def branch(draw: Draw, m: Model) -> str:
    """Another cell's work in the branch of an `if` the cell takes, while the branch it does not
    take reads a name: a fresh worker loads what only a branch reads when it enters it."""
    inner = draw(st.sampled_from((assign, alias, augment, delete, mutate, call_reader,
                                  call_setter)))(draw, m)
    body, unread = textwrap.indent(inner, "    "), _target(draw)
    if draw(st.booleans()):
        return f"if {_k(draw)} >= 0:\n{body}\nelse:\n    print({unread})"
    return f"if {_k(draw)} < 0:\n    print({unread})\nelse:\n{body}"


ALL_ACTIONS: tuple[Action, ...] = (
    assign, alias, contain, augment, delete, exists, mutate, identity, define_class, instance,
    set_attribute, inspect_instance, define_setter, call_setter, define_reader, call_reader,
    define_counter, call_counter, comprehension, raise_after_writes, generator,
    advance_generator, open_file, use_file, tensor, graph, backward, array, view, write_view,
    rebind_np, capture, read_capture, time_magic, shell, result, read_history, listing, branch,
)

# Known failures the generator steers around, each flag naming the xfail regression test in
# tests/integration/test_generated.py that shows it: when that test starts passing, set its flag
# False.
AVOID_HISTORY = True  # test_output_history_survives_a_new_worker
AVOID_ARRAY_BASE = True  # test_an_array_owns_its_data_*, test_a_view_keeps_its_base_*

KNOWN_FAILURES = {action for action, avoid in ((read_history, AVOID_HISTORY),)
                  if avoid}
ACTIONS = tuple(a for a in ALL_ACTIONS if a not in KNOWN_FAILURES)

# The last cell: every user-visible name with a fingerprint of its value, and which names share
# one mutable object. Deterministic by construction: no addresses, no consuming generators.
PROBE = '''\
def _fp(v, depth=0):
    import io, types
    t = type(v)
    if depth > 4:
        return '...'
    if v is None or t in (bool, int, float, complex, str, bytes):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return (t.__name__, [_fp(x, depth + 1) for x in v])
    if isinstance(v, dict):
        return ('dict', sorted((repr(k), _fp(x, depth + 1)) for k, x in v.items()))
    if isinstance(v, types.ModuleType):
        return ('module', v.__name__)
    if t.__module__ == 'numpy' and t.__name__ == 'ndarray':
        return ('ndarray', str(v.dtype), v.shape, v.tolist())  # no .base: AVOID_ARRAY_BASE
    if t.__module__.startswith('torch') and hasattr(v, 'requires_grad'):
        return ('tensor', str(v.dtype), tuple(v.shape), v.detach().tolist(), v.requires_grad,
                v.grad_fn is not None, None if v.grad is None else v.grad.tolist())
    if isinstance(v, types.GeneratorType):
        return ('generator', v.gi_frame is None)
    if isinstance(v, io.IOBase):
        return ('file', v.name, v.mode, v.closed, None if v.closed else v.tell())
    if isinstance(v, types.FunctionType):
        cells = []
        for c in v.__closure__ or ():
            try:
                cells.append(_fp(c.cell_contents, depth + 1))
            except ValueError:
                cells.append('<empty>')
        return ('function', v.__qualname__, cells)
    if isinstance(v, type):
        return ('class', v.__qualname__, getattr(v, 'version', None))
    if t.__name__ == 'CapturedIO':
        return ('captured', v.stdout, v.stderr)
    if hasattr(v, '__dict__'):
        return ('object', t.__qualname__, getattr(t, 'version', None), _fp(vars(v), depth + 1))
    return ('other', t.__qualname__)


import types as _types
_names = sorted(k for k in dir() if not k.startswith('_')
                and k not in ('In', 'Out', 'get_ipython', 'exit', 'quit', 'open'))
_shared = {}
for _k in _names:
    if not isinstance(globals()[_k], (int, float, complex, str, bytes, tuple, bool, type(None),
                                      type, _types.ModuleType)):
        _shared.setdefault(id(globals()[_k]), []).append(_k)
print('names', _names)
print('shared', sorted(v for v in _shared.values() if len(v) > 1))
for _k in _names:
    print(_k, _fp(globals()[_k]))
'''


def _disruption(draw: Draw, m: Model) -> str:
    # Unsaveable values that cannot be recomputed live only in their worker: losing it loses them.
    keeping = m.fragile() and not m.recomputable()
    return draw(st.sampled_from(KEEPING if keeping else DISRUPTIONS))


@st.composite
def programs(draw: Draw, max_cells: int = 8) -> list[Step]:
    """A notebook: up to `max_cells` generated cells, then `PROBE`."""
    m = Model()
    steps = []
    for _ in range(draw(st.integers(1, max_cells))):
        disruption, action = _disruption(draw, m), draw(st.sampled_from(ACTIONS))
        event(disruption)  # --hypothesis-show-statistics: how often each was tried
        event(action.__name__)
        steps.append(Step(disruption, action(draw, m)))
        m.ran(steps[-1].source)
    steps.append(Step(_disruption(draw, m), PROBE))
    return steps
