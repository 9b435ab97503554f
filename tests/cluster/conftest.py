"""Fixtures the cluster tests share."""

from __future__ import annotations

import pytest
from clusters import free_port


@pytest.fixture(scope="module")
def door_metrics(ray_cluster: object) -> str:
    """Where Prometheus scrapes the front door: a port picked only once the Ray cluster is up,
    since Ray picks its own ports at random too and may take one picked before."""
    return f"127.0.0.1:{free_port()}"
