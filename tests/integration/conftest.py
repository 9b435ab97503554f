"""Fixtures of the attached-kernel tests: a kernelspec of the llfabric kernel per module, and a
kernel attached to the module's `server` on the test's `session` name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from attached import Kernel, install_test_kernelspec, kernel_env
from helpers import RunningServer
from jupyter_client.kernelspec import KernelSpecManager


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    return install_test_kernelspec(tmp_path_factory.mktemp("jupyter"))


@pytest.fixture
def kernel(server: RunningServer, specs: KernelSpecManager, session: str,
           tmp_path: Path) -> Iterator[Kernel]:
    """`session` here is the name the module's own fixture gives the kernel's session."""
    started = Kernel.start(specs, kernel_env(server.address, session), tmp_path)
    yield started
    started.stop()
