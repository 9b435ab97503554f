"""State that lives in modules rather than variables, carried from cell to cell.

Notebooks rely on it across cells: RNG states (`random`, numpy's global RNG, torch CPU and CUDA),
numpy's print options and pandas' options, the working directory, `os.environ` and `sys.path`
changes, torch's global switches (default dtype, deterministic algorithms, grad mode, matmul
precision, cuDNN flags), `warnings` filters, and matplotlib's rcParams, backend and inline figure
settings (`%config InlineBackend`). A fresh worker would otherwise start from its zygote's state:
the same random numbers in every session.

`capture` never imports anything: a part whose module this worker has not imported is carried
over unchanged from the state it restored. `restore` likewise applies a module's part only once
that module is imported: at once if it already is, else right after the cell first imports it.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import pickle
import random
import re
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, cast

# Variables the fabric sets per worker: the lease, not the notebook, decides the device.
_MANAGED_ENVIRON = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})


def capture(previous: Mapping[str, Any], base_environ: Mapping[str, str]) -> dict[str, Any]:
    """The ambient state now; `base_environ` is the environment this worker started with."""
    state: dict[str, Any] = dict(previous)
    state["cwd"] = os.getcwd()
    state["random"] = random.getstate()
    state["environ"] = _environ_changes(base_environ)
    state["path"] = list(sys.path)
    state["warnings"] = _with_pending([(action, message, _class_name(category), module, line)
                                       for action, message, category, module, line
                                       in _live_filters()
                                       if category.__module__ != "__main__"])  # not by name
    for module, (read, _) in _MODULE_PARTS.items():
        if (loaded := sys.modules.get(module)) is not None:
            state[module] = read(loaded)
    if (ip := _ipython()) is not None:
        state["inline"] = _read_inline(ip)
    return state


def restore(state: Mapping[str, Any]) -> list[str]:
    """Put the ambient state back; what could not be, said for the user."""
    problems: list[str] = []
    if "cwd" in state:
        try:
            os.chdir(state["cwd"])
        except OSError as exc:
            problems.append(f"cannot return to {state['cwd']}: {exc}")
    if "random" in state:
        random.setstate(state["random"])
    if "environ" in state:
        changed, removed = state["environ"]
        os.environ.update(changed)
        for key in removed:
            os.environ.pop(key, None)
    if "path" in state:
        saved = list(state["path"])
        sys.path[:] = saved + [p for p in sys.path if p not in saved]
    if "warnings" in state:
        _restore_warnings(state["warnings"])
    for module, (_, write) in _MODULE_PARTS.items():
        if module in state:
            _when_imported(module, lambda m, part=state[module], w=write: w(m, part))
    if "inline" in state and (ip := _ipython()) is not None:
        _write_inline(ip, state["inline"])
    return problems


def notebook_hooks() -> list[str]:
    """The import hooks the notebook defined (instances of its classes, or its functions, on
    `sys.meta_path` or `sys.path_hooks`): any import may run their code, which looks the
    session's globals up by name, and they live only in this process."""
    places = (("sys.meta_path", sys.meta_path), ("sys.path_hooks", sys.path_hooks))
    return [f"{where}: {getattr(hook, '__qualname__', None) or type(hook).__qualname__}"
            for where, hooks in places for hook in hooks
            if getattr(hook, "__module__", None) == "__main__"]


def reseed() -> None:
    """Fresh entropy for a session's first worker, so forks of one zygote differ."""
    seed = int.from_bytes(os.urandom(8), "little")
    random.seed(seed)
    _when_imported("numpy", lambda np: np.random.seed(seed % 2**32))
    _when_imported("torch", lambda torch: torch.manual_seed(seed))


def warm() -> None:
    """Import now what reseeding and restoring will import for the modules already imported
    (numpy's random module is lazy): a process forked from this one then does not pay for it
    at the start of its first cell."""
    if "numpy" in sys.modules:
        importlib.import_module("numpy.random")


def _environ_changes(base: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    changed = {k: v for k, v in os.environ.items()
               if base.get(k) != v and k not in _MANAGED_ENVIRON}
    removed = [k for k in base if k not in os.environ and k not in _MANAGED_ENVIRON]
    return changed, removed


def _class_name(category: type) -> str:
    return f"{category.__module__}:{category.__qualname__}"


# A `warnings` filter: action, message pattern, category, module pattern, line (0: any).
_LiveFilter = tuple[str, re.Pattern[str] | None, type[Warning], re.Pattern[str] | None, int]
# One as the state holds it, its category named ("module:qualname"): the class may be one of a
# module not imported yet where it is restored.
_Filter = tuple[str, re.Pattern[str] | None, str, re.Pattern[str] | None, int]

# Restored filters for a warning class of a module not imported yet, with their places among
# the filters: a capture before that import carries them where they were.
_pending_filters: list[tuple[int, _Filter]] = []


def _live_filters() -> list[_LiveFilter]:
    """`warnings.filters` itself, a list its stub calls a read-only Sequence (and whose
    categories `filterwarnings` checks are classes)."""
    return cast(list[_LiveFilter], warnings.filters)


def _filters_mutated() -> None:
    """Drop the per-module "already warned" caches, after `warnings.filters` changed."""
    # private to `warnings`, so its stub leaves it out
    warnings._filters_mutated()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]


