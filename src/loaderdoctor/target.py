"""Resolve a TARGET ("demo", "scenario:NAME", "pkg.mod:fn", "path/to/file.py:fn") into the loaders to check."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from loaderdoctor import scenarios
from loaderdoctor.errors import UsageError
from loaderdoctor.usercode import describe_exception, display_path, syntax_error_site, user_site
from loaderdoctor.workload import Workload

_FORMS = "expected MODULE:FUNCTION or path/to/file.py:FUNCTION"
_ACCEPTED = "a torch.utils.data.DataLoader, a dict of name -> DataLoader, or a loaderdoctor.Workload"
_EXAMPLE = "e.g. mypkg.data:make_loaders or train.py:make_loaders, a function taking no arguments"
_MAX_LISTED = 8


@dataclass
class ResolvedTarget:
    """A resolved TARGET: the loaders to check by name, and the Workload that owns them.

    `loaders` is what to check (every loader a user's function returned, under its name); `workload` carries
    the training step (step_ms, step) and what to release afterwards. close() releases it, once.
    """

    target: str
    workload: Workload
    loaders: dict[str, DataLoader]
    _closed: bool = field(default=False, init=False, repr=False)

    def close(self) -> None:
        """Release what building the workload started (the workload's on_close), at most once."""
        if not self._closed:
            self._closed = True
            self.workload.close()

    def __enter__(self) -> ResolvedTarget:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def resolve(target: str) -> ResolvedTarget:
    """The loaders that `target` names, or a UsageError saying what is wrong with it, where, and what to do.

    Importing a user's module puts its directory (for a file) or the current directory (for a module name)
    first on sys.path, as `python file.py` and `python -m` do, so that worker processes can import it too.
    """
    target = target.strip()
    if target == "demo":
        return _from_workload(target, scenarios.get("demo").build(), "scenario 'demo'")
    if target.startswith("scenario:"):
        name = target.removeprefix("scenario:")
        return _from_workload(target, scenarios.get(name).build(), f"scenario {name!r}")
    module_part, fn_name = _split(target)
    if _is_path(module_part):
        module, label = _import_file(module_part), module_part
    else:
        module = _import_module(module_part)
        label = f"module {module_part!r}"
    fn = _find_function(module, label, module_part, fn_name)
    source = f"{fn_name}() in {module_part}"
    return _from_returned(target, _call(fn, source), source)


# --- the TARGET string ---------------------------------------------------------------------------------------


def _split(target: str) -> tuple[str, str]:
    module_part, colon, fn_name = target.rpartition(":")
    module_part, fn_name = module_part.strip(), fn_name.strip()
    if not colon or not module_part or not fn_name:
        raise UsageError(f"bad target {target!r}: {_FORMS}", hint=_split_hint(target, colon, module_part))
    if not fn_name.isidentifier():
        raise UsageError(
            f"bad target {target!r}: {fn_name!r} is not a function name",
            hint="after the colon, name a function defined at the top level of the module, without "
            "parentheses or arguments: MODULE:FUNCTION",
        )
    return module_part, fn_name


def _split_hint(target: str, colon: str, module_part: str) -> str:
    if not target:
        return f"give a target, {_EXAMPLE}, or scenario:NAME for a built-in scenario"
    if not colon:
        if target in scenarios.names():
            return f"to run the built-in scenario, write scenario:{target}"
        if _is_path(target):
            return f"name the function in it that returns the loaders: {target}:FUNCTION"
        return f"{_EXAMPLE}, or scenario:NAME for a built-in scenario"
    if not module_part:
        return f"name the module or the .py file before the colon, {_EXAMPLE}"
    return f"name the function that returns the loaders after the colon: {module_part}:FUNCTION"


def _is_path(module_part: str) -> bool:
    separators = [sep for sep in (os.sep, os.altsep, "/") if sep]
    return module_part.endswith(".py") or any(sep in module_part for sep in separators)


# --- importing the user's module -----------------------------------------------------------------------------


def _import_module(name: str) -> ModuleType:
    if name.startswith(".") or "" in name.split("."):
        raise UsageError(
            f"{name!r} is not a module name",
            hint="give an absolute dotted name such as mypkg.data, or a file path such as src/data.py",
        )
    _ensure_cwd_on_path()
    importlib.invalidate_caches()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise _module_not_found(name, exc.name) from None
        raise _import_error(f"module {name!r}", exc) from exc
    except (Exception, SystemExit) as exc:
        raise _import_error(f"module {name!r}", exc) from exc


def _ensure_cwd_on_path() -> None:
    # `python -m` puts the current directory first on sys.path; a console script does not.
    cwd = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == cwd for entry in sys.path):
        sys.path.insert(0, cwd)


def _module_not_found(name: str, missing: str) -> UsageError:
    detail = "" if missing == name else f" (there is no module {missing!r})"
    pythonpath = os.environ.get("PYTHONPATH") or "unset"
    return UsageError(
        f"no module named {name!r}{detail} in the current directory ({os.getcwd()}), on PYTHONPATH "
        f"({pythonpath}) or among the installed packages",
        hint=f"run loaderdoctor from the directory that contains {missing.split('.')[0]}, add that directory "
        f"to PYTHONPATH, or give a file path instead: path/to/{name.split('.')[-1]}.py:FUNCTION",
    )


def _import_file(path_text: str) -> ModuleType:
    path = Path(path_text).expanduser()
    if not path.exists():
        raise UsageError(
            f"no file {path_text!r} (relative to the current directory {os.getcwd()})",
            hint="check the path; a relative path is taken from the directory loaderdoctor runs in",
        )
    if path.is_dir():
        raise UsageError(
            f"{path_text!r} is a directory, not a Python file",
            hint="give the .py file that defines the function: path/to/file.py:FUNCTION",
        )
    if path.suffix != ".py":
        raise UsageError(
            f"{path_text!r} is not a .py file",
            hint="give a Python source file (path/to/file.py:FUNCTION) or a module name (pkg.mod:FUNCTION)",
        )
    path = path.resolve()
    name = path.stem
    if "." in name:
        raise UsageError(
            f"cannot import {path_text!r}: the dot in {name!r} would make Python read it as a package",
            hint=f"rename the file, e.g. to {name.replace('.', '_')}.py",
        )
    existing = sys.modules.get(name)
    if existing is not None and _is_file_of(existing, path):
        return existing  # imported before: running its top-level code twice would make its classes differ
    taken_by = _name_taken_by(name, path)
    if taken_by is not None:
        raise _name_taken(path_text, name, taken_by)
    directory = str(path.parent)
    if not sys.path or sys.path[0] != directory:
        sys.path.insert(0, directory)
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(name)
    except (Exception, SystemExit) as exc:
        raise _import_error(path_text, exc) from exc
    if not _is_file_of(module, path):
        raise _name_taken(path_text, name, _origin(module))
    return module


def _name_taken_by(name: str, path: Path) -> str | None:
    """Where another module called `name` (imported, or importable now) comes from, else None."""
    existing = sys.modules.get(name)
    if existing is not None:
        return None if _is_file_of(existing, path) else _origin(existing)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    # a namespace package (no origin) never wins over a module file, so it does not count
    if spec is None or spec.origin is None or _same_path(spec.origin, path):
        return None
    return spec.origin if spec.has_location else f"Python's {spec.origin} module {name!r}"


def _name_taken(path_text: str, name: str, taken_by: str) -> UsageError:
    return UsageError(
        f"cannot import {path_text!r} as the module {name!r}: that name is taken by {taken_by}",
        hint=f"rename the file (e.g. to {name}_loaders.py): loaderdoctor imports it by its name so that "
        "worker processes can import the classes defined in it",
    )


def _origin(module: ModuleType) -> str:
    filename = getattr(module, "__file__", None)
    return filename if filename else f"Python's built-in module {module.__name__!r}"


def _is_file_of(module: ModuleType, path: Path) -> bool:
    filename = getattr(module, "__file__", None)
    return bool(filename) and _same_path(filename, path)


def _same_path(filename: str, path: Path) -> bool:
    try:
        return os.path.samefile(filename, path)
    except OSError:
        return False


def _import_error(label: str, exc: BaseException) -> UsageError:
    """A UsageError for `exc`, raised while importing the user's module called `label`."""
    at = user_site(exc)
    where = f" (at {at})" if at else ""
    if isinstance(exc, SyntaxError):
        site = syntax_error_site(exc)
        return UsageError(
            f"syntax error in {site}: {exc.msg}",
            hint=f"fix it; `python -m py_compile {site.rpartition(':')[0]}` checks a file without running it",
        )
    if isinstance(exc, ModuleNotFoundError):
        missing = exc.name or str(exc)
        return UsageError(
            f"importing {label} failed: it needs the module {missing!r}, which is not installed "
            f"(imported at {at or 'an unknown place'})",
            hint=f"install the package that provides {missing.split('.')[0]!r} into the Python environment "
            f"loaderdoctor runs in ({sys.executable}), or run loaderdoctor from your training environment",
        )
    if isinstance(exc, ImportError):
        if "relative import" in str(exc):
            hint = "the file is part of a package: give it as pkg.module:FUNCTION from the project's root"
        else:
            hint = "fix that import in your module, or install the version of the package it expects"
        return UsageError(f"importing {label} failed: {exc}{where}", hint=hint)
    if isinstance(exc, SystemExit):
        return UsageError(
            f"importing {label} called sys.exit({exc.code!r}){where}",
            hint='importing a module runs its top-level code: put the script part under `if __name__ == "__main__":`',
        )
    return UsageError(
        f"importing {label} raised {describe_exception(exc)}",
        hint="importing a module runs its top-level code: fix the error, or move the failing code into a function",
    )


# --- the function and what it returns ------------------------------------------------------------------------


def _find_function(module: ModuleType, label: str, module_part: str, fn_name: str) -> Any:
    try:
        fn = getattr(module, fn_name)
    except AttributeError:
        raise _missing_function(module, label, fn_name) from None
    if not callable(fn):
        raise UsageError(
            f"{module_part}:{fn_name} is {_describe_value(fn)}, not a function",
            hint=f"name a function that returns it, e.g. add `def make_loaders(): return {fn_name}` to "
            f"{label} and use {module_part}:make_loaders",
        )
    required = _required_parameters(fn)
    if required:
        raise UsageError(
            f"{fn_name}() must take no arguments, but it requires {', '.join(required)}{_defined_at(fn)}",
            hint="loaderdoctor calls it with no arguments: give those parameters defaults, or add a function "
            "that calls it with the values you train with",
        )
    return fn


def _missing_function(module: ModuleType, label: str, fn_name: str) -> UsageError:
    public = {name: value for name, value in vars(module).items() if not name.startswith("_")}
    callables = sorted(name for name, value in public.items() if callable(value))
    defined_here = [name for name in callables if getattr(public[name], "__module__", None) == module.__name__]
    close = difflib.get_close_matches(fn_name, callables, n=3, cutoff=0.6)
    candidates = close + [name for name in defined_here if name not in close]
    listed = candidates[:_MAX_LISTED]
    filename = getattr(module, "__file__", None)
    where = label if label.endswith(".py") or not filename else f"{label} ({display_path(filename)})"
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    if listed:
        more = ", ..." if len(candidates) > len(listed) else ""
        hint = f"{suggestion}functions defined there: {', '.join(listed)}{more}"
    else:
        hint = "it defines no public functions: add one that takes no arguments and returns the loaders"
    return UsageError(f"{where} has no function {fn_name!r}", hint=hint)


def _required_parameters(fn: Any) -> list[str]:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature: calling them tells
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in parameters if p.default is inspect.Parameter.empty and p.kind not in variadic]


