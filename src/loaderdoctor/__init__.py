"""loaderdoctor: find out why a PyTorch training job waits on its data, and prove the fix by measuring it.

In a process that multiprocessing started (a spawned DataLoader worker unpickling the guard's dataset, or the hook
that names the sample a worker holds) the public names are imported when first used (PEP 562): that process imports
the one module it needs, not the whole command line (0.7 s of a worker's start-up, measured here). Elsewhere they
are imported at once, as they always were (which also lends every report its display: commands/showing.py)."""

import sys
import types
from typing import TYPE_CHECKING, Any

# First: Ctrl-C while the command line imports torch is held until the imports are done (see startup.py).
from loaderdoctor import startup as _startup  # noqa: F401
from loaderdoctor._version import __version__ as __version__

if TYPE_CHECKING:
    from loaderdoctor.commands.public import check, scale, tune
    from loaderdoctor.commands.showing import show_report as show
    from loaderdoctor.errors import LoaderDoctorError, LoaderDoctorWarning, LoaderGaveUp, StoppedByUser, UsageError
    from loaderdoctor.guard import DataLoader, GuardedLoader, guard, is_patched, patch, patched, unpatch
    from loaderdoctor.guard.events import GuardEvent
    from loaderdoctor.integrations.trackers import log_to
    from loaderdoctor.loader.settings import Settings
    from loaderdoctor.loader.threads import ThreadLoader
    from loaderdoctor.loader.workload import Workload
    from loaderdoctor.report import Finding, Report, Verification
    from loaderdoctor.scale.report import ScaleReport
    from loaderdoctor.tune import TuneReport
    from loaderdoctor.watch import WatchedLoader, watch

# Each public name: the module it lives in, and its name there.
_PUBLIC = {
    "check": ("loaderdoctor.commands.public", "check"),
    "scale": ("loaderdoctor.commands.public", "scale"),
    "tune": ("loaderdoctor.commands.public", "tune"),
    "show": ("loaderdoctor.commands.showing", "show_report"),
    **{name: ("loaderdoctor.errors", name) for name in
       ("LoaderDoctorError", "LoaderDoctorWarning", "LoaderGaveUp", "StoppedByUser", "UsageError")},
    **{name: ("loaderdoctor.guard", name) for name in
       ("DataLoader", "GuardedLoader", "guard", "is_patched", "patch", "patched", "unpatch")},
    "GuardEvent": ("loaderdoctor.guard.events", "GuardEvent"),
    "Settings": ("loaderdoctor.loader.settings", "Settings"),
    "ThreadLoader": ("loaderdoctor.loader.threads", "ThreadLoader"),
    "Workload": ("loaderdoctor.loader.workload", "Workload"),
    **{name: ("loaderdoctor.report", name) for name in ("Finding", "Report", "Verification")},
    "ScaleReport": ("loaderdoctor.scale.report", "ScaleReport"),
    "log_to": ("loaderdoctor.integrations.trackers", "log_to"),
    "TuneReport": ("loaderdoctor.tune", "TuneReport"),
    "WatchedLoader": ("loaderdoctor.watch", "WatchedLoader"),
    "watch": ("loaderdoctor.watch", "watch"),
}  # fmt: skip


class _Package(types.ModuleType):
    """loaderdoctor's module: a public function named as a subpackage (check, guard, scale, tune, watch) stays the
    function when the subpackage is imported, as it was when this module imported them all first."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _PUBLIC and isinstance(value, types.ModuleType):
            return  # the import system's binding of a subpackage: the public name wins
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'loaderdoctor' has no attribute {name!r}")
    import importlib

    importlib.import_module("loaderdoctor.commands.showing")  # a report shows itself (its _repr_html_, __str__)
    module, attribute = _PUBLIC[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__all__ = [
    "DataLoader",
    "Finding",
    "GuardEvent",
    "GuardedLoader",
    "LoaderDoctorError",
    "LoaderDoctorWarning",
    "LoaderGaveUp",
    "Report",
    "ScaleReport",
    "Settings",
    "StoppedByUser",
    "ThreadLoader",
    "TuneReport",
    "UsageError",
    "Verification",
    "WatchedLoader",
    "Workload",
    "check",
    "guard",
    "is_patched",
    "log_to",
    "patch",
    "patched",
    "scale",
    "show",
    "tune",
    "unpatch",
    "watch",
]


def _started_by_multiprocessing() -> bool:
    """Whether multiprocessing started this process (its spawn or forkserver children say so on their command
    line), which imports loaderdoctor to unpickle one of its classes."""
    argv = getattr(sys, "orig_argv", sys.argv)
    return "--multiprocessing-fork" in argv or any(word.startswith("from multiprocessing.") for word in argv)


if not _started_by_multiprocessing():
    for _name in _PUBLIC:
        __getattr__(_name)
    del _name
