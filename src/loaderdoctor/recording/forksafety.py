"""Which start method is safe for a loader: the fork hazards its recording saw (host/forkhazards.py), and what
keeps a safer start method (forkserver, spawn) from loading it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from loaderdoctor.errors import UsageError
from loaderdoctor.host.forkhazards import ForkHazards
from loaderdoctor.loader.pickling import pickled_bytes, worker_payload
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.recording.record import Recording


def _main_module_blocker() -> str | None:
    """Why a worker started with forkserver or spawn, which imports this program's __main__ again as
    multiprocessing does (a script by its path, `python -m module` by its name; a package's __main__.py never),
    would run the training a second time; None when it would not."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if main is None or path is None:
        return None
    if spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__")):
        return None
    if Path(path).stem == "ipython":
        return None
    try:
        tree = ast.parse(Path(path).read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    if any(_is_main_guard(node) for node in tree.body) or not any(_runs_something(node) for node in tree.body):
        return None
    return (
        f'the script {path} runs its code on import, without an `if __name__ == "__main__":` guard: a worker '
        "started with forkserver or spawn imports the script and would run it again; put the code that trains "
        "under that guard"
    )


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    names = [node.test.left, *node.test.comparators]
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
        isinstance(n, ast.Constant) and n.value == "__main__" for n in names
    )


_DECLARATIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _runs_something(node: ast.stmt) -> bool:
    """Whether a top-level statement does work when the module is imported (a call anywhere in it), beyond
    imports, definitions, docstrings and plain assignments of constants."""
    if isinstance(node, _DECLARATIONS):
        return False
    return any(isinstance(child, ast.Call) for child in ast.walk(node))


def _interactive_definitions(spec: LoaderSpec) -> str | None:
    """A class or function of the loader defined in an interactive __main__ (a notebook), which a worker
    started with forkserver or spawn cannot import; None when there is none."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__file__", None) is not None:
        return None
    for name, value in worker_payload(spec).items():
        if value is None:
            continue
        defined_in = getattr(value, "__module__", None) if callable(value) else type(value).__module__
        if defined_in == "__main__":
            what = getattr(value, "__qualname__", None) or type(value).__qualname__
            return (
                f"the loader's {name} ({what}) is defined in an interactive session (a notebook or the REPL): "
                "a worker started with forkserver or spawn cannot import it; define it in a module and import it"
            )
    return None


def forkserver_blocker(spec: LoaderSpec) -> str | None:
    """Why workers started with forkserver (or spawn) could not load this loader, in words that say what to
    change; None when they could."""
    try:
        pickled_bytes(spec, "forkserver")
    except UsageError as error:
        return f"{error.message}; {error.hint}"
    return _interactive_definitions(spec) or _main_module_blocker()


def recorded_hazards(rec: Recording) -> ForkHazards:
    """The fork hazards seen at any iterator's creation in a recording."""
    return ForkHazards.of(rec.iterators)


def safe_start_method(rec: Recording, settings: Settings) -> str | None:
    """The start method for workers of `settings` on the loader of `rec`: forkserver where forking was
    hazardous and forkserver can load this loader; otherwise the one in `settings` (fork is kept where no
    safer method can work: see rec.forkserver_blocker)."""
    forked = settings.num_workers > 0 and settings.backend == "process" and settings.effective_start_method == "fork"
    if forked and recorded_hazards(rec) and rec.forkserver_blocker is None:
        return "forkserver"
    return settings.start_method
