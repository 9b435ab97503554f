"""Attach a Jupyter kernel to llfabric: `%load_ext fabric.attach`, or `%llfabric attach [ADDRESS]`.

From then on the kernel runs no user code: `run_cell` sends each cell to the session and the
relay re-publishes its outputs. `%%local` cells, and the `%llfabric` and `%load_ext` lines that
manage the attachment, still run in the kernel.
"""

from __future__ import annotations

from IPython.core.interactiveshell import InteractiveShell

from . import attaching
from .attaching import current, detach, require_kernel
from .magics import FabricMagics
from .relay import Attachment

__all__ = ["attach", "current", "detach", "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(shell: InteractiveShell) -> None:
    attach(shell)


def unload_ipython_extension(shell: InteractiveShell) -> None:
    detach(shell)


def attach(shell: InteractiveShell, address: str | None = None, session: str | None = None,
           notebook: str | None = None) -> Attachment:
    """`attaching.attach`, with the `%llfabric` magics that manage the attachment."""
    require_kernel(shell)
    shell.register_magics(FabricMagics)
    return attaching.attach(shell, address, session, notebook)
