"""Resolve a TARGET ("demo", "scenario:NAME", "pkg.mod:fn", "path/to/file.py:fn") into the loaders to check."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from loaderdoctor import scenarios
from loaderdoctor.errors import UsageError
from loaderdoctor.loader.facts import length_or_none
from loaderdoctor.loader.workload import Workload
from loaderdoctor.plain.usercode import describe_exception, display_path, is_own_file, is_user_frame
from loaderdoctor.targets.datamodule import datamodule_base, datamodule_loaders
from loaderdoctor.targets.imports import find_function, import_file, import_module, is_path, split_target
from loaderdoctor.targets.timelimit import TimeLimit, TimeLimitPassed

_STACK_SHOWN = 6  # of the user's frames of a stuck target's stack
_ACCEPTED = (
    "a torch.utils.data.DataLoader, a dict of name -> DataLoader, a loaderdoctor.Workload, or a LightningDataModule"
)


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


def resolve(target: str, limit_s: float | None = None) -> ResolvedTarget:
    """The loaders that `target` names, or a UsageError saying what is wrong with it, where, and what to do;
    with `limit_s`, a UsageError naming where it is stuck when importing and calling it takes longer.

    Importing a user's module puts its directory (for a file) or the current directory (for a module name)
    first on sys.path, as `python file.py` and `python -m` do, so that worker processes can import it too.
    """
    target = target.strip()
    try:
        with TimeLimit(limit_s):
            return _resolve(target)
    except TimeLimitPassed as passed:
        raise _stuck(target, passed) from None


def _resolve(target: str) -> ResolvedTarget:
    if target == "demo":
        return _from_workload(target, scenarios.get("demo").build(), "scenario 'demo'")
    if target.startswith("scenario:"):
        name = target.removeprefix("scenario:")
        return _from_workload(target, scenarios.get(name).build(), f"scenario {name!r}")
    module_part, fn_name = split_target(target)
    fn = _target_function(module_part, fn_name)
    source = f"{fn_name}() in {module_part}"
    return _from_returned(target, _call(fn, source), source)


def _target_function(module_part: str, fn_name: str) -> Any:
    """The function a TARGET names, imported and checked to be callable without arguments, not called."""
    if is_path(module_part):
        module, label = import_file(module_part), module_part
    else:
        module, label = import_module(module_part), f"module {module_part!r}"
    return _callable_without_arguments(find_function(module, label, fn_name), label, module_part, fn_name)


def check_target(target: str, limit_s: float | None = None) -> None:
    """A UsageError unless `target` names a scenario or a function callable without arguments; the function is
    imported, not called (scale's ranks call it, each in its own process). With `limit_s`, as resolve()."""
    target = target.strip()
    if target == "demo":
        return
    if target.startswith("scenario:"):
        scenarios.get(target.removeprefix("scenario:"))
        return
    try:
        with TimeLimit(limit_s):
            _target_function(*split_target(target))
    except TimeLimitPassed as passed:
        raise _stuck(target, passed) from None


def _stuck(target: str, passed: TimeLimitPassed) -> UsageError:
    """The error for a target whose import or call did not return within its limit, with where it was stuck."""
    stack = passed.stack
    frame = stack.stuck_frame or (stack.frames[0] if stack.frames else None)
    at = f": stuck at {display_path(frame.file)}:{frame.line} in {frame.function}" if frame else ""
    users = []
    for called in stack.frames:  # innermost first, down to loaderdoctor's call of the target
        if is_own_file(called.file):
            break
        if is_user_frame(called):
            users.append(f"{display_path(called.file)}:{called.line} in {called.function}")
    calls = f"; its calls, innermost first: {', '.join(users[:_STACK_SHOWN])}" if len(users) > 1 else ""
    return UsageError(
        f"the target {target!r} did not return its loaders within {passed.limit_s:g} s{at}{calls}",
        hint="importing the module and calling the function must end within the budget (and its allowance): "
        "make them quicker (load data lazily, in the dataset), or give a larger --budget",
    )


# --- calling the function and reading what it returned -------------------------------------------------------


def _callable_without_arguments(fn: Any, label: str, module_part: str, fn_name: str) -> Any:
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
    if datamodule_base(returned) is not None:
        workload, named = datamodule_loaders(returned, source)
        return _from_workload(target, workload, source, named)
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
    if callable(getattr(returned, "train_dataloader", None)):
        return "return its train_dataloader() (or the LightningDataModule that makes the loaders)"
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
    samples = length_or_none(loader.dataset, any_error=True)
    selected = length_or_none(loader.sampler, any_error=True)
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


def resolve_any(target_or_loader: Any, caller: str, limit_s: float | None = None) -> ResolvedTarget:
    """What `caller` (check, tune) was given, resolved: a TARGET string (within `limit_s`, see resolve), a
    DataLoader, a dict of them, a Workload, or a LightningDataModule."""
    if isinstance(target_or_loader, str):
        return resolve(target_or_loader, limit_s)
    if isinstance(target_or_loader, Workload):
        return ResolvedTarget("<Workload>", target_or_loader, target_or_loader.loaders())
    if datamodule_base(target_or_loader) is not None:
        workload, named = datamodule_loaders(target_or_loader, "the LightningDataModule given")
        return _from_workload("<LightningDataModule>", workload, "the LightningDataModule given", named)
    if isinstance(target_or_loader, DataLoader):
        return ResolvedTarget("<DataLoader>", Workload(train=target_or_loader), {"loader": target_or_loader})
    if isinstance(target_or_loader, Mapping) and target_or_loader:
        loaders = dict(target_or_loader)
        for name, loader in loaders.items():
            if not isinstance(loader, DataLoader):
                raise UsageError(f"loader {name!r} is a {type(loader).__name__}, not a DataLoader")
        return ResolvedTarget("<loaders>", Workload(train=next(iter(loaders.values()))), loaders)
    raise UsageError(
        f"{caller}() takes a TARGET string, a DataLoader, a dict of DataLoaders, a Workload or a LightningDataModule, "
        f"not {type(target_or_loader).__name__}"
    )
