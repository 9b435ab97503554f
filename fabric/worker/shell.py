"""The IPython shell a worker runs cells in, publishing outputs as nbformat output dicts.

Cells run through IPython's own `run_cell`, so input transformation, magics, ``!`` lines, the
display hook and tracebacks behave as in a Jupyter kernel. What a kernel would send on its IOPub
channel goes to a `sink` callable instead: ``sink(kind, **fields)``.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from IPython.core.compilerop import CachingCompiler
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.events import EventManager, available_events
from IPython.core.interactiveshell import InteractiveShell
from traitlets import Type

from ..protocol import Wire
from . import cellfiles, env
from .bookkeeping import is_bookkeeping

Sink = Callable[..., None]


def _jsonable(bundle: dict) -> dict:
    """MIME bundles travel as JSON-able data: binary payloads become base64 text, as in nbformat."""
    return {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v
            for k, v in bundle.items()}


def _sink(shell: InteractiveShell | None) -> Sink:
    """Where the display publisher and hook of the worker's shell send what they show."""
    assert isinstance(shell, ZMQInteractiveShell), "only the worker's shell makes them"
    return shell.sink


class _Publisher(DisplayPublisher):
    def publish(self, data: dict, metadata: dict | None = None, *args: Any,
                transient: dict | None = None, update: bool = False, **kwargs: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        _sink(self.shell)("update_display_data" if update else "display_data",
                          data=_jsonable(data), metadata=metadata or {},
                          transient=transient or {})

    def clear_output(self, wait: bool = False) -> None:
        _sink(self.shell)("clear_output", wait=wait)


class _DisplayHook(DisplayHook):
    def write_output_prompt(self) -> None:
        pass

    def write_format_data(self, format_dict: dict, md_dict: dict | None = None) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        _sink(self.shell)("execute_result", data=_jsonable(format_dict),
                          metadata=md_dict or {}, execution_count=self.prompt_count)

    def finish_displayhook(self) -> None:
        self._is_active = False


class OutStream(io.TextIOBase):
    """A text stream whose writes are batched into `stream` outputs, at least every 50 ms, of
    at most `chunk` characters each.

    `flush()` first drains `before_flush` (output written to the fd underneath by C code), so an
    explicit flush, as the display hook does, keeps outputs in the order they were made.
    In a process forked from the worker, it writes to that fd instead (`write_to`).
    """

    interval = 0.05
    chunk = 1 << 16  # characters of text in one stream output at most
    encoding = "utf-8"  # as a kernel's streams: IPython prints "±", not "+-", on them

    def __init__(self, name: str, shell: ZMQInteractiveShell) -> None:
        self.name = name
        self._shell = shell
        self._parts: list[str] = []
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self.before_flush: Callable[[], None] | None = None
        self._fd: int | None = None

    def write_to(self, fd: int) -> None:
        """Write each text straight to `fd` from now on: in a process forked from the worker,
        whose capture of `fd` forwards it. What the worker had buffered is its own, and its
        lock may have been held by a thread the fork left behind."""
        self._lock = threading.Lock()
        self._parts = []
        self._fd = fd
        self.before_flush = None

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._parts.append(text)
        if self._fd is not None or time.monotonic() - self._last > self.interval:
            self.send()
        return len(text)

    def send(self) -> None:
        """Publish what is buffered."""
        with self._lock:
            text, self._parts = "".join(self._parts), []
            self._last = time.monotonic()
        if text and self._fd is not None:
            data = text.encode(errors="replace")
            while data:
                data = data[os.write(self._fd, data):]
            return
        for start in range(0, len(text), self.chunk):  # a flood never fills one message
            self._shell.sink("stream", name=self.name, text=text[start:start + self.chunk])

    def flush(self) -> None:
        if self.before_flush is not None:
            self.before_flush()
        self.send()


class _Compiler(CachingCompiler):
    def get_code_name(self, raw_code: str, transformed_code: str, number: int) -> str:
        # A path, as Jupyter kernels name cells: warnings then read as users know them, and a
        # debugger's breakpoints in the cell name it (`cellfiles`).
        return cellfiles.path(raw_code)


class _Events(EventManager):
    """IPython's events, but for a KeyboardInterrupt in a callback: the server's interrupt,
    landing in one as a cell starts or ends, is the cell's. IPython would show it as the
    callback's error and run the cell on."""

    def trigger(self, event: str, *args: Any, **kwargs: Any) -> None:
        for callback in self.callbacks[event][:]:
            try:
                callback(*args, **kwargs)
            except Exception:  # the callback's own error: shown, and the others run
                self.shell.showtraceback()


class ZMQInteractiveShell(InteractiveShell):
    """An InteractiveShell without a terminal; what it shows goes to `sink`.

    Named as a Jupyter kernel's shell on purpose: libraries (pandas, rich) recognise a notebook
    frontend by that class name and format for it, and a fabric worker has a notebook frontend.
    """

    # Libraries tell a kernel from a terminal IPython by this attribute (pandas then shows up
    # to 20 columns instead of fitting a terminal); workers have no Jupyter kernel object.
    kernel = None
    compiler_class = Type(_Compiler)
    displayhook_class = Type(_DisplayHook)
    display_pub_class = Type(_Publisher)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sink: Sink = lambda kind, **fields: None
        self._parent: Wire = {}

    # The frontend's request being handled, as a kernel's shell has it: an output widget
    # captures what is output under its msg_id (`ipywidgets.Output`).
    def get_parent(self) -> Wire:
        return self._parent

    def set_parent(self, parent: Wire) -> None:
        self._parent = parent

    def handling(self, parent_id: str | None) -> None:
        """The request (a cell, a comm message) of the frontend's msg_id `parent_id`; None:
        no frontend's (a replay, a cell of `llfabric run`)."""
        self.set_parent({"header": {"msg_id": parent_id}} if parent_id else {})

    def init_events(self) -> None:
        super().init_events()
        events = _Events(self, available_events)
        events.callbacks = self.events.callbacks  # those IPython registered as it made its own
        self.events = events

    def init_history(self) -> None:
        super().init_history()
        assert self.history_manager is not None, "init_history made it"
        self.history_manager.enabled = False

    def enable_gui(self, gui: str | None = None) -> None:
        """Workers have no GUI event loop: `%matplotlib inline` needs none, others draw nowhere."""

    def _showtraceback(self, etype: type, evalue: BaseException, stb: list[str]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.sink("error", ename=etype.__name__, evalue=str(evalue), traceback=list(stb))

    def user_variables(self) -> list[str]:
        """The names of the session's state now in the namespace."""
        return [n for n in self.user_ns if not is_bookkeeping(n)]


def make_shell(user_ns: dict | None = None) -> ZMQInteractiveShell:
    """Create the one shell of this process (in the zygote, before any fork)."""
    from traitlets.config import Config

    # Figures show inline, as in a Jupyter kernel, unless the user chose a backend.
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    # IPython's default colours, as a kernel's: tracebacks and `?` help in colour
    shell = ZMQInteractiveShell.instance(config=config, user_ns=user_ns)
    # A kernel's magics too: ipykernel's own (%clear, %less, %man...) and %store, the extension
    # every IPython application loads; without them such a cell fails only on the fabric. With
    # ipykernel's shell loaded, libraries that look for it (tqdm.auto) take a notebook for one.
    # A host without ipykernel (a bare GPU machine) runs cells without them.
    with contextlib.suppress(ImportError):
        from ipykernel.zmqshell import KernelMagics

        shell.register_magics(KernelMagics)
    assert shell.extension_manager is not None, "an InteractiveShell makes its extension manager"
    shell.extension_manager.load_extension("storemagic")
    shell.user_ns["__name__"] = "__main__"
    env.install_magics(shell)
    return shell
