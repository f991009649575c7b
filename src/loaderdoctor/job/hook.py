"""The startup hook that every Python process of a `loaderdoctor run` job runs (from the job folder's
sitecustomize.py, loaded by its path: this module imports nothing but the standard library, and no process pays
for torch or loaderdoctor here): it arms a process to watch its own loaders once it makes one, and never raises.

What it does, as coverage.py's process_startup() does for COVERAGE_PROCESS_START:
- nothing at all unless JOB_ENV names the folder of the sitecustomize that loaded it, a folder of this user's
  that nobody else may write (a PYTHONPATH left over, or another user's folder, arms nothing);
- a process launched as a rank (RANK or LOCAL_RANK set, not a multiprocessing helper, its parent not a process
  of the job already: a rank's own workers and helpers inherit RANK) registers itself at once, so that a rank
  that dies before it writes is named;
- torch's DataLoader.__init__ is wrapped when torch.utils.data.dataloader is first imported; the first DataLoader
  the process makes registers the process and hands it to loaderdoctor.job.process, which watches its
  loaders from then on (a DataLoader worker makes none: it imports nothing more, and writes nothing);
- the sitecustomize that PYTHONPATH hid (a user's, a distribution's) runs after it, as Python would have run it.
"""

# Only what Python's startup has imported already, or costs next to nothing: this runs in every process of the
# job, DataLoader workers included (typing, threading and importlib.util would add some 15 ms to each).
import _thread
import importlib.machinery
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# The job's folder: set by `loaderdoctor run` while its script runs (see job/joining.py).
JOB_ENV = "LOADERDOCTOR_JOB"
# What a process of the job writes there: PROCESS_FILE when it starts to count (a rank, or it made a loader), the
# loaders it watched in RESULT_FILE at its end.
PROCESS_FILE = "process{pid}.started"
RESULT_FILE = "process{pid}.json"
SO_FAR_RESULT_FILE = "so-far{pid}.json"  # what it measured so far, as its epochs ended (job/process.py)
# The variables a launcher gives each rank (torchrun, accelerate, Lightning's LOCAL_RANK for the ranks it starts).
RANK_VARIABLES = ("RANK", "LOCAL_RANK")
_DATALOADER_MODULE = "torch.utils.data.dataloader"
_ARGV_CHARS = 200

_folder: str | None = None  # the job's folder, once this process is armed
_registered = False
_watching: "Any" = None  # what loaderdoctor.job.process.watch_here returned (its loaders' hooks)
_failed = False
_starting = False  # while loaderdoctor's watch is imported and installed
_lock = _thread.RLock()
_OWN_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


def run_at_startup(here: str) -> None:
    """Arm this process for the job whose sitecustomize in `here` is running, when this process belongs to it;
    then run the sitecustomize that `here` hid. Never raises: a failure is one line on stderr."""
    try:
        if os.environ.get(JOB_ENV) and _same(os.environ[JOB_ENV], here) and _ours(here):
            _arm(here)
    except Exception as error:
        _say(f"loaderdoctor: this process is not watched ({type(error).__name__}: {error})")
    _run_hidden_sitecustomize(here)


def disarm() -> None:
    """This process watches nothing for its job (it runs a `loaderdoctor run` of its own)."""
    global _folder
    _folder = None


def register(rank: int | None, error: str | None = None) -> None:
    """Write (again) that this process belongs to the job: its pid, its rank when known, its command line, and
    why it could not be watched if it could not."""
    import json  # here: a process that never registers never imports them
    import socket

    folder = _folder
    if folder is None:
        return
    fields = {"pid": os.getpid(), "rank": rank, "host": socket.gethostname(),
              "argv": " ".join(getattr(sys, "orig_argv", sys.argv))[:_ARGV_CHARS], "error": error}  # fmt: skip
    out = os.path.join(folder, PROCESS_FILE.format(pid=os.getpid()))
    try:
        with open(out + ".tmp", "w") as file:
            json.dump(fields, file)
        os.replace(out + ".tmp", out)
    except OSError as failure:
        _say(f"loaderdoctor: process {os.getpid()} could not register with its job: {failure}")


def registered(folder: "Any") -> "dict[int, dict[str, Any]]":
    """The processes that registered with the job of `folder`: pid -> what they said of themselves (a file that
    cannot be read is left out)."""
    import json

    found = {}
    for path in folder.glob(PROCESS_FILE.format(pid="*")):
        try:
            fields = json.loads(path.read_text())
            found[int(fields["pid"])] = fields
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def rank_from_environment() -> int | None:
    """The rank a launcher gave this process in its environment (RANK, else LOCAL_RANK), or None."""
    for variable in RANK_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value)
    return None


def _arm(here: str) -> None:
    global _folder, _registered
    _folder = here
    rank = rank_from_environment()
    parent_counts = os.path.exists(os.path.join(here, PROCESS_FILE.format(pid=os.getppid())))
    if rank is not None and not _multiprocessing_helper() and not parent_counts:
        _registered = True
        register(rank)
    if _DATALOADER_MODULE in sys.modules:  # imported already (by a user's sitecustomize, say)
        _wrap(sys.modules[_DATALOADER_MODULE])
    else:
        sys.meta_path.insert(0, _DataLoaderFinder())


