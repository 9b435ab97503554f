"""Whether a cell can be run again without effects outside the session's state.

A value that could not be saved is rebuilt by re-running the cells that made it; that is only
safe when those cells write no file, run no shell command, reach no network and ask the user
nothing. The check is static and conservative: a cell is refused on anything that might do so
(a call whose name writes, a module that reaches outside, a magic not known to be harmless, code
built at run time), and on source that does not parse.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from .static import analyze

# Calls (a function's or method's name) that write files, change the file system, or talk to
# another process or host.
WRITES = frozenset({
    "write", "writelines", "write_text", "write_bytes", "save", "savez", "savez_compressed",
    "savetxt", "savefig", "save_pretrained", "save_model", "save_weights", "to_csv", "to_parquet",
    "to_pickle", "to_json", "to_excel", "to_hdf", "to_feather", "to_sql", "to_netcdf", "dump",
    "mkdir", "makedirs", "remove", "unlink", "rmdir", "removedirs", "rmtree", "rename", "touch",
    "copyfile", "copytree", "copy2", "symlink", "chmod", "chown", "truncate", "system", "popen",
    "kill", "urlopen", "urlretrieve", "download", "upload", "send", "sendall", "connect",
    "request", "post", "load_dataset", "from_pretrained", "SummaryWriter", "add_scalar",
})
# Modules whose use reaches outside the process.
EXTERNAL = frozenset({
    "socket", "requests", "urllib", "urllib3", "http", "httpx", "aiohttp", "subprocess", "shutil",
    "ftplib", "smtplib", "webbrowser", "tempfile", "paramiko", "boto3", "wget", "gdown", "wandb",
    "mlflow", "sqlite3", "asyncio", "multiprocessing", "ctypes",
})
# Names whose call could do anything, or waits for the user.
OPAQUE = frozenset({"exec", "eval", "compile", "__import__", "input", "getpass", "breakpoint",
                    "get_ipython", "importlib"})  # get_ipython: but for the magics below
# Magics known to have no effect outside the session; the code argument of some is checked too.
MAGICS = {"time": True, "capture": True, "matplotlib": False, "config": False, "precision": False}
KEYWORDS = frozenset({"file", "download"})  # print(..., file=f); datasets' download=True


def unsafe(source: str, imports: Mapping[str, str] | None = None) -> str:
    """Why re-running `source` might have an effect outside the session's state, or "" when it
    cannot. `imports`: the session's module aliases (alias -> module)."""
    try:
        tree = ast.parse(analyze(source).source)
    except (SyntaxError, ValueError):
        return "does not parse"
    aliases = dict(imports or {})
    return _check(tree, aliases)


def _check(tree: ast.AST, aliases: dict[str, str]) -> str:
    magics = {id(name) for n in ast.walk(tree)  # get_ipython in get_ipython().x()
              if isinstance(n, ast.Call) and (name := _ipython_name(n.func))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                module = node.module if isinstance(node, ast.ImportFrom) else alias.name
                if module and module.partition(".")[0] in EXTERNAL:
                    return f"imports {module}"
                aliases[alias.asname or alias.name.partition(".")[0]] = module or ""
        elif isinstance(node, ast.Name):
            if node.id in OPAQUE and id(node) not in magics:
                return f"uses {node.id}"
            if aliases.get(node.id, "").partition(".")[0] in EXTERNAL or node.id in EXTERNAL:
                return f"uses {node.id}"
        elif isinstance(node, ast.Call) and (why := _call(node, aliases)):
            return why
    return ""


def _call(node: ast.Call, aliases: dict[str, str]) -> str:
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(
        func, ast.Attribute) else ""
    if _ipython_name(func) is not None:
        return _ipython_call(name, node, aliases)
    if name in WRITES:
        return f"calls {name}"
    if name == "open" and not _reading(node):
        return "opens a file for writing"
    if (keyword := next((k.arg for k in node.keywords if k.arg in KEYWORDS), None)) is not None:
        return f"passes {keyword}="
    return ""


def _ipython_name(func: ast.expr) -> ast.Name | None:
    """The `get_ipython` of a call `get_ipython().x(...)`; None for any other call."""
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) \
            and isinstance(func.value.func, ast.Name) and func.value.func.id == "get_ipython":
        return func.value.func
    return None


def _ipython_call(name: str, node: ast.Call, aliases: dict[str, str]) -> str:
    """A magic or `!` line, as IPython rewrote it."""
    if name not in ("run_line_magic", "run_cell_magic") or not node.args \
            or not isinstance(node.args[0], ast.Constant):
        return "runs a shell command" if name in ("system", "getoutput") else f"calls {name}"
    magic = str(node.args[0].value)
    if magic not in MAGICS:
        return f"runs %{magic}"
    if MAGICS[magic]:  # its code: the line's argument, or the cell's body
        body = node.args[-1] if name == "run_cell_magic" else node.args[1]
        if not isinstance(body, ast.Constant) or not isinstance(body.value, str):
            return f"runs %{magic} on code built at run time"
        try:
            return _check(ast.parse(analyze(body.value).source), aliases)
        except (SyntaxError, ValueError):
            return "does not parse"
    return ""


def _reading(node: ast.Call) -> bool:
    """An open() whose mode is a literal that only reads."""
    mode = node.args[1] if len(node.args) > 1 else next(
        (k.value for k in node.keywords if k.arg == "mode"), None)
    if mode is None:
        return True
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) \
        and not set(mode.value) & set("wax+")
