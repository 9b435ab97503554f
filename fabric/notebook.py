"""Run a notebook's code cells in order on a server, as an editing user would."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import notices
from .client import Client
from .errors import Detached, NotebookError, RemoteError
from .messages import Executed, Interrupt, Notice, Output
from .output_limit import Budget

OnOutput = Callable[[int, dict], None]


@dataclass
class CellRun:
    index: int  # position in the notebook's cell list
    outputs: list[dict] = field(default_factory=list)
    reply: Executed | None = None  # the server's reply: status, version, timings
    failure: RemoteError | None = None  # the request itself failed (worker died, bad state...)
    notices: list[Notice] = field(default_factory=list)  # what llfabric said of it, not outputs

    @property
    def ok(self) -> bool:
        return self.failure is None and self.reply is not None and self.reply.status == "ok"

    @property
    def lost(self) -> bool:
        """Whether the cell showed that state it may need is lost (`notices.loss`)."""
        return any(n.topic == "lost" for n in self.notices)


@dataclass
class NotebookRun:
    cells: list[CellRun]
    pinned_seconds: float  # first execute sent to last reply: what a pinned session holds

    @property
    def ok(self) -> bool:
        """Every cell ran, none raised, and none showed state lost: a loss shows in the cell as
        an error, and its notebook may go on to other results than a kernel's."""
        return all(c.ok and not c.lost for c in self.cells)


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """Read and validate a notebook file, or raise NotebookError saying what is wrong."""
    try:
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
    except FileNotFoundError as exc:
        raise NotebookError(f"{path}: no such notebook") from exc
    except nbformat.ValidationError as exc:
        raise NotebookError(f"{path} is not a valid notebook: {exc.message}") from exc
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise NotebookError(f"{path} is not a valid notebook: {exc}") from exc
    return nb


class _Outputs:
    """Outputs of one cell, with clear_output and display updates applied as a frontend would:
    an update changes every output shown with its display id, in this cell or an earlier one
    (`displays`, shared by the cells of a notebook). They are kept within `OUTPUT_LIMIT` bytes
    (`fabric.output_limit`); a stream's pieces are joined once, in `done`."""

    def __init__(self, displays: dict[str, list]) -> None:
        self.items: list = []  # nbformat outputs
        self.displays = displays
        self.budget = Budget()
        self._clear_pending = False
        self._text: list[str] = []  # the pieces of the last output's text, if a stream's

    def add(self, output: dict) -> None:
        if (kept := self.budget.admit(output)) is not None:
            self._show(kept)

    def _show(self, output: dict) -> None:
        kind = output.get("output_type")
        if kind == "clear_output":
            if output.get("wait"):
                self._clear_pending = True
            else:
                self._clear()
            return
        display_id = (output.get("transient") or {}).get("display_id")
        if kind == "update_display_data":
            for shown in self.displays.get(display_id, ()) if display_id else ():
                shown["data"], shown["metadata"] = output["data"], output.get("metadata", {})
            return
        if self._clear_pending:
            self._clear()
            self._clear_pending = False
        if kind == "stream" and self._text and self.items[-1]["name"] == output["name"]:
            self._text.append(output["text"])
            return
        self._join()
        fields = {k: v for k, v in output.items() if k not in ("output_type", "transient")}
        shown = nbformat.v4.new_output(kind, **fields)
        self.items.append(shown)
        if kind == "stream":
            self._text = [shown["text"]]
        if display_id:
            self.displays.setdefault(display_id, []).append(shown)

    def done(self) -> list:
        """The cell's outputs, with a summary of what the limit left out, if anything."""
        if (summary := self.budget.summary()) is not None:
            self._show(summary)
        self._join()
        return self.items

    def _join(self) -> None:
        if len(self._text) > 1:
            self.items[-1]["text"] = "".join(self._text)
        self._text = []

    def _clear(self) -> None:
        self.items.clear()
        self._text = []


def _setting(nb: nbformat.NotebookNode, key: str) -> object:
    settings = nb.metadata.get("llfabric", {})
    return settings.get(key) if isinstance(settings, dict) else None


def notebook_env(nb: nbformat.NotebookNode) -> str | None:
    """The environment the notebook's metadata names (`{"llfabric": {"env": NAME}}`), if any."""
    env = _setting(nb, "env")
    if env is not None and not isinstance(env, str):
        raise NotebookError(f"the notebook's metadata llfabric.env must be an environment's "
                            f"name, not {env!r}")
    return env