def _multiprocessing_helper() -> bool:
    """Whether multiprocessing started this process (a spawn or forkserver worker, the forkserver, the resource
    tracker): it is a rank only if it makes a loader (mp.spawn's ranks do, DataLoader workers do not)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    return "--multiprocessing-fork" in argv or any(word.startswith("from multiprocessing.") for word in argv)


class _DataLoaderFinder:
    """Finds torch.utils.data.dataloader as the finders after it do, and wraps DataLoader once it is executed."""

    def find_spec(self, name: str, path: "Any" = None, target: "Any" = None) -> "Any":
        if name != _DATALOADER_MODULE:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        try:
            from importlib.util import find_spec

            spec = find_spec(name)
        except Exception:  # the finders after this one tell the import so themselves
            return None
        loader = getattr(spec, "loader", None)
        execute = getattr(loader, "exec_module", None)
        if spec is None or execute is None:
            return spec

        def exec_module(module: "Any") -> None:
            execute(module)
            try:
                _wrap(module)
            except Exception as error:  # torch's module works as it is
                _say(f"loaderdoctor: this process's DataLoaders are not watched ({type(error).__name__}: {error})")

        loader.exec_module = exec_module  # this module's loader only, for this one import
        return spec


def _wrap(module: "Any") -> None:
    """DataLoader.__init__ made to hand the process to the watch at the first loader made; and so is the own
    __init__ of each subclass, defined already or later (torchdata's StatefulDataLoader never calls torch's)."""
    cls = module.DataLoader
    _wrap_init(cls)
    todo = list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        todo.extend(sub.__subclasses__())
        _wrap_init(sub)

    def __init_subclass__(sub: "Any", **kwargs: "Any") -> None:
        super(cls, sub).__init_subclass__(**kwargs)
        _wrap_init(sub)

    cls.__init_subclass__ = classmethod(__init_subclass__)


def _wrap_init(cls: "Any") -> None:
    """`cls`'s own __init__ (none: nothing to do) made to hand the process to the watch, once."""
    original: Callable[..., None] | None = cls.__dict__.get("__init__")
    if original is None or getattr(original, "_loaderdoctor_job", False):
        return

    def __init__(loader: "Any", *args: "Any", **kwargs: "Any") -> None:
        if _watching is None and _may_start(sys._getframe(1)):
            _start_watching()
        original(loader, *args, **kwargs)
        if _watching is not None:
            _watching.note(loader, sys._getframe(1))  # the frame that made it, as the watch's own hook sees it

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__._loaderdoctor_job = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _start_watching() -> None:
    """This process's loaders watched from now on; a failure said once, and the process goes on unwatched."""
    global _watching, _failed, _starting
    with _lock:
        if _watching is not None or _failed:
            return
        _starting = True  # the loaders that loaderdoctor's import makes meanwhile are its own
        try:
            if not _registered:
                register(rank_from_environment())
            from loaderdoctor.job.process import watch_here

            _watching = watch_here(_folder or "", register)
        except Exception as error:
            _failed = True
            reason = f"{type(error).__name__}: {error}"
            _say(f"loaderdoctor: the DataLoaders of process {os.getpid()} are not watched ({reason})")
            register(rank_from_environment(), reason)
        finally:
            _starting = False


def _may_start(frame: "Any") -> bool:
    """Whether a loader made by `frame` (which called DataLoader.__init__) starts the watch: not when the process
    is disarmed or its watch failed, nor for a loader that loaderdoctor makes (at its own import, say)."""
    if _folder is None or _failed or _starting:
        return False
    return not os.path.realpath(frame.f_code.co_filename).startswith(_OWN_PACKAGE)


def _run_hidden_sitecustomize(here: str) -> None:
    """The sitecustomize that Python would have run without the job's folder first on sys.path, run as site.py
    runs it (a failure printed, never raised)."""
    try:
        after = sys.path[_index(sys.path, here) + 1 :]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", after)
        if spec is None or spec.loader is None:
            return
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as error:
        _say(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(error).__name__}: {error}")


def _index(paths: list[str], here: str) -> int:
    """Where `here` is in sys.path (-1 when it is not: every entry is then looked in)."""
    for index, path in enumerate(paths):
        if _same(path or os.curdir, here):
            return index
    return -1


def _same(path: str, other: str) -> bool:
    return os.path.realpath(path) == os.path.realpath(other)


def _ours(folder: str) -> bool:
    """Whether `folder` is a real folder (not a symlink) of this user's that nobody else may write."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


def _say(line: str) -> None:
    try:  # noqa: SIM105 (contextlib is not imported at startup)
        print(line, file=sys.stderr, flush=True)
    except Exception:  # no stderr: nothing to tell it on
        pass
