"""`llfabric keys`: the CURVE keys of the clients a tcp:// server admits."""

from __future__ import annotations

from pathlib import Path

import click

from fabric.errors import AlreadyExists, UnknownUser

from .common import config


@click.group()
def keys() -> None:
    """The CURVE keys of clients a tcp:// server admits (in the configured key_dir)."""


def _keys():
    from fabric.auth import Keys

    return Keys(config().key_dir)


@keys.command("new")
@click.argument("user")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False),
              help="Where to write USER's client key (default: USER.key here).")
def keys_new(user: str, out: Path | None) -> None:
    """Admit USER: make their key pair and write the client key file they install as
    ~/.config/llfabric/client.key on their machine."""
    from fabric.auth import write_client_key

    out = out or Path(f"{user}.key")
    if out.exists() or out.is_symlink():
        raise AlreadyExists(f"{out} exists; choose another --out", path=str(out))
    write_client_key(out, _keys().new_client(user))
    click.echo(f"admitted {user}; give them {out} (secret: it is their key) to install as "
               "~/.config/llfabric/client.key")


@keys.command("list")
def keys_list() -> None:
    """The admitted users and their public keys."""
    for user, public in _keys().users().items():
        click.echo(f"{user}  {public}")


@keys.command("revoke")
@click.argument("user")
def keys_revoke(user: str) -> None:
    """Stop admitting USER, also on the connections they have open."""
    if not _keys().revoke(user):
        raise UnknownUser(f"no key of user {user!r}", user=user)
    click.echo(f"revoked {user}")
