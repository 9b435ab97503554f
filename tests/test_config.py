"""Configuration layering: defaults, then llfabric.toml, then LLFABRIC_*, then flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric.config import Config, load
from fabric.errors import FabricError


def test_defaults_need_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no llfabric.toml here
    config = load(env={})
    assert config == Config()
    assert config.slots == 0
    assert config.max_zygotes == 4
    assert config.store.name == "llfabric"
    assert config.address == f"ipc://{config.runtime_dir / 'server.sock'}"
    assert load(tmp_path / "absent.toml", env={}) == Config()


def test_file_overrides_defaults(tmp_path: Path) -> None:
    path = tmp_path / "llfabric.toml"
    path.write_text('[llfabric]\nstore = "/data/store"\nslots = 3\nbind = "tcp://127.0.0.1:5555"\n')
    config = load(path, env={})
    assert config.store == Path("/data/store")
    assert config.slots == 3
    assert config.bind == "tcp://127.0.0.1:5555"
    assert config.address == "tcp://127.0.0.1:5555"
    assert config.max_zygotes == Config().max_zygotes  # untouched keys keep their default


def test_file_without_a_table_works_too(tmp_path: Path) -> None:
    path = tmp_path / "llfabric.toml"
    path.write_text("max_zygotes = 9\n")
    assert load(path, env={}).max_zygotes == 9


def test_file_in_the_working_directory_is_found(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "llfabric.toml").write_text("[llfabric]\nslots = 5\n")
    monkeypatch.chdir(tmp_path)
    assert load(env={}).slots == 5


def test_llfabric_config_env_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.toml"
    path.write_text("[llfabric]\nslots = 6\n")
    assert load(env={"LLFABRIC_CONFIG": str(path)}).slots == 6


def test_env_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "llfabric.toml"
    path.write_text('[llfabric]\nstore = "/from/file"\nslots = 3\n')
    config = load(path, env={"LLFABRIC_STORE": "/from/env", "LLFABRIC_SLOTS": "8",
                             "OTHER": "ignored", "LLFABRIC_UNKNOWN": "ignored"})
    assert config.store == Path("/from/env")
    assert config.slots == 8
    assert isinstance(config.slots, int)


def test_flags_win_over_env_and_file(tmp_path: Path) -> None:
    path = tmp_path / "llfabric.toml"
    path.write_text("[llfabric]\nslots = 3\nmax_zygotes = 2\n")
    config = load(path, env={"LLFABRIC_SLOTS": "8", "LLFABRIC_STORE": "/env"})
    flagged = config.with_overrides(slots="12", store="/flag", bind=None)
    assert flagged.slots == 12
    assert flagged.store == Path("/flag")
    assert flagged.max_zygotes == 2  # from the file, no flag given
    assert flagged.bind == ""  # a None flag changes nothing
    assert config.slots == 8  # the original is unchanged


def test_store_path_expands_the_home_directory() -> None:
    config = Config().with_overrides(store="~/fabric-store")
    assert config.store == Path.home() / "fabric-store"


def test_unknown_key_in_the_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "llfabric.toml"
    path.write_text("[llfabric]\nslotz = 3\n")
    with pytest.raises(FabricError, match="unknown configuration key 'slotz'"):
        load(path, env={})


def test_unknown_flag_raises() -> None:
    with pytest.raises(FabricError, match="unknown configuration key"):
        Config().with_overrides(colour="blue")


@pytest.mark.parametrize("value", ["many", "3.5", ""])
def test_bad_int_from_env_raises(tmp_path: Path, value: str) -> None:
    with pytest.raises(FabricError, match="slots"):
        load(tmp_path / "absent.toml", env={"LLFABRIC_SLOTS": value})


def test_bad_int_in_the_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "llfabric.toml"
    path.write_text('[llfabric]\nmax_zygotes = "four"\n')
    with pytest.raises(FabricError, match="max_zygotes"):
        load(path, env={})


def test_bad_int_flag_raises() -> None:
    with pytest.raises(FabricError):
        Config().with_overrides(max_frame="big")


def test_malformed_toml_raises(tmp_path: Path) -> None:
    path = tmp_path / "llfabric.toml"
    path.write_text("[llfabric\nslots = \n")
    with pytest.raises(FabricError, match="cannot read"):
        load(path, env={})


def test_a_session_gpu_count_the_host_cannot_give_is_refused_at_start(tmp_path: Path) -> None:
    from fabric.errors import ConfigError
    from fabric.server import Server

    assert Config().gpus == 1
    with pytest.raises(ConfigError, match="gpus is 3; a session's cells may lease 1 to 2"):
        Server(Config(store=tmp_path / "store", runtime_dir=tmp_path / "run", slots=2, gpus=3))


@pytest.mark.parametrize(("settings", "named"), [
    ({"memory_pressure": 0}, "memory_pressure is 0: a percent, 1 to 100"),
    ({"memory_pressure": 101}, "memory_pressure is 101"),
    ({"memory_stall": -1}, "memory_stall is -1: a percent, 0 to 100"),
    ({"memory_pressure": 80, "memory_relief": 80}, "memory_relief is 80: memory pressure must "
                                                   "end below where it begins"),
    ({"kept_memory": -1}, "kept_memory is -1: bytes, or 0 for no limit"),
    ({"user_memory": -5}, "user_memory is -5"),
])
def test_memory_settings_that_cannot_work_are_refused_naming_the_setting(
        tmp_path: Path, settings: dict, named: str) -> None:
    path = tmp_path / "llfabric.toml"
    path.write_text("".join(f"{key} = {value}\n" for key, value in settings.items()))
    with pytest.raises(FabricError, match=named) as refused:
        load(path, env={})
    assert refused.value.fields["key"] in settings
    good = load(tmp_path / "absent.toml", env={
        "LLFABRIC_MEMORY_PRESSURE": "80", "LLFABRIC_MEMORY_RELIEF": "70",
        "LLFABRIC_KEPT_MEMORY": str(8 << 30), "LLFABRIC_USER_MEMORY": str(2 << 30)})
    assert (good.memory_relief, good.kept_memory, good.user_memory) == (70, 8 << 30, 2 << 30)


def test_write_tracking_is_on_unless_turned_off_and_takes_only_0_or_1(tmp_path: Path) -> None:
    assert Config().track_writes == 1
    assert load(tmp_path / "absent.toml", env={"LLFABRIC_TRACK_WRITES": "0"}).track_writes == 0
    path = tmp_path / "llfabric.toml"
    path.write_text("track_writes = false\n")
    assert load(path, env={}).track_writes == 0
    path.write_text("track_writes = 2\n")
    with pytest.raises(FabricError, match="track_writes is 2: 1 \\(on\\) or 0 \\(off\\)"):
        load(path, env={})
