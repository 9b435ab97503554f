"""jupyter_kernel_test, the conformance suite Jupyter kernels are tested with, against the
"Python 3 (llfabric)" kernel and a real server, with completion and inspection samples of a
session variable (defined on the fabric, absent from the kernel process)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from pathlib import Path

import pytest
from attached import KERNEL_NAME, kernel_env
from helpers import serving

from fabric.attach.kernels import install_kernelspec

jkt = pytest.importorskip("jupyter_kernel_test")


class TestLLFabricKernel(jkt.KernelTests):
    kernel_name = KERNEL_NAME
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}},
                          {"text": "my_unique_v", "matches": {"my_unique_var"}},
                          {"text": "my_unique_var.ke", "matches": {"keys"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('no')"
    code_execute_result = [{"code": "1+2+3", "result": "6"},
                           {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"}]
    code_display_data = [{"code": "from IPython.display import HTML, display; "
                                  "display(HTML('<b>test</b>'))", "mime": "text/html"}]
    # "range" is left out: with IPython 9 a plain ipykernel fails it too (it numbers the
    # current session 0 in a range, not as its tail does); test_kernel_requests checks ours
    # against a plain kernel's instead
    supported_history_operations = ("tail", "search")
    code_history_pattern = "1?2*"
    code_inspect_sample = "my_unique_var"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    @classmethod
    def setUpClass(cls) -> None:
        cls.stack = contextlib.ExitStack()
        root = Path(cls.stack.enter_context(tempfile.TemporaryDirectory(prefix="llf-jkt-")))
        server = cls.stack.enter_context(serving(root / "store"))
        install_kernelspec(KERNEL_NAME, prefix=str(root / "jupyter"))
        env = kernel_env(server.address, f"jkt-{uuid.uuid4().hex[:10]}",
                         JUPYTER_PATH=str(root / "jupyter" / "share" / "jupyter"))
        cls.stack.enter_context(_environ(env))  # start_new_kernel passes ours on
        super().setUpClass()
        reply = cls.kc.execute_interactive("my_unique_var = {'alpha': 1}", timeout=120)
        assert reply["content"]["status"] == "ok", reply

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            super().tearDownClass()
        finally:
            cls.stack.close()


@contextlib.contextmanager
def _environ(env: dict[str, str]):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