def _defined_at(fn: Any) -> str:
    code = getattr(fn, "__code__", None)
    return f" (defined at {display_path(code.co_filename)}:{code.co_firstlineno})" if code else ""


def _call(fn: Any, source: str) -> Any:
    try:
        return fn()
    except (Exception, SystemExit) as exc:
        if isinstance(exc, SystemExit):
            hint = "it called sys.exit() (argparse does when it parses loaderdoctor's own command line): "
            hint += "build the loaders without parsing sys.argv"
        else:
            hint = "fix the error; calling the function yourself in Python shows the full traceback"
        raise UsageError(f"{source} raised {describe_exception(exc)}", hint=hint) from exc


def _from_returned(target: str, returned: Any, source: str) -> ResolvedTarget:
    if isinstance(returned, Workload):
        return _from_workload(target, returned, source)
    if isinstance(returned, DataLoader):
        loaders = {"loader": returned}
    elif isinstance(returned, Mapping):
        loaders = _loaders_from_mapping(returned, source)
    else:
        raise UsageError(
            f"{source} returned {_describe_value(returned)}; expected {_ACCEPTED}", hint=_return_hint(returned)
        )
    train = loaders.get("train", next(iter(loaders.values())))
    val = loaders.get("val")
    workload = Workload(train=train, val=val if val is not train else None)
    return _from_workload(target, workload, source, loaders)