def _restore_warnings(filters: list[_Filter]) -> None:
    """The filters in order; one for a warning class of a module not imported yet is added
    when that module is imported (first, as the newest filter)."""
    restored: list[_LiveFilter] = []
    _pending_filters.clear()
    for place, entry in enumerate(filters):
        action, message, name, module, line = entry
        owner, _, qualname = name.partition(":")
        if owner in sys.modules:
            restored.append((action, message, _resolve(sys.modules[owner], qualname), module,
                             line))
        else:
            _pending_filters.append((place, entry))
            _when_imported(owner, lambda m, e=entry: _add_filter(m, e))
    _live_filters()[:] = restored
    _filters_mutated()


def _add_filter(owner: Any, entry: _Filter) -> None:
    action, message, name, module, line = entry
    _pending_filters[:] = [p for p in _pending_filters if p[1] is not entry]
    _live_filters().insert(0, (action, message, _resolve(owner, name.partition(":")[2]),
                               module, line))
    _filters_mutated()


def _with_pending(filters: list[_Filter]) -> list[_Filter]:
    """`filters` with the restored ones still waiting for their module, in their places."""
    for place, entry in _pending_filters:
        filters.insert(place, entry)
    return filters


def _resolve(owner: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        owner = getattr(owner, part)
    return owner


# numpy

# Parts hold plain bytes, not arrays or tensors: unpickling the state must not import numpy or
# torch into a worker whose cell may never use them.

# Print options that hold functions (the notebook's, most often): not carried.
_NUMPY_PRINT_FUNCTIONS = frozenset({"formatter", "override_repr"})


def _read_numpy(np: Any) -> dict[str, Any]:
    """The global RNG's state and the print options (`np.set_printoptions`)."""
    kind, keys, *rest = np.random.get_state()
    printing = {k: v for k, v in np.get_printoptions().items()
                if k not in _NUMPY_PRINT_FUNCTIONS}
    return {"random": (kind, keys.tobytes(), *rest), "print": printing}


def _write_numpy(np: Any, part: tuple[Any, ...] | Mapping[str, Any]) -> None:
    if isinstance(part, tuple):  # as versions saved before print options were carried
        part = {"random": part}
    kind, keys, *rest = part["random"]
    np.random.set_state((kind, np.frombuffer(keys, dtype=np.uint32), *rest))
    if "print" in part:
        np.set_printoptions(**part["print"])


# pandas

def _read_pandas(pd: Any) -> dict[str, Any]:
    """The options the notebook changed (`pd.set_option`, `pd.options.display...`) that pickle;
    a deprecated one is read without its warning."""
    registered = getattr(getattr(pd, "_config", None), "config", None)
    changed: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, option in getattr(registered, "_registered_options", {}).items():
            value = pd.get_option(key)
            if value != option.defval and _pickles(value):
                changed[key] = value
    return changed


def _write_pandas(pd: Any, part: Mapping[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, value in part.items():
            with contextlib.suppress(KeyError, ValueError, TypeError):  # gone in this version
                pd.set_option(key, value)


def _pickles(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:  # whatever a value's __reduce__ raises
        return False
    return True


# torch

def _read_torch(torch: Any) -> dict[str, Any]:
    cudnn = torch.backends.cudnn
    part = {
        "rng": _tensor_bytes(torch.get_rng_state()),
        "dtype": str(torch.get_default_dtype()).removeprefix("torch."),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "grad": torch.is_grad_enabled(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn": (cudnn.enabled, cudnn.benchmark, cudnn.deterministic),
    }
    if torch.cuda.is_initialized():  # never initialise CUDA just to read its RNG
        part["cuda_rng"] = [_tensor_bytes(t) for t in torch.cuda.get_rng_state_all()]
    return part


def _tensor_bytes(tensor: Any) -> bytes:
    return tensor.numpy().tobytes()


def _byte_tensor(torch: Any, data: bytes) -> Any:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _write_torch(torch: Any, part: Mapping[str, Any]) -> None:
    torch.set_rng_state(_byte_tensor(torch, part["rng"]))
    torch.set_default_dtype(getattr(torch, part["dtype"]))
    # set only when it changes: torch's setter imports torch._inductor (hundreds of modules, a
    # second or more) on every call, which every fresh worker's first load would pay for nothing
    deterministic = (part["deterministic"], part["warn_only"])
    if deterministic != (torch.are_deterministic_algorithms_enabled(),
                         torch.is_deterministic_algorithms_warn_only_enabled()):
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    torch.set_grad_enabled(part["grad"])
    torch.set_float32_matmul_precision(part["matmul_precision"])
    cudnn = torch.backends.cudnn
    cudnn.enabled, cudnn.benchmark, cudnn.deterministic = part["cudnn"]
    if "cuda_rng" in part:
        states = [_byte_tensor(torch, s) for s in part["cuda_rng"]]
        if torch.cuda.is_initialized():
            _write_cuda_rng(torch, states)
        else:  # when a cell first uses CUDA, under its lease: asking now whether CUDA is there
            # would initialize it before the lease names the GPUs (CUDA_VISIBLE_DEVICES)
            torch.cuda._lazy_call(lambda: _write_cuda_rng(torch, states))


def _write_cuda_rng(torch: Any, states: list[Any]) -> None:
    """Each visible GPU's generator, as many as there are states for (set directly: torch's
    setters would queue themselves again while CUDA initializes)."""
    for generator, state in zip(torch.cuda.default_generators, states, strict=False):
        generator.set_state(state)


# matplotlib

def _read_matplotlib(mpl: Any) -> dict[str, Any]:
    """The backend (unresolved: resolving it would import one) and the rcParams that changed."""
    original = mpl.rcParamsOrig
    changed = {k: v for k, v in mpl.rcParams.items()
               if k != "backend" and (k not in original or original[k] != v)}
    return {"backend": mpl.rcParams._get_backend_or_none(), "rc": changed}


def _write_matplotlib(mpl: Any, part: Mapping[str, Any]) -> None:
    backend = part["backend"]
    if backend is not None and backend != mpl.rcParams._get_backend_or_none():
        if "inline" in backend and (ip := _ipython()) is not None:
            ip.enable_matplotlib("inline")  # also hooks figure display after each cell
        else:
            mpl.use(backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated keys warn once, when the user set them
        mpl.rcParams.update(part["rc"])


def _read_inline(ip: Any) -> dict[str, Any]:
    """`%config InlineBackend...`: held in the shell's config until the first plot creates the
    backend's settings object, and in that object after."""
    section = dict(ip.config.get("InlineBackend", {}))
    config_module = sys.modules.get("matplotlib_inline.config")
    if config_module is not None and config_module.InlineBackend.initialized():
        config = config_module.InlineBackend.instance()
        section |= {"figure_formats": set(config.figure_formats),
                    "print_figure_kwargs": dict(config.print_figure_kwargs),
                    "close_figures": config.close_figures}
    return section


def _write_inline(ip: Any, section: Mapping[str, Any]) -> None:
    ip.config.InlineBackend.update(section)  # for a backend created by a later plot
    config_module = sys.modules.get("matplotlib_inline.config")
    if config_module is not None and config_module.InlineBackend.initialized():
        config = config_module.InlineBackend.instance()
        for key, value in section.items():
            setattr(config, key, value)  # observed: figure formats re-register formatters


def _ipython() -> Any:
    """The running shell, if any; never imports IPython."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


_MODULE_PARTS: dict[str, tuple[Callable[[Any], Any], Callable[[Any, Any], None]]] = {
    "numpy": (_read_numpy, _write_numpy),
    "pandas": (_read_pandas, _write_pandas),
    "torch": (_read_torch, _write_torch),
    "matplotlib": (_read_matplotlib, _write_matplotlib),
}


# Restoring a module's part when it is imported later

def _when_imported(module: str, apply: Callable[[Any], None]) -> None:
    """Call `apply(module)` now if `module` is imported, else right after its first import."""
    if (loaded := sys.modules.get(module)) is not None:
        apply(loaded)
        return
    hook = next((f for f in sys.meta_path if isinstance(f, _ImportHook)), None)
    if hook is None:
        hook = _ImportHook()
        sys.meta_path.insert(0, hook)
    hook.pending.setdefault(module, []).append(apply)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of a pending module to run its restore after."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callable[[Any], None]]] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        applies = self.pending.pop(name, None)
        if applies is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RestoringLoader(spec.loader, applies)
        return spec


class _RestoringLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, applies: list[Callable[[Any], None]]) -> None:
        self.loader = loader
        self.applies = applies

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        for apply in self.applies:
            apply(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.loader, name)
