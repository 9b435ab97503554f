"""What a worker answers between cells, on its live namespace: completion and inspection, as an
ipykernel answers `complete_request` and `inspect_request`; and the payloads a cell leaves
(`?` and `??` page, `%load` and `%recall` set the next input), as its execute reply carries them.
"""

from __future__ import annotations

from IPython.core import page, payloadpage
from IPython.core.completer import provisionalcompleter, rectify_completions
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.tokenutil import token_at_cursor

from ..protocol import Wire

TYPES_KEY = "_jupyter_types_experimental"  # the completion metadata JupyterLab reads


def complete(shell: InteractiveShell, code: str, cursor: int) -> Wire:
    """A `complete_reply`'s content."""
    cursor = max(0, min(cursor, len(code)))
    with provisionalcompleter():
        found = list(rectify_completions(code, shell.Completer.completions(code, cursor)))
    start, end = (found[0].start, found[0].end) if found else (cursor, cursor)
    return {"status": "ok", "matches": [c.text for c in found], "cursor_start": start,
            "cursor_end": end, "metadata": {TYPES_KEY: [
                {"start": c.start, "end": c.end, "text": c.text, "type": c.type,
                 "signature": c.signature} for c in found]}}


def inspect(shell: InteractiveShell, code: str, cursor: int, detail: int) -> Wire:
    """An `inspect_reply`'s content."""
    name = token_at_cursor(code, max(0, min(cursor, len(code))))
    try:
        data = shell.object_inspect_mime(name, detail_level=detail)
    except KeyError:
        return {"status": "ok", "found": False, "data": {}, "metadata": {}}
    data.pop("text/html", None)  # as a kernel without an HTML pager sends it
    return {"status": "ok", "found": True, "data": data, "metadata": {}}


def collect_payloads(shell: InteractiveShell) -> None:
    """Route the pager and `set_next_input` to the shell's payload manager, as a kernel does."""
    payloads = shell.payload_manager
    assert payloads is not None, "an InteractiveShell makes its payload manager"

    def set_next_input(text: str, replace: bool = False) -> None:
        payloads.write_payload(
            {"source": "set_next_input", "text": text, "replace": replace})

    shell.set_hook("show_in_pager", page.as_hook(payloadpage.page), 99)
    shell.set_next_input = set_next_input


def take_payloads(shell: InteractiveShell) -> list[dict]:
    """The cell's payloads, cleared for the next."""
    manager = shell.payload_manager
    assert manager is not None, "an InteractiveShell makes its payload manager"
    payloads = manager.read_payload()
    manager.clear_payload()
    return [dict(p) for p in payloads]