def _loaders_from_mapping(returned: Mapping[Any, Any], source: str) -> dict[str, DataLoader]:
    if not returned:
        raise UsageError(
            f"{source} returned an empty dict",
            hint='put the loaders to check in it: {"train": train_loader, "val": val_loader}',
        )
    for key, value in returned.items():
        if not isinstance(key, str) or not key:
            raise UsageError(
                f"{source} returned a dict with the key {key!r}; the keys must be non-empty strings that "
                "name the loaders",
                hint='e.g. {"train": train_loader, "val": val_loader}',
            )
        if not isinstance(value, DataLoader):
            raise UsageError(
                f"{source} returned a dict whose value for {key!r} is {_describe_value(value)}, "
                "not a torch.utils.data.DataLoader",
                hint=f"map each name to a DataLoader, or leave {key!r} out",
            )
    return dict(returned)


def _describe_value(value: Any) -> str:
    if value is None:
        return "None"
    kind = type(value)
    type_name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(value, tuple | list):
        contents = " DataLoaders" if value and all(isinstance(v, DataLoader) for v in value) else " items"
        return f"a {type_name} of {len(value)}{contents}"
    if isinstance(value, Dataset):
        return f"a dataset ({type_name})"
    return f"an object of type {type_name}"


def _return_hint(returned: Any) -> str:
    if returned is None:
        return "the function returns nothing: end it with `return loader`"
    if isinstance(returned, tuple | list) and returned and all(isinstance(v, DataLoader) for v in returned):
        return 'return a dict to name them: {"train": train_loader, "val": val_loader}'
    if isinstance(returned, Dataset):
        return "wrap it in the loader you train with: return DataLoader(dataset, batch_size=...)"
    return "return the DataLoader your training loop iterates over"


