"""`llfabric env`: your environments, packages layered over the server's (`fabric.envs`)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import config


@click.group()
def env() -> None:
    """Your environments: virtual environments over the server's packages, chosen by a session
    with `%llfabric env NAME` or `llfabric run --env NAME`."""


def _envs():
    from fabric.envs import Envs

    return Envs(config().env_root)


def _user() -> str:
    from fabric.auth import owner_name

    return owner_name()


@env.command("create")
@click.argument("name")
@click.option("--from", "requirements", type=click.Path(path_type=Path, dir_okay=False,
                                                        exists=True),
              help="A requirements file to install into it.")
def env_create(name: str, requirements: Path | None) -> None:
    """Make environment NAME over the server's packages."""
    made = _envs().create(_user(), name, requirements)
    click.echo(f"made environment {name} ({made.path}); choose it with `%llfabric env {name}` "
               f"or `llfabric run --env {name}`")


@env.command("list")
def env_list() -> None:
    """Your environments and the packages each holds beyond the server's."""
    for made in _envs().list(_user()):
        packages = made.packages()
        click.echo(f"{made.name}  {len(packages)} packages  "
                   + " ".join(f"{n}=={v}" for n, v in packages.items()))


@env.command("install", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, required=True)
def env_install(name: str, args: tuple[str, ...]) -> None:
    """Install ARGS (as pip takes them) into environment NAME."""
    _envs().get(_user(), name).install(["install", *args])
    click.echo(f"installed into {name}")


@env.command("rm")
@click.argument("name")
def env_rm(name: str) -> None:
    """Remove environment NAME (sessions that chose it run on the server's packages)."""
    _envs().remove(_user(), name)
    click.echo(f"removed environment {name}")
