"""Which cells an attached kernel runs itself rather than sending them to its session."""

from __future__ import annotations

import re

# `%%local` cells, those that manage the attachment, and a line of the history magics, which
# read the session's history the kernel keeps (see `answers`).
LOCAL = re.compile(r"\s*%(%local\b|llfabric\b|(re|un)?load_ext\s+fabric\.attach\b"
                   r"|(history|hist|recall|rep)\b[^\n]*\s*\Z)")


def is_local(source: str) -> bool:
    return LOCAL.match(source) is not None
