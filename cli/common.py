"""What the commands share: the configuration under their flags, a server to talk to, and
sizes as people read them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import click

from fabric import config as fabric_config
from fabric.client import Client
from fabric.embedded import EmbeddedServer
from fabric.errors import Unreachable

# `llfabric demo`'s notebook, shipped inside the package (a wheel carries it too)
DEMO_NOTEBOOK = Path(__file__).resolve().parent / "train_tiny_mlp.ipynb"
DEMO_NEEDS = ("torch", "matplotlib")  # what it imports beyond llfabric's own dependencies


def config(store: str | None = None, bind: str | None = None,
           **more: object) -> fabric_config.Config:
    """The configuration with the command's flags over it (the flags left unset change
    nothing)."""
    return fabric_config.load().with_overrides(store=store, bind=bind, **more)


@contextlib.contextmanager
def client_of(connect: str | None, store: str | None) -> Iterator[Client]:
    """A client of the given server, of the default one, or of an embedded one started now."""
    configured = config(store, connect)
    with Client(configured.address) as client:
        if client.answers():
            yield client
            return
    if connect:
        raise Unreachable(f"no llfabric server answers at {connect}", address=connect)
    click.echo(f"starting an embedded server on {configured.address}", err=True)
    with EmbeddedServer(configured), Client(configured.address) as client:
        yield client


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f}"


def mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"
