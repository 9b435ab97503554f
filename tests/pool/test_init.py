"""llfabric-init (native/init.c) as pid 1: exit status, signal forwarding, reaping orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fabric.pool import criu


@pytest.fixture(scope="module")
def init() -> str:
    binary = criu.init_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("llfabric-init is not built; `make native` builds it", pytrace=False)
        pytest.skip("llfabric-init is not built; run `make native`")
    return str(binary)


def test_passes_on_the_exit_code_and_the_killing_signal(init: str) -> None:
    assert subprocess.run([init, "--pidns", "sh", "-c", "exit 7"]).returncode == 7
    assert subprocess.run([init, "--pidns", "sh", "-c", "kill -9 $$"]).returncode == 128 + 9


def test_the_program_is_pid_2_of_a_new_namespace(init: str) -> None:
    out = subprocess.run([init, "--pidns", "sh", "-c", "echo $$ $PPID; readlink /proc/self"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["2", "1"]
    assert int(out[2]) != 2  # /proc is the host's, so it names the process by its host pid


def test_forwards_signals_to_the_program(init: str) -> None:
    script = "trap 'echo got-term; exit 3' TERM; echo up; while :; do sleep 0.05; done"
    proc = subprocess.Popen([init, "--pidns", "sh", "-c", script], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "up\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 3
    assert proc.stdout.read() == "got-term\n"


def test_reaps_orphans_and_exits_when_the_program_does(init: str) -> None:
    # The program leaves an orphan behind (reparented to the init) and exits; the init reaps
    # the program's status, and the namespace's end takes the orphan with it.
    start = time.monotonic()
    result = subprocess.run([init, "--pidns", "sh", "-c", "(sleep 30 &) ; exit 5"], timeout=20)
    assert result.returncode == 5
    assert time.monotonic() - start < 20


def test_without_a_namespace_it_is_a_subreaper(init: str) -> None:
    # An orphan of the program is reparented to the init (not to the host's init), and the
    # init reaps it when it exits: no zombie is left among the init's children.
    script = ("(sleep 0.3 &); sleep 0.1; ps -o comm= --ppid $PPID | sort | tr '\\n' ' '; echo; "
              "sleep 0.5; ps -o stat= --ppid $PPID | grep -c Z || true")
    out = subprocess.run([init, "sh", "-c", script], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    children, zombies = out.stdout.splitlines()
    assert children.split() == ["sh", "sleep"]  # the program and the orphan
    assert zombies == "0"


def test_usage_error_without_a_program(init: str) -> None:
    result = subprocess.run([init, "--pidns"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage" in result.stderr


def test_keeps_no_inherited_descriptor_once_the_program_runs(init: str) -> None:
    # The program closes the pipe it inherited; the reader must see EOF while the program still
    # runs, so neither the init nor the process that made the namespace holds a copy.
    read_end, write_end = os.pipe()
    # Python, not sh: dash redirects only descriptors 0-9, and the pipe may get a higher one.
    program = f"import os, time; os.close({write_end}); time.sleep(5)"
    proc = subprocess.Popen([init, "--pidns", sys.executable, "-c", program], pass_fds=[write_end])
    os.close(write_end)
    try:
        start = time.monotonic()
        assert os.read(read_end, 1) == b""
        assert time.monotonic() - start < 4 and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        os.close(read_end)


def test_with_proc_the_namespace_has_a_proc_of_its_own(init: str) -> None:
    out = subprocess.run([init, "--pidns", "--proc", "sh", "-c",
                          "echo $$; ls /proc | grep -c '^[0-9]*$'; exec readlink /proc/self"],
                         capture_output=True, text=True, check=True).stdout.split()
    # its pid as its /proc names it, which lists only the namespace's (init, sh, ls, grep)
    assert (out[0], out[2]) == ("2", "2") and int(out[1]) <= 4
    # the caller's /proc is as it was
    assert os.readlink("/proc/self") == str(os.getpid())


def test_adopts_the_one_child_its_program_leaves_and_passes_on_its_status(init: str) -> None:
    # The program starts a child as the init's (a subshell whose parent exits: an orphan of
    # the namespace) and exits 0: the init waits for that child, forwards signals to it, and
    # exits with its status; a program that fails ends it at once, with its status.
    script = ("sh -c 'trap \"exit 6\" TERM; echo adopted; while :; do sleep 0.05; done' & "
              "exit 0")
    proc = subprocess.Popen([init, "--pidns", "--proc", "--adopt", "sh", "-c", script],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "adopted\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 6
    assert subprocess.run([init, "--pidns", "--proc", "--adopt", "sh", "-c", "exit 3"]
                          ).returncode == 3


def test_in_runs_the_program_in_another_process_s_namespaces(init: str) -> None:
    nested = subprocess.Popen([init, "--pidns", "--proc", "sh", "-c", "echo up; exec sleep 30"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert nested.stdout.readline() == "up\n"
        inner = criu.worker_of(nested.pid)  # the namespace's init
        sleeper = criu.worker_of(inner)
        out = subprocess.run([init, "--in", str(sleeper), "sh", "-c",
                              "readlink /proc/self; cat /proc/1/comm"],
                             capture_output=True, text=True, check=True).stdout.split()
        # a pid of the namespace, in its /proc, where pid 1 is its init
        assert int(out[0]) > 2 and out[1] == "llfabric-init"
    finally:
        nested.kill()
        nested.wait()


@pytest.mark.parametrize("args", [["--proc", "true"], ["--adopt", "true"],
                                  ["--pidns", "--adopt", "true"], ["--in"],
                                  ["--in", "1", "--pidns", "true"], ["--bogus", "true"]])
def test_refuses_options_that_do_not_go_together(init: str, args: list[str]) -> None:
    result = subprocess.run([init, *args], capture_output=True, text=True)
    assert result.returncode == 2 and "usage" in result.stderr