def _from_workload(
    target: str, workload: Workload, source: str, loaders: dict[str, DataLoader] | None = None
) -> ResolvedTarget:
    loaders = workload.loaders() if loaders is None else loaders
    try:
        for name, loader in loaders.items():
            _check_has_batches(name, loader, source)
    except BaseException:
        workload.close()
        raise
    return ResolvedTarget(target=target, workload=workload, loaders=loaders)


def _check_has_batches(name: str, loader: DataLoader, source: str) -> None:
    if isinstance(loader.dataset, IterableDataset):
        return  # its length is unknown until it is iterated: it is measured as it goes
    try:
        batches = len(loader)
    except TypeError:
        return  # a sampler or dataset without a length
    except Exception as exc:
        raise UsageError(
            f"len() of the loader {name!r} from {source} raised {describe_exception(exc)}",
            hint="a map-style dataset's __len__ must return its number of samples",
        ) from exc
    if batches > 0:
        return
    why, hint = _why_no_batches(loader)
    raise UsageError(f"the loader {name!r} from {source} has no batches ({why})", hint=hint)


def _why_no_batches(loader: DataLoader) -> tuple[str, str]:
    samples = _length_or_none(loader.dataset)
    selected = _length_or_none(loader.sampler)
    if samples == 0:
        return "its dataset is empty", "check what builds the dataset: the data path, the split, the filters"
    if selected == 0:
        return (
            f"its sampler {type(loader.sampler).__name__} selects none of the {samples} samples",
            "check the sampler's indices or num_samples",
        )
    if loader.batch_size is not None and loader.drop_last:
        of = f"{samples} samples" if selected in (None, samples) else f"{selected} of {samples} samples"
        return (
            f"dataset of {of}, batch_size {loader.batch_size}, drop_last=True",
            f"use drop_last=False, or a batch_size of at most {selected if selected is not None else samples}",
        )
    return (
        f"its batch sampler {type(loader.batch_sampler).__name__} yields no batches",
        "check the batch sampler",
    )


def _length_or_none(sized: Any) -> int | None:
    try:
        return len(sized)
    except Exception:
        return None


def resolve_any(target_or_loader: Any, caller: str) -> ResolvedTarget:
    """What `caller` (check, tune) was given, resolved: a TARGET string, a DataLoader, a dict of them, or a
    Workload."""
    if isinstance(target_or_loader, str):
        return resolve(target_or_loader)
    if isinstance(target_or_loader, Workload):
        return ResolvedTarget("<Workload>", target_or_loader, target_or_loader.loaders())
    if isinstance(target_or_loader, DataLoader):
        return ResolvedTarget("<DataLoader>", Workload(train=target_or_loader), {"loader": target_or_loader})
    if isinstance(target_or_loader, Mapping) and target_or_loader:
        loaders = dict(target_or_loader)
        for name, loader in loaders.items():
            if not isinstance(loader, DataLoader):
                raise UsageError(f"loader {name!r} is a {type(loader).__name__}, not a DataLoader")
        return ResolvedTarget("<loaders>", Workload(train=next(iter(loaders.values()))), loaders)
    raise UsageError(
        f"{caller}() takes a TARGET string, a DataLoader, a dict of DataLoaders or a Workload, "
        f"not {type(target_or_loader).__name__}"
    )
