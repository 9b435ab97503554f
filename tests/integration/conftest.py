"""Fixtures of the attached-kernel tests: a kernelspec of the llfabric kernel per module, and a
kernel attached to the module's `server` on the test's `session` name. Jupyter's packages are
imported only when a test asks for these: a bare GPU host runs this folder's GPU tests
without them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import RunningServer

if TYPE_CHECKING:
    from attached import Kernel
    from jupyter_client.kernelspec import KernelSpecManager


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    from attached import install_test_kernelspec
    return install_test_kernelspec(tmp_path_factory.mktemp("jupyter"))


@pytest.fixture
def kernel(server: RunningServer, specs: KernelSpecManager, session: str,
           tmp_path: Path) -> Iterator[Kernel]:
    """`session` here is the name the module's own fixture gives the kernel's session."""
    from attached import Kernel, kernel_env
    started = Kernel.start(specs, kernel_env(server.address, session), tmp_path)
    yield started
    started.stop()