def notebook_gpus(nb: nbformat.NotebookNode) -> int | None:
    """The GPU count the notebook's metadata asks for (`{"llfabric": {"gpus": K}}`), if any."""
    gpus = _setting(nb, "gpus")
    if gpus is not None and (type(gpus) is not int or gpus < 1):
        raise NotebookError(f"the notebook's metadata llfabric.gpus must be a count of 1 or "
                            f"more, not {gpus!r}")
    return gpus


def run_notebook(client: Client, nb: nbformat.NotebookNode, session: str, *,
                 think_time: float = 0.0, allow_errors: bool = False,
                 on_output: OnOutput | None = None, gpus: int | None = None,
                 on_interrupt: Callable[[str], None] | None = None) -> NotebookRun:
    """Execute the code cells in order; with `think_time`, draft each cell that long before;
    with `gpus`, each leases that many slots.

    A KeyboardInterrupt while a cell runs interrupts the cell (`on_interrupt` is told) and the
    run ends after it; a second one raises Detached, the cell left running on the server."""
    cells: list[CellRun] = []
    displays: dict[str, list] = {}  # display id -> the outputs showing it, in any cell
    first: float | None = None
    last = time.monotonic()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        source = cell.source
        if think_time > 0:
            client.draft(session, source)
            time.sleep(think_time)
        run = CellRun(index)
        outputs = _Outputs(displays)
        first = time.monotonic() if first is None else first
        interrupted = False
        try:
            # cells may run for hours
            events = client.execute(session, source, gpus=gpus, timeout=0)
            while not events.done:
                try:
                    for message in events:
                        if isinstance(message, Output):
                            outputs.add(message.output)
                            if on_output is not None:
                                on_output(index, message.output)
                        elif isinstance(message, Notice) and message.topic != "progress":
                            run.notices.append(message)
                        elif isinstance(message, Executed):
                            run.reply = message
                except KeyboardInterrupt:
                    if interrupted:
                        events.close()
                        raise Detached(
                            f"detached from session {session}, whose cell runs on: `llfabric "
                            f"follow {session}` shows it again, `llfabric stop {session}` "
                            "stops it", session=session) from None
                    interrupted = True
                    events.send(Interrupt(session))
                    if on_interrupt is not None:
                        on_interrupt(session)
        except RemoteError as exc:
            run.failure = exc
        last = time.monotonic()
        cell.outputs = outputs.done()
        if run.reply is not None:
            cell.execution_count = run.reply.execution_count
        cells.append(run)
        if interrupted or (not run.ok and not allow_errors):
            break
    return NotebookRun(cells, last - (first if first is not None else last))


def timings_table(run: NotebookRun) -> str:
    """Per cell: path and worker source, prepare, visible delay, run, save, lease held,
    status and the topics of llfabric's notices; totals vs a pinned session; then the notices."""
    head = f"{'cell':>4} {'path':<11} {'source':<8} {'prepare':>8} {'visible':>8} {'run':>8} " \
           f"{'save':>7} {'lease':>8}  {'status':<6}  notices"
    lines = [head, "-" * len(head)]
    lease_total = 0.0
    delays = []
    for cell in run.cells:
        if cell.reply is None:
            lines.append(f"{cell.index:>4} {'-':<11} {'':<8} {'':>8} {'':>8} {'':>8} {'':>7} "
                         f"{'':>8}  failed: {cell.failure.message if cell.failure else '?'}")
            continue
        t = cell.reply.timings
        lease_total += t["lease_held"]
        delays.append(t["visible_delay"])
        lines.append(f"{cell.index:>4} {cell.reply.path:<11} "
                     f"{cell.reply.source:<8} {t['prepare']:>8.3f} "
                     f"{t['visible_delay']:>8.3f} {t['run']:>8.3f} {t['save']:>7.3f} "
                     f"{t['lease_held']:>8.3f}  {cell.reply.status:<6}  "
                     f"{notices.topics(n.topic for n in cell.notices)}".rstrip())
    lines.append("-" * len(head))
    pinned = run.pinned_seconds
    saved = 100 * (1 - lease_total / pinned) if pinned > 0 else 0.0
    if delays:
        delays.sort()
        under = sum(d < 0.1 for d in delays)
        lines.append(f"visible delay: median {delays[len(delays) // 2]:.3f} s, "
                     f"max {delays[-1]:.3f} s, {under}/{len(delays)} cells under 100 ms")
    lines.append(f"lease held {lease_total:.2f} s; a pinned session holds {pinned:.2f} s "
                 f"(first execute to last done): {saved:.0f}% less")
    told = [f"  cell {c.index}: {n.text}" for c in run.cells for n in c.notices]
    if told:
        lines += ["notices:", *told]
    return "\n".join(lines)
