"""A worker opened to a debugger: debugpy, as Python kernels run it, serving the debug adapter
protocol on a port of 127.0.0.1, whose client is the server (`pool.debugging`).

It starts on the first cell run while the session's frontend debugs, and stays for the worker's
life (debugpy starts once per process); between cells no client is connected, and a worker that
is no longer debugged runs its cells untraced.
"""

from __future__ import annotations

import os

from IPython.core.inputtransformer2 import leading_empty_lines

from .shell import ZMQInteractiveShell

# no warning about frozen modules in the first debugged cell's stderr
ENVIRON = {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}

_port: int | None = None


def start(shell: ZMQInteractiveShell) -> int:
    """Serve the debug adapter protocol (started once), tracing this thread, the one cells run
    in; its port."""
    global _port
    os.environ.update(ENVIRON)
    import debugpy

    if _port is None:
        # processes a cell starts are its own, never debugged through this worker's adapter
        debugpy.configure(subProcess=False)
        _port = debugpy.listen(("127.0.0.1", 0))[1]
        # a cell keeps its leading blank lines, so that its breakpoints' lines are the cell's
        transforms = shell.input_transformer_manager.cleanup_transforms
        if leading_empty_lines in transforms:
            transforms.remove(leading_empty_lines)
    else:  # untraced since (`stop`), or an interrupt in the debugger's trace function ended it
        debugpy.trace_this_thread(True)
    return _port


def stop() -> None:
    """Run cells untraced (the debugger serves on, for a frontend that debugs again): a
    traced cell runs slower, even without breakpoints."""
    if _port is not None:
        import debugpy

        debugpy.trace_this_thread(False)
