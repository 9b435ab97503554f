"""Delta saves: after a cell, write only the groups it may have changed.

A worker remembers, for each group it loaded or saved, the object that holds it. After a cell:

- a group the cell cannot have reached is *kept*: it is not regrouped, pickled or hashed, and the
  manifest keeps naming its object. A cell reaches what it reads or writes (a read may mutate), and
  what the code it reaches reads in turn; to reach an object another way it must have read a name
  bound to it, so grouping by shared objects makes "reached" a property of whole groups. Only
  groups this worker has grouped itself are kept, since only for them does it know what their
  code reads;
- a variable of plain data (builtin containers and atoms) that no other variable reaches into,
  as it was when last saved, keeps its object unwalked and unpickled: its marshal fingerprint
  proves it (`plain`);
- every other group is pickled with its buffers out of band and fingerprinted by hashing them;
  one whose fingerprint matches the object it came from costs no I/O (`Store.put_object`).
  Only the chunks of its large buffers written since this process last hashed them are hashed
  again, where the kernel tracks writes (`written`).

A variable's plain fingerprint is taken when its save finds it new or unchanged, not when it
found it changed (likely to change again: the check would cost a marshal each time).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from ..closure.groups import group_variables
from . import codec, plain, written
from .codec import Encoded
from .store import Progress, Store, Writes

SavedGroup = tuple[str, list[str], int]  # object id, names, bytes


@dataclass
class Saved:
    groups: list[SavedGroup] = field(default_factory=list[SavedGroup])  # each group written
    kept: list[str] = field(default_factory=list[str])  # names whose groups stay as committed
    # of the regrouped names only
    refs: dict[str, list[str]] = field(default_factory=dict[str, list[str]])
    packages: dict[str, list[str]] = field(default_factory=dict[str, list[str]])  # likewise
    # name -> why it could not be saved
    unsaved: dict[str, str] = field(default_factory=dict[str, str])
    bounded: bool = False
    devices: list[str] = field(default_factory=list[str])  # objects of groups holding CUDA memory
    hashed: int = 0  # bytes of large buffers hashed
    reused: int = 0  # bytes of large buffers not hashed: unwritten since they last were
    # names of plain data found as last saved by their fingerprint: neither walked nor pickled
    fingerprinted: list[str] = field(default_factory=list[str])
    # names of the groups written whose object is not the one this saver held for the group
    # (loaded or saved before): what changed, or was regrouped
    changed: list[str] = field(default_factory=list[str])


class DeltaSaver:
    def __init__(self, store: Store, track: bool = True) -> None:
        """`track`: learn what a cell changed without hashing it all where that can be told:
        which large buffers it wrote from the kernel (`written`), whether plain data changed
        from its fingerprint (`plain`); else pickle and hash every group it may have changed."""
        self.store = store
        self.track = track
        self.objects: dict[frozenset[str], tuple[str, int]] = {}  # group -> (object, bytes)
        # name of a group of its own -> (its object, the fingerprint its value had then)
        self.plain: dict[str, tuple[str, plain.PlainPrint]] = {}
        self.refs: dict[str, set[str]] = {}  # names grouped here -> globals their code reads
        # name -> (value, why): a value whose pickling ran past its limit or was interrupted,
        # not tried again while the name holds it (each later cell would wait as long)
        self.stuck: dict[str, tuple[object, str]] = {}

    def loaded(self, names: Iterable[str], blob: str, nbytes: int) -> None:
        self.objects[frozenset(names)] = (blob, nbytes)

    def seed(self, blob: str, encoded: Encoded) -> None:
        """Give the object `blob`, just loaded as `encoded` (its chunks verified), to the write
        tracker, before anything else can reach its buffers: a later cell that only reads them
        is saved without hashing them."""
        tracker = written.tracker() if self.track else None
        if tracker is None:
            return
        index = self.store.object_index(blob)
        large = [view for view, entry in zip(encoded.buffers, index.buffers, strict=True)
                 if not isinstance(entry, bytes)]
        written.Hashing(tracker, self.store.disk.root).seed(
            large, index.chunk, [ids for _, ids in index.large])

    def _closure(self, names: set[str]) -> set[str]:
        todo, out = list(names), set[str]()
        while todo:
            name = todo.pop()
            if name not in out:
                out.add(name)
                todo.extend(self.refs.get(name, ()))
        return out

    def save(self, ns: dict[str, Any], state: list[str], reached: Iterable[str] | None,
             progress: Progress | None = None,
             limit: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
             captured: Callable[[Saved], None] | None = None) -> Saved:
        """Save `state` (names in `ns`) after a cell that reached `reached` (None: anything),
        as its plan says (`closure.plan`). Each group is pickled within `limit()` (its objects'
        own code runs then), else left unsaved; a KeyboardInterrupt (the user stopped the save)
        leaves what is not written yet unsaved: the worker holds it. `captured(saved)` is called
        once every group is pickled and hashed, as the writes go on."""
        present = set(state)
        touched = present if reached is None else set(reached)
        self.stuck = {n: held for n, held in self.stuck.items() if ns.get(n) is held[0]}
        checked: dict[str, bool] = {}
        while True:
            touched = self._closure(touched)
            kept = [key for key in self.objects if key <= present and touched.isdisjoint(key)
                    and all(n in self.refs for n in key)]
            keep = set[str]().union(*kept)
            rest = [n for n in state if n not in keep]
            same = self._unchanged(ns, rest, checked)
            grouping = group_variables(ns, rest, opaque=same)
            if not grouping.bounded:  # a bounded walk did not learn what code reads
                self.refs.update(grouping.refs)
            also = {m for n in rest for m in grouping.refs.get(n, ()) if m in keep}
            if not also:
                break
            touched |= also  # code regrouped now reads into a kept group: that group may change
        saved = Saved(kept=sorted(keep), bounded=grouping.bounded,
                      refs={n: sorted(r) for n, r in grouping.refs.items() if r},
                      packages={n: sorted(p) for n, p in grouping.packages.items() if p})
        # each group written while the next is pickled; a full disk fails the save at finish
        writes = Writes(self.store)
        hashing = written.Hashing(written.tracker() if self.track else None,
                                  self.store.disk.root)

        def put(names: list[str]) -> bool:
            return self._put(ns, names, saved, progress, writes, hashing, limit)

        try:
            self._put_groups(ns, grouping.groups, same, rest, saved, put)
            if captured is not None:
                captured(saved)
        finally:
            failed = writes.finish()
        saved.hashed, saved.reused = hashing.hashed, hashing.reused
        self._unwritten(saved, failed)
        self._forget_stale(present, set(rest), saved)
        return saved

    def _put_groups(self, ns: dict[str, Any], groups: list[list[str]], same: set[str],
                    rest: list[str], saved: Saved, put: Callable[[list[str]], bool]) -> None:
        """Hand each group over to be written (`put`), or name again the object of one found
        unchanged; a KeyboardInterrupt (the user stopped the save) leaves the names not handed
        over yet unsaved, held by the worker."""
        try:
            for members in groups:
                if len(members) == 1 and members[0] in same and self._reuse(members, saved):
                    continue
                if not put(members) and len(members) > 1:
                    # Saved member by member instead, so that one generator costs only itself.
                    for name in members:
                        put([name])
        except KeyboardInterrupt:
            done = {n for _, names, _ in saved.groups for n in names}
            for name in rest:
                if name not in done:
                    saved.unsaved.setdefault(name, "its save was interrupted")
                    self.stuck[name] = (ns[name], saved.unsaved[name])

    def _unchanged(self, ns: dict[str, Any], names: list[str],
                   checked: dict[str, bool]) -> set[str]:
        """Those of `names` whose plain value is as their group's object holds it, each value
        bound to one of them alone (`checked`: each name's finding so far)."""
        for name in names:
            if name not in checked:
                known = self._fingerprint(name) if self.track and name not in self.stuck \
                    else None
                checked[name] = known is not None and plain.unchanged(ns[name], known)
        same = [n for n in names if checked[n]]
        bound = collections.Counter(id(ns[n]) for n in same)
        return {n for n in same if bound[id(ns[n])] == 1}

    def _fingerprint(self, name: str) -> plain.PlainPrint | None:
        """The fingerprint `name`'s value had when its group's object was saved, if taken."""
        known = self.plain.get(name)
        if known is None or self.objects.get(frozenset((name,)), ("",))[0] != known[0]:
            return None
        return known[1]

    def _reuse(self, names: list[str], saved: Saved) -> bool:
        """Name the object of `names`' group again, unpickled; False if the disk lost it."""
        blob, nbytes = self.objects[frozenset(names)]
        if not self.store.reuse(blob):
            return False
        saved.groups.append((blob, names, nbytes))
        saved.fingerprinted += names
        return True

    def _unwritten(self, saved: Saved, failed: dict[str, Exception]) -> None:
        """The groups whose writes failed are not saved: their names are told as unsaved."""
        saved.devices = [blob for blob in saved.devices if blob not in failed]
        for entry in [g for g in saved.groups if g[0] in failed]:
            saved.groups.remove(entry)
            self.objects.pop(frozenset(entry[1]), None)
            exc = failed[entry[0]]
            saved.unsaved.update({n: f"{type(exc).__name__}: {exc}" for n in entry[1]})

    def _forget_stale(self, present: set[str], regrouped: set[str], saved: Saved) -> None:
        """Keep `objects` the partition of the namespace into its current groups. A group this
        cell regrouped, or one of whose names is gone, no longer exists: were its key kept, a
        later cell that does not touch it would keep its names as committed though another
        name now shares their objects (`b = a`, then `a.append(1)` and `b` stays `[0]`)."""
        current = {frozenset(names) for _, names, _ in saved.groups}
        self.objects = {key: value for key, value in self.objects.items() if key in current
                        or (key <= present and key.isdisjoint(regrouped))}
        self.plain = {name: known for name, known in self.plain.items()
                      if self._fingerprint(name) is not None}

    def _put(self, ns: dict[str, Any], names: list[str], saved: Saved,
             progress: Progress | None, writes: Writes, hashing: written.Hashing,
             limit: Callable[[], AbstractContextManager[object]]) -> bool:
        """Save `names` as one group; on failure record why, per name."""
        key = frozenset(names)
        known = self.objects.get(key)
        stuck = {n: self.stuck[n][1] for n in names
                 if n in self.stuck and self.stuck[n][0] is ns[n]}
        if stuck:
            saved.unsaved.update({n: stuck.get(n, f"it shares objects with {', '.join(stuck)}")
                                  for n in names})
            return False
        values = {n: ns[n] for n in names}
        try:
            with limit():
                encoded = codec.dumps(values, ns)
            blob = self.store.put_object(encoded, known and known[0], progress, writes,
                                         hashing)
        except KeyboardInterrupt:
            raise  # the user stopped the save
        except BaseException as exc:  # user objects fail in any way, SystemExit too; told
            saved.unsaved.update({n: f"{type(exc).__name__}: {exc}" for n in names})
            if isinstance(exc, TimeoutError) and len(names) == 1:
                self.stuck[names[0]] = (ns[names[0]], saved.unsaved[names[0]])
            return False
        for name in names:
            saved.unsaved.pop(name, None)
            self.stuck.pop(name, None)
        self.objects[key] = (blob, encoded.nbytes)
        saved.groups.append((blob, names, encoded.nbytes))
        if known is None or known[0] != blob:
            saved.changed += names
        # of the value pickled, new or unchanged (plain data ran no code of its own meanwhile)
        if self.track and len(names) == 1 and (known is None or known[0] == blob) and \
                (fingerprint := plain.fingerprint(values[names[0]])) is not None:
            self.plain[names[0]] = (blob, fingerprint)
        if encoded.device:
            saved.devices.append(blob)
        return True
