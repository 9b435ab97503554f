"""The 200k small objects of bench/store.py's state, saved and loaded, against plain pickle.

`records` (100k dicts of three fields) and `vocab` (a dict of 100k words) cost the save and the
load per object, not per byte: their time is the interpreter's. Measured in each round, on the
same values:

  pickle        pickle.dumps(protocol=5) of both variables as one dict, and pickle.loads of it
  group         group_variables: the walk that finds which variables share objects
  codec         codec.dumps of each group (as a save pickles them) and codec.loads of each
  save          DeltaSaver.save into a fresh store (grouping, pickling, hashing, fsync'd writes)
  load          Store.get_objects and codec.loads from a fresh Store over that store (the files
                are in the page cache: what is timed is the interpreter, not the disk)

Every time ends when the call returns: freeing what it made is not counted. Ratios are taken
within each round (this machine's speed drifts), then the medians of the rounds are printed.
Usage: python bench/small_objects.py [--rounds 9] [--dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import pickle
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from store import make_state

from fabric.closure.groups import group_variables
from fabric.snapshot import Store, codec
from fabric.snapshot.delta import DeltaSaver

NAMES = ("records", "vocab")


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    del result  # freed outside the timer
    return elapsed


def one_round(work: Path, values: dict) -> dict[str, float]:
    ns = {"__name__": "__main__", **values}
    names = list(values)
    out = {}
    stream = pickle.dumps(values, protocol=5)
    out["pickle.dumps"] = timed(lambda: pickle.dumps(values, protocol=5))
    out["pickle.loads"] = timed(lambda: pickle.loads(stream))
    out["group"] = timed(lambda: group_variables(ns, names))
    groups = group_variables(ns, names).groups
    encoded = [codec.dumps({n: ns[n] for n in group}, ns) for group in groups]
    out["codec.dumps"] = timed(lambda: [codec.dumps({n: ns[n] for n in group}, ns)
                                        for group in groups])
    out["codec.loads"] = timed(lambda: [codec.loads(e, {}) for e in encoded])
    root = work / "store"
    saver = DeltaSaver(Store(root))
    saved = None

    def save() -> None:
        nonlocal saved
        saved = saver.save(ns, names, None)

    out["save"] = timed(save)
    ids = [blob for blob, _, _ in saved.groups]
    out["load"] = timed(lambda: [codec.loads(e, {}) for e in Store(root).get_objects(ids)])
    shutil.rmtree(root)
    out |= {f"{key} / pickle": out[key] / out[base] for key, base in
            (("group", "pickle.dumps"), ("codec.dumps", "pickle.dumps"), ("save", "pickle.dumps"),
             ("codec.loads", "pickle.loads"), ("load", "pickle.loads"))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="rounds (medians shown)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: $TMPDIR)")
    args = parser.parse_args()
    state = make_state(0)  # no buffers: the small objects alone
    values = {name: state[name] for name in NAMES}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="llf-small-") as tmp:
        runs = [one_round(Path(tmp), values) for _ in range(args.rounds)]
    median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    print(f"small objects ({', '.join(NAMES)}: 200k objects); medians of {args.rounds} rounds, "
          "ratios within each round")
    print(f"{'':14} {'s':>8} {'/ pickle':>9}")
    for key in ("pickle.dumps", "group", "codec.dumps", "save", "pickle.loads", "codec.loads",
                "load"):
        ratio = median.get(f"{key} / pickle")
        print(f"{key:14} {median[key]:8.4f} {'' if ratio is None else f'{ratio:9.2f}'}")


if __name__ == "__main__":
    main()
