"""The pool's memory of what each family's workers imported on first use (`pool.preloads`):
names a zygote may import, bounded per family and in families, never one it failed on again."""

from __future__ import annotations

from fabric.pool import preloads
from fabric.pool.preloads import Preloads

TORCH = ("", frozenset({"torch"}))


def test_a_family_learns_each_module_once_and_only_a_packages_module() -> None:
    known = Preloads()
    assert known.learn(TORCH, ["torch._dynamo", "sympy"])
    assert not known.learn(TORCH, ["sympy"])  # nothing new: no zygote is built again
    assert not known.learn(TORCH, ["json.decoder", "__main__", "torch.__main__", "a b", "", 7,
                                   "os", "_private"])
    assert known.of(TORCH) == {"torch._dynamo", "sympy"}
    assert known.of(("", frozenset({"numpy"}))) == frozenset()


def test_a_module_a_zygote_failed_on_is_not_preloaded_again() -> None:
    known = Preloads()
    known.learn(TORCH, ["torch._dynamo", "broken"])
    known.refuse(TORCH, ["broken"])
    assert known.of(TORCH) == {"torch._dynamo"}
    assert not known.learn(TORCH, ["broken"])


def test_what_is_remembered_is_bounded() -> None:
    known = Preloads()
    assert known.learn(TORCH, [f"pkg.m{i}" for i in range(preloads.MODULES + 10)])
    assert len(known.of(TORCH)) == preloads.MODULES
    assert not known.learn(TORCH, ["pkg.more"])
    families = [("", frozenset({f"pkg{i}"})) for i in range(preloads.FAMILIES)]
    for family in families:
        known.learn(family, ["pkg.part"])
    assert known.of(TORCH) == frozenset()  # taught least recently: forgotten first
    assert all(known.of(f) == {"pkg.part"} for f in families)
