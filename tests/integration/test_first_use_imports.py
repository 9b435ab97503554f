"""A library's part imported on first use in one worker is in the next fresh worker before its
cell runs: the worker names it, the server has the family's zygote import it. Real server,
zygotes and workers."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
from helpers import execute, lazy_package, open_session, serving, text, wait_until

HAS_PART = "print('firstuse_lib.part' in sys.modules)"


def test_a_fresh_workers_zygote_holds_what_an_earlier_cell_imported_on_first_use(
        tmp_path: Path) -> None:
    site = tmp_path / "site"
    lazy_package(site, "firstuse_lib")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    (tmp_path / "notebook").mkdir()
    # keep_warm=0: every cell on a fresh worker forked from the family's zygote
    with serving(tmp_path / "store", env, keep_warm=0) as server, \
            server.client(timeout=120) as client:
        session = open_session(client, tmp_path / "notebook")
        first = f"import sys, firstuse_lib\n{HAS_PART}\nvalue = firstuse_lib.use()"
        reply, outputs = execute(client, session, first)
        assert (reply["source"], text(outputs)) == ("zygote", "False\n")

        def preloaded() -> bool:
            return any("firstuse_lib.part" in z.preloaded for z in client.status().zygotes
                       if z.modules == ("firstuse_lib",))

        wait_until(preloaded, "the family's zygote importing what the cell imported on first use",
                   timeout=300)
        reply, outputs = execute(client, session, f"{HAS_PART}\nprint(firstuse_lib.use())")
        assert (reply["source"], reply["start"], text(outputs)) == ("zygote", "cold",
                                                                    "True\n42\n")

        def zygotes() -> int:  # base and family alone, once no worker is left
            return sum("fabric.worker.zygote" in " ".join(p.cmdline())
                       for p in psutil.Process(server.process.pid).children(recursive=True))

        wait_until(lambda: not client.status().workers and zygotes() == 2,
                   "the replaced zygote ending with its last worker")
