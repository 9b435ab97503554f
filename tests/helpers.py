"""Small helpers shared by the server tests."""

from __future__ import annotations

from fabric.client import Client


def execute(client: Client, session: str, source: str) -> tuple[dict, list[dict]]:
    """Run one cell; return the server's reply and the cell's outputs."""
    outputs, reply = [], {}
    for message in client.stream("execute", timeout=120, session=session, source=source):
        if message["type"] == "event":
            outputs.append(message["output"])
        else:
            reply = message
    return reply, outputs


def text(outputs: list[dict]) -> str:
    """What a reader sees as text: streams and text/plain results, in order."""
    parts = []
    for out in outputs:
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append(out["data"].get("text/plain", "") + "\n")
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}\n")
    return "".join(parts)
