"""The wheel's one build step beyond pyproject.toml: compile the workers' pid-1 init
(native/init.c) into the package, where `fabric.pool.criu` finds it when no checkout build is
there. It is a Linux binary, so the wheel is tagged for this platform (any Python 3)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

SOURCE = Path("native") / "init.c"
TARGET = Path("fabric") / "pool" / "llfabric-init"


class BuildWithInit(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / TARGET
        target.parent.mkdir(parents=True, exist_ok=True)
        compiler = shlex.split(os.environ.get("CC", "gcc"))
        flags = shlex.split(os.environ.get("CFLAGS", "-O2 -Wall -Wextra -Werror -std=c11"))
        subprocess.run([*compiler, *flags, "-o", str(target), str(SOURCE)], check=True)


class PlatformWheel(bdist_wheel):
    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False  # it carries a native binary

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", super().get_tag()[2]


setup(cmdclass={"build_py": BuildWithInit, "bdist_wheel": PlatformWheel})
