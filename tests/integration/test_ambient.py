"""Ambient state (RNGs, environment, paths, torch switches, warnings, matplotlib) carried from
cell to cell across fresh workers, as a kernel would keep it in one process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import execute, text

from fabric.client import Client
from fabric.pool import gpus
from fabric.snapshot import ambient

SEED = "import random\nimport numpy as np\nimport torch\nrandom.seed(1)\nnp.random.seed(2)\n" \
       "torch.manual_seed(3)\n"
DRAW = "print(random.random(), np.random.rand(), torch.rand(1).item())\n"


def _plain_python(*cells: str) -> str:
    """What the cells print when run one after another in one interpreter."""
    result = subprocess.run([sys.executable, "-c", "".join(cells)], capture_output=True,
                            text=True, check=True)
    return result.stdout


def test_seeded_draws_in_later_cells_match_one_process(client: Client, session: str) -> None:
    execute(client, session, SEED)
    first = text(execute(client, session, DRAW)[1])
    second = text(execute(client, session, DRAW)[1])
    assert first + second == _plain_python(SEED, DRAW, DRAW)
    assert first != second  # the state moved on, it was not re-seeded


def test_unseeded_sessions_forked_from_one_zygote_draw_differently(client: Client,
                                                                   tmp_path: Path) -> None:
    draws = []
    for name in ("unseeded-a", "unseeded-b"):
        client.call("open", session=name, cwd=str(tmp_path))
        execute(client, name, "import random\nimport numpy as np\nimport torch\n")
        draws.append(text(execute(client, name, DRAW)[1]).split())
    assert all(a != b for a, b in zip(*draws, strict=True))  # each generator, separately


def test_environment_and_import_path_carry(client: Client, session: str) -> None:
    execute(client, session, "import os, sys\nos.environ['LLF_MODE'] = 'train'\n"
                             "os.environ['LLF_GONE'] = 'x'\nsys.path.insert(0, '/opt/llf-extra')\n")
    execute(client, session, "del os.environ['LLF_GONE']\n")
    _, outputs = execute(client, session, "print(os.environ.get('LLF_MODE'), "
                                          "os.environ.get('LLF_GONE'), sys.path[0])\n")
    assert text(outputs) == "train None /opt/llf-extra\n"


def test_a_module_found_through_a_path_the_notebook_added_comes_back(client: Client,
                                                                    session: str,
                                                                    tmp_path: Path) -> None:
    # the next worker restores sys.path before it imports the session's modules again
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "helpers_of_the_notebook.py").write_text("ANSWER = 42\n")
    execute(client, session, "import sys\nsys.path.append('src')\n")
    execute(client, session, "import helpers_of_the_notebook as h\n")
    reply, outputs = execute(client, session, "print(h.ANSWER)\n")
    assert reply["status"] == "ok" and text(outputs) == "42\n", outputs


def test_environment_changes_are_relative_to_the_workers_start(monkeypatch) -> None:
    monkeypatch.setenv("LLF_KEPT", "1")
    monkeypatch.setenv("LLF_NEW", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.delenv("LLF_DROPPED", raising=False)
    base = {"LLF_KEPT": "1", "LLF_DROPPED": "0"}
    changed, removed = ambient.capture({}, base)["environ"]
    assert changed.get("LLF_NEW") == "2"
    assert "LLF_KEPT" not in changed
    assert "CUDA_VISIBLE_DEVICES" not in changed  # the lease owns the device
    assert removed == ["LLF_DROPPED"]


def test_torch_switches_carry(client: Client, session: str) -> None:
    execute(client, session, "import torch\ntorch.set_default_dtype(torch.float64)\n"
                             "torch.use_deterministic_algorithms(True)\n"
                             "torch.set_grad_enabled(False)\n"
                             "torch.set_float32_matmul_precision('medium')\n")
    _, outputs = execute(client, session, "print(torch.get_default_dtype(), "
                                          "torch.are_deterministic_algorithms_enabled(), "
                                          "torch.is_grad_enabled(), "
                                          "torch.get_float32_matmul_precision())\n")
    assert text(outputs) == "torch.float64 True False medium\n"


def test_warning_filters_carry(client: Client, session: str) -> None:
    execute(client, session, "import warnings\nwarnings.simplefilter('error', UserWarning)\n")
    reply, outputs = execute(client, session, "warnings.warn('promoted')\n")
    assert reply["status"] == "error"
    assert "UserWarning: promoted" in text(outputs)


def test_matplotlib_settings_and_inline_format_carry(client: Client, session: str) -> None:
    execute(client, session, "import matplotlib\nimport matplotlib.pyplot as plt\n"
                             "matplotlib.rcParams['lines.linewidth'] = 7.5\n"
                             "%config InlineBackend.figure_formats = ['svg']\n")
    _, outputs = execute(client, session, "print(matplotlib.rcParams['lines.linewidth'])\n"
                                          "plt.plot([1, 2])\nplt.show()\n")
    assert text(outputs).startswith("7.5\n")
    images = [o for o in outputs if o["output_type"] == "display_data"]
    assert images and "image/svg+xml" in images[0]["data"]


def test_numpy_print_options_and_pandas_options_carry(client: Client, session: str) -> None:
    setup = ("import numpy as np\nimport pandas as pd\nnp.set_printoptions(precision=3, "
             "suppress=True)\npd.options.display.max_columns = 7\n"
             "pd.set_option('display.float_format', '{:.1f}'.format)\n")
    show = "print(np.array([1/3, 1e-9]), pd.get_option('display.max_columns'))\n" \
           "print(pd.Series([1/3]).to_string())\n"
    execute(client, session, setup)
    _, outputs = execute(client, session, show)
    assert text(outputs) == _plain_python(setup, show) == "[0.333 0.   ] 7\n0   0.3\n"


def test_state_of_a_module_is_restored_when_it_is_imported_later(tmp_path: Path) -> None:
    """A worker that imports torch only in its cell still continues the session's RNG, and
    carries torch's part unchanged while it has not imported it."""
    state_file = tmp_path / "ambient.pickle"
    expected = subprocess.run([sys.executable, "-c", (
        "import pickle, sys, torch\n"
        "from fabric.snapshot import ambient\n"
        "torch.manual_seed(11)\ntorch.rand(3)\n"
        f"pickle.dump(ambient.capture({{}}, {{}}), open({str(state_file)!r}, 'wb'))\n"
        "print(torch.rand(2).tolist())\n")], capture_output=True, text=True, check=True).stdout
    restored = subprocess.run([sys.executable, "-c", (
        "import pickle, sys\n"
        "from fabric.snapshot import ambient\n"
        f"state = pickle.load(open({str(state_file)!r}, 'rb'))\n"
        "ambient.reseed()\nambient.restore(state)\n"
        "assert 'torch' not in sys.modules\n"
        "assert ambient.capture(state, {})['torch'] is state['torch']  # carried, unread\n"
        "import torch\nprint(torch.rand(2).tolist())\n")], capture_output=True, text=True)
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout == expected


