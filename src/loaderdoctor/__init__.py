"""loaderdoctor: find out why a PyTorch training job waits on its data, and prove the fix by measuring it."""

# First: Ctrl-C while the command line imports torch is held until the imports are done (see startup.py).
from loaderdoctor import startup as _startup  # noqa: F401
from loaderdoctor._version import __version__ as __version__
from loaderdoctor.commands.public import check, scale, tune  # each shows its progress (commands/public.py)
from loaderdoctor.commands.showing import show_report as show
from loaderdoctor.errors import LoaderDoctorError, LoaderDoctorWarning, LoaderGaveUp, StoppedByUser, UsageError
from loaderdoctor.guard import DataLoader, GuardedLoader, guard, is_patched, patch, patched, unpatch
from loaderdoctor.guard.events import GuardEvent
from loaderdoctor.loader.settings import Settings
from loaderdoctor.loader.threads import ThreadLoader
from loaderdoctor.loader.workload import Workload
from loaderdoctor.report import Finding, Report, Verification
from loaderdoctor.scale.report import ScaleReport
from loaderdoctor.trackers import log_to
from loaderdoctor.tune import TuneReport
from loaderdoctor.watch import WatchedLoader, watch

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
