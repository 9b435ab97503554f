"""Environments: a session's packages, layered over the server's. Real server, workers, venvs
and pip; the packages are tiny wheels written here and installed with --no-index."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from attached import Kernel, install_test_kernelspec, kernel_env, text_of
from click.testing import CliRunner
from helpers import RunningServer, execute, open_session, require_criu, serving, text
from nbformat.v4 import new_code_cell, new_notebook
from wheels import wheel

from cli.main import main as cli
from fabric.attach.kernels import ENV_VARIABLE, kernelspec
from fabric.auth import owner_name
from fabric.client import Client
from fabric.envs import Env, Envs
from fabric.errors import EnvError, InvalidName, RemoteError
from fabric.snapshot import Manifest, Store

SHOW = "import tinypkg\nprint(tinypkg.VERSION)"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    for version in ("1.0", "2.0"):
        wheel(folder, "tinypkg", version, f"VERSION = {version!r}\n")
    wheel(folder, "newpkg", "1.0", "HELLO = 'new'\n")
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(tmp_path_factory.mktemp("store")) as running:  # warm workers, the default
        yield running


def _env(server: RunningServer, wheels: Path, name: str, *packages: str) -> Env:
    env = Envs(server.store / "envs").create(owner_name(), name)
    if packages:
        env.install(["install", "--no-index", "--find-links", str(wheels), *packages])
    return env


def _pip(wheels: Path, spec: str) -> str:
    return f"%pip install -q --no-index --find-links {wheels} {spec}"


def _session(client: Client, cwd: Path, env: str) -> str:
    name = open_session(client, cwd)
    client.call("open", session=name, env=env)
    return name


def _zygotes(client: Client, env: Env) -> dict[int, list[str]]:
    return {z.pid: z.modules for z in client.status().zygotes
            if z.env == str(env.site)}


def test_two_sessions_hold_two_versions_of_one_package_at_once(
        server: RunningServer, wheels: Path, tmp_path: Path) -> None:
    one, two = _env(server, wheels, "one", "tinypkg==1.0"), _env(server, wheels, "two",
                                                                 "tinypkg==2.0")
    with server.client() as client:
        first, second = _session(client, tmp_path, "one"), _session(client, tmp_path, "two")
        for _ in range(2):  # interleaved, on fresh workers and on warm ones
            assert text(execute(client, first, SHOW)[1]) == "1.0\n"
            assert text(execute(client, second, SHOW)[1]) == "2.0\n"
        assert any("tinypkg" in m for m in _zygotes(client, one).values())
        assert any("tinypkg" in m for m in _zygotes(client, two).values())
        status = {s.session: s.env for s in client.status().sessions}
        assert (status[first], status[second]) == ("one", "two")
        # the server's own packages are untouched: a session on them has no tinypkg
        plain = open_session(client, tmp_path)
        assert "ModuleNotFoundError" in text(execute(client, plain, SHOW)[1])
    store = Store(server.store)
    head = Manifest.decode(store.get_manifest(store.head(first)))
    assert head.env == {"name": "one", "packages": {"tinypkg": "1.0"}}


def test_a_session_moves_between_environments(server: RunningServer, wheels: Path,
                                              tmp_path: Path) -> None:
    _env(server, wheels, "old", "tinypkg==1.0")
    _env(server, wheels, "new", "tinypkg==2.0")
    with server.client() as client:
        session = _session(client, tmp_path, "old")
        execute(client, session, "import sys\nsys.path.append('/nowhere')\n" + SHOW)
        client.call("open", session=session, env="new")  # its saved sys.path names old's
        reply, outputs = execute(client, session, SHOW + "\nprint(sys.path[-1])")
        assert (reply["path"], text(outputs)) == ("cold", "2.0\n/nowhere\n")
        client.call("close", session=session)
        client.call("open", session=session, cwd=str(tmp_path))  # reopened: as its head ran
        assert text(execute(client, session, SHOW)[1]) == "2.0\n"
        client.call("open", session=session, env="")  # the server's packages again
        assert "ModuleNotFoundError" in text(execute(client, session, SHOW)[1])


def test_pip_install_in_a_cell_goes_into_the_environment_and_the_next_cell_sees_it(
        server: RunningServer, wheels: Path, tmp_path: Path) -> None:
    env = _env(server, wheels, "fresh")
    with server.client() as client:
        session = _session(client, tmp_path, "fresh")
        execute(client, session, "x = 41")
        reply, outputs = execute(client, session, _pip(wheels, "newpkg") + "\nimport newpkg")
        assert reply["status"] == "ok", text(outputs)
        assert env.packages() == {"newpkg": "1.0"}
        reply, outputs = execute(client, session, "import newpkg\nprint(newpkg.HELLO, x + 1)")
        # the environment changed under the warm worker: the cell runs on a fresh one
        assert (reply["path"], text(outputs)) == ("cold", "new 42\n")


def test_an_install_retires_the_environments_zygotes(server: RunningServer, wheels: Path,
                                                     tmp_path: Path) -> None:
    env = _env(server, wheels, "rebuilt", "tinypkg==1.0")
    with server.client() as client:
        session = _session(client, tmp_path, "rebuilt")
        assert text(execute(client, session, SHOW)[1]) == "1.0\n"
        before = _zygotes(client, env)
        assert any("tinypkg" in m for m in before.values())  # it imported version 1.0
        execute(client, session, _pip(wheels, "tinypkg==2.0"))
        assert text(execute(client, session, SHOW)[1]) == "2.0\n"
        after = _zygotes(client, env)
        assert any("tinypkg" in m for m in after.values())
        assert not set(before) & set(after)  # every zygote of the old packages is gone


def test_a_checkout_across_an_install_says_which_versions_differ(
        server: RunningServer, wheels: Path, tmp_path: Path) -> None:
    _env(server, wheels, "moved", "tinypkg==1.0")
    with server.client() as client:
        session = _session(client, tmp_path, "moved")
        execute(client, session, "x = 1")
        execute(client, session, _pip(wheels, "tinypkg==2.0"))
        reply = client.call("checkout", session=session, version=1)
        assert reply.env == "moved"
        assert reply.packages_differ == {"tinypkg": ["1.0", "2.0"]}
        execute(client, session, _pip(wheels, "tinypkg==1.0"))  # what the message proposes
        assert client.call("checkout", session=session, version=1).packages_differ == {}


def test_installs_never_reach_the_servers_packages(server: RunningServer, wheels: Path,
                                                   tmp_path: Path) -> None:
    _env(server, wheels, "guarded")
    with server.client() as client:
        plain = open_session(client, tmp_path)
        reply, outputs = execute(client, plain, _pip(wheels, "newpkg"))
        assert reply["status"] == "error" and "llfabric env create" in text(outputs)
        reply, outputs = execute(client, plain, f"!pip install --no-index {wheels}/x.whl")
        assert reply["status"] == "error" and "%pip install" in text(outputs)
        session = _session(client, tmp_path, "guarded")
        reply, outputs = execute(client, session, "!pip install x && echo more")
        assert reply["status"] == "error" and "%pip install" in text(outputs)
        # a plain one goes where %pip would
        reply, outputs = execute(client, session, f"!pip install -q --no-index --find-links "
                                                  f"{wheels} newpkg  # a comment\nimport newpkg")
        assert reply["status"] == "ok", text(outputs)
        with pytest.raises(RemoteError) as refused:
            client.call("open", session=session, env="no-such-env")
        assert refused.value.kind == "unknown_env"


def test_the_env_commands(tmp_path: Path, wheels: Path) -> None:
    runner = CliRunner(env={"LLFABRIC_STORE": str(tmp_path / "store")})
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"--no-index\n--find-links {wheels}\ntinypkg==2.0\n")
    made = runner.invoke(cli, ["env", "create", "cli", "--from", str(requirements)])
    assert made.exit_code == 0, made.output
    assert "tinypkg==2.0" in runner.invoke(cli, ["env", "list"]).output
    again = runner.invoke(cli, ["env", "create", "cli"])
    assert again.exit_code == 1 and "exists" in again.output
    assert runner.invoke(cli, ["env", "rm", "cli"]).exit_code == 0
    assert runner.invoke(cli, ["env", "list"]).output == ""


def test_templates_are_kept_per_environment_and_rebuilt_after_an_install(
        wheels: Path, tmp_path: Path) -> None:
    require_criu("templates")
    with serving(tmp_path / "store", keep_warm=0, worker_source="template") as server:
        env = _env(server, wheels, "imaged", "tinypkg==1.0")
        with server.client() as client:
            session = _session(client, tmp_path, "imaged")
            assert text(execute(client, session, SHOW)[1]) == "1.0\n"  # forked: none built yet
            _ready_template(client, env)
            reply, outputs = execute(client, session, SHOW)
            assert (reply["source"], text(outputs)) == ("template", "1.0\n")
            execute(client, session, _pip(wheels, "tinypkg==2.0"))
            assert text(execute(client, session, SHOW)[1]) == "2.0\n"  # not the old image
            _ready_template(client, env)
            reply, outputs = execute(client, session, SHOW)
            assert (reply["source"], text(outputs)) == ("template", "2.0\n")


def _ready_template(client: Client, env: Env) -> None:
    deadline = time.monotonic() + 120
    while not any(t.env == str(env.site) and t.state == "ready" and
                  "tinypkg" in t.modules for t in client.status().templates):
        assert time.monotonic() < deadline, client.status().templates
        time.sleep(0.2)


def test_run_takes_the_environment_from_the_notebook_or_its_flag(
        server: RunningServer, wheels: Path, tmp_path: Path) -> None:
    _env(server, wheels, "ran", "tinypkg==1.0")
    _env(server, wheels, "flagged", "tinypkg==2.0")
    nb = new_notebook(cells=[new_code_cell(SHOW)], metadata={"llfabric": {"env": "ran"}})
    nbformat.write(nb, str(tmp_path / "nb.ipynb"))
    runner = CliRunner()
    command = ["run", str(tmp_path / "nb.ipynb"), "--connect", server.address]
    assert "1.0" in runner.invoke(cli, command).output
    assert "2.0" in runner.invoke(cli, [*command, "--env", "flagged"]).output
    missing = runner.invoke(cli, [*command, "--env", "missing"])
    assert missing.exit_code == 1 and "no environment 'missing'" in missing.output


def test_a_notebook_chooses_its_environment_and_installs_from_a_cell(
        server: RunningServer, wheels: Path, tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    _env(server, wheels, "attached", "tinypkg==1.0")
    specs = install_test_kernelspec(tmp_path_factory.mktemp("jupyter"))
    assert kernelspec(env="attached")["env"] == {ENV_VARIABLE: "attached"}
    kernel = Kernel.start(specs, kernel_env(server.address, f"k-{tmp_path.name[-20:]}",
                                            **{ENV_VARIABLE: "attached"}), tmp_path)
    try:
        assert text_of(kernel.execute(SHOW)[1]) == "1.0\n"  # the kernelspec's environment
        assert "server's packages" in text_of(kernel.execute("%llfabric env base")[1])
        assert "ModuleNotFoundError" in str(kernel.execute(SHOW))
        assert "environment attached" in text_of(kernel.execute("%llfabric env attached")[1])
        assert text_of(kernel.execute(SHOW)[1]) == "1.0\n"
        kernel.execute(_pip(wheels, "tinypkg==2.0"))
        assert text_of(kernel.execute(SHOW)[1]) == "2.0\n"
        said = text_of(kernel.execute("%llfabric checkout 1")[1], "stderr")
        assert "tinypkg: 1.0 then, 2.0 now" in said and "%pip install tinypkg==1.0" in said
        refused = text_of(kernel.execute("%llfabric env gone")[1], "stderr")
        assert "no environment 'gone'" in refused
    finally:
        kernel.stop()


def test_a_failed_create_leaves_nothing_behind(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("--no-index\nno-such-package-anywhere\n")
    envs = Envs(tmp_path / "envs")
    with pytest.raises(EnvError, match="no-such-package-anywhere"):
        envs.create("someone", "broken", requirements)
    assert envs.list("someone") == [] and not (tmp_path / "envs" / "someone" / "broken").exists()
    with pytest.raises(InvalidName):
        envs.create("someone", "../escape")