def test_restoring_torch_s_default_switches_imports_nothing_more() -> None:
    """A fresh worker's first load restores the switches: left at their defaults, that must not
    import torch's compiler stack (torch._inductor), a second or more on every worker."""
    restored = subprocess.run([sys.executable, "-c", (
        "import sys, torch\n"
        "from fabric.snapshot import ambient\n"
        "state = ambient.capture({}, {})\n"
        "ambient.restore(state)\n"
        "print('torch._inductor' in sys.modules)\n")], capture_output=True, text=True)
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout == "False\n"


CUDA_CAPTURE = """\
import os, pickle, sys, torch
from fabric.snapshot import ambient
torch.cuda.manual_seed(7)
torch.randn(1, device="cuda")  # a draw, so the state is not the seed's
pickle.dump((ambient.capture({}, dict(os.environ)), torch.cuda.get_rng_state()),
            open(sys.argv[1], "wb"))
"""

CUDA_RESTORE = """\
import pickle, sys, torch
from fabric.snapshot import ambient
state, expected = pickle.load(open(sys.argv[1], "rb"))
ambient.restore(state)
print(torch.cuda.is_initialized())  # before the lease: CUDA must not know its GPUs yet
torch.empty(1, device="cuda")
print(torch.equal(torch.cuda.get_rng_state(), expected))
"""


@pytest.mark.gpu
def test_the_cuda_rng_comes_back_only_when_a_cell_first_uses_cuda(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.version.cuda is None or not gpus.discover():
        pytest.skip("no NVIDIA GPU and CUDA build of torch")
    saved = tmp_path / "ambient.pickle"
    subprocess.run([sys.executable, "-c", CUDA_CAPTURE, str(saved)], check=True)
    restored = subprocess.run([sys.executable, "-c", CUDA_RESTORE, str(saved)],
                              capture_output=True, text=True, check=True)
    assert restored.stdout == "False\nTrue\n"
