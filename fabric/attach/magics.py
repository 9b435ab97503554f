"""`%llfabric attach|detach|status|gpus|env|checkout|tag|rm` and `%%local`.

`%load_ext fabric.attach.magics` registers them without attaching (as `llfabric attach` does
for a running kernel, before `%llfabric attach ADDRESS`).
"""

from __future__ import annotations

import shlex
import sys
import time

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ..envs import describe_differences
from ..errors import FabricError
from ..messages import CheckedOut, Reply, Tagged, Version
from ..status import ServerStatus
from .attaching import attach, current, detach
from .relay import Attachment

NOTICES = 5  # of a session's latest notices, those `%llfabric status` shows

USAGE = """usage:
  %llfabric attach [ADDRESS] [--session NAME] [--notebook PATH]
  %llfabric status
  %llfabric detach
  %llfabric gpus K               (the session's next cells lease K GPUs, or slots, together)
  %llfabric env NAME|base        (the session's next cells import from your environment NAME)
  %llfabric interrupt            (a cell of the session still running from an earlier kernel)
  %llfabric checkout VERSION|NAME
  %llfabric tag NAME [VERSION]   (name a version, the latest by default: retention keeps it)
  %llfabric rm SESSION           (remove another session of yours from the store)"""


def _options(words: list[str], names: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """Split `--name value` options from positional words."""
    positional, options = [], {}
    while words:
        word = words.pop(0)
        if word.startswith("--"):
            name = word[2:]
            if name not in names or not words:
                raise UsageError(f"bad option {word!r}\n{USAGE}")
            options[name] = words.pop(0)
        else:
            positional.append(word)
    return positional, options


@magics_class
class FabricMagics(Magics):
    def _shell(self) -> InteractiveShell:
        if self.shell is None:  # IPython gives a registered magic its shell
            raise UsageError("llfabric's magics run in an IPython shell")
        return self.shell

    @line_magic
    def llfabric(self, line: str) -> None:
        """Attach this kernel to an llfabric server, or manage the attachment."""
        words = shlex.split(line)
        command = words.pop(0) if words else "status"
        if command == "attach":
            positional, options = _options(words, ("session", "notebook"))
            if len(positional) > 1:
                raise UsageError(USAGE)
            attach(self._shell(), positional[0] if positional else None, **options)
        elif command == "detach" and not words:
            if detach(self._shell()):
                print("llfabric: detached; cells run in this kernel again")
        elif command == "status" and not words:
            attachment = current(self.shell)
            if attachment is None:
                print("llfabric: not attached; cells run in this kernel")
                return
            try:
                print(describe(attachment.client.status(), attachment.session))
            except FabricError as exc:
                print(f"llfabric: {exc.message}", file=sys.stderr)
        elif command == "gpus" and len(words) == 1:
            self._gpus(words[0])
        elif command == "interrupt" and not words:
            attachment = current(self.shell)
            if attachment is None:
                raise UsageError("not attached: `%llfabric attach` first")
            try:
                stopped = attachment.client.interrupt(attachment.session)
            except FabricError as exc:
                print(f"llfabric: {exc.message}", file=sys.stderr)
                return
            print("llfabric: " + ("interrupted the running cell" if stopped
                                  else "no cell of the session was running"))
        elif command == "env" and len(words) == 1:
            self._env(words[0])
        elif command == "checkout" and len(words) == 1:
            reply = self._call("checkout", version=int(words[0]) if words[0].isdigit()
                               else words[0])
            if isinstance(reply, CheckedOut):  # prompt numbers go on, as after any cell
                attachment = current_attachment(self.shell)
                print(f"llfabric: session {attachment.session} is back at version "
                      f"{reply.checked_out}")
                if closed := attachment.checked_out():
                    print(f"llfabric: {closed}", file=sys.stderr)
                if differ := reply.packages_differ:
                    print(describe_differences(differ, reply.env), file=sys.stderr)
        elif command == "tag" and len(words) in (1, 2):
            fields: dict[str, Version] = {"name": words[0]}
            if len(words) == 2:
                fields["version"] = int(words[1]) if words[1].isdigit() else words[1]
            reply = self._call("tag", **fields)
            if isinstance(reply, Tagged):
                print(f"llfabric: version {reply.version} is named {words[0]}")
        elif command == "rm" and len(words) == 1:
            attachment = current(self.shell)
            if attachment is not None and words[0] == attachment.session:
                raise UsageError("this kernel's own session: `%llfabric detach` first")
            if self._call("rm", session=words[0]) is not None:
                print(f"llfabric: removed session {words[0]}")
        else:
            raise UsageError(USAGE)

    def _gpus(self, word: str) -> None:
        """Lease `word` slots for the session's next cells, if the server's host has them."""
        attachment = current_attachment(self.shell)
        if not word.isdigit() or int(word) < 1:
            raise UsageError(f"%llfabric gpus takes a count of 1 or more, not {word!r}")
        try:
            slots = attachment.client.status().leases
        except FabricError as exc:
            print(f"llfabric: {exc.message}", file=sys.stderr)
            return
        if int(word) > slots.slots:
            print(f"llfabric: the server's host has {slots.slots} {slots.kind} slots, not "
                  f"{word}; nothing changed", file=sys.stderr)
            return
        attachment.gpus = int(word)
        print(f"llfabric: the session's next cells lease {word} {slots.kind} slots together")

    def _env(self, name: str) -> None:
        """Run the session's next cells in the user's environment `name` (`base`: the
        server's packages)."""
        attachment = current_attachment(self.shell)
        try:
            attachment.client.open(attachment.session, env="" if name == "base" else name)
        except FabricError as exc:
            print(f"llfabric: {exc.message}", file=sys.stderr)
            return
        print("llfabric: the session's next cells import from "
              + ("the server's packages" if name == "base" else f"environment {name}; "
                 "`%pip install` in a cell installs into it"))

    def _call(self, op: str, **fields: object) -> Reply | None:
        """A request of the attached session (or `session` in `fields`); None, the error
        printed, if the server refused it."""
        attachment = current_attachment(self.shell)
        try:
            return attachment.client.call(op, **{"session": attachment.session, **fields})
        except FabricError as exc:
            print(f"llfabric: {exc.message}", file=sys.stderr)
            return None

    @cell_magic
    def local(self, line: str, cell: str) -> None:
        """Run this cell in the kernel itself, not on the fabric (attached kernels route
        `%%local` cells here before this magic is reached)."""
        self._shell().run_cell(cell)


def current_attachment(shell: InteractiveShell | None) -> Attachment:
    """The kernel's attachment; a usage error if it has none."""
    attachment = current(shell)
    if attachment is None:
        raise UsageError("not attached: `%llfabric attach` first")
    return attachment


def load_ipython_extension(shell: InteractiveShell) -> None:
    shell.register_magics(FabricMagics)


# how a cell started (`pool.cells.how_started`), as the cell's indicator in JupyterLab says it
STARTS = {"prepared": "on a worker readied while it was edited",
          "warm": "on the worker kept from the cell before",
          "restored": "on a worker brought back from disk",
          "cold": "on a worker started for it"}


def describe(status: ServerStatus, session: str) -> str:
    """`%llfabric status`: where the session's worker is (its tier) and how its latest cell
    started, the host's slots, lease time, savings against pinning, bytes."""
    mine = status.session(session)
    if mine is None:
        return f"llfabric: the server at {status.address} has no session {session!r} open"
    leases = status.leases
    held = mine.lease_seconds
    pinned = max(time.time() - mine.opened, held)
    saved = (pinned - held) / 3600
    share = f" ({100 * (pinned - held) / pinned:.0f}%)" if pinned > 0 else ""
    started = f"; its latest cell started {mine.started} ({STARTS[mine.started]})" \
        if mine.started in STARTS else ""
    lines = [
        f"llfabric session {session} on {status.address}: version {mine.version}",
        f"worker: {mine.tier}{started}",
        f"slots: {leases.slots} {leases.kind} ({leases.held} held, {leases.queued} queued)",
        f"lease time so far: {held:.1f} s of {pinned:.0f} s open; "
        f"{leases.kind}-hours saved vs pinned: {saved:.4f}{share}",
        f"stored: {mine.bytes} bytes in {mine.variables} variables",
    ]
    if mine.gpus > 1:
        lines.append(f"each cell leases {mine.gpus} {leases.kind} slots together")
    if mine.pinned:
        lines.append("pinned: a worker is kept alive for state that cannot be saved")
    if mine.notices:
        lines.append("notices (latest last):")
        lines += [f"  {time.strftime('%H:%M:%S', time.localtime(n.time))} {n.text}"
                  for n in mine.notices[-NOTICES:]]
    return "\n".join(lines)
