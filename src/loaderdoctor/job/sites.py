"""Where the user's code made a DataLoader, in the words `loaderdoctor run` names the loader by: the user's own line
("train.py:41"), or the framework's method that made it on the user's behalf with the user's line that led there
("Trainer.get_train_dataloader (train.py:42)").

The stack is read from the frame that called DataLoader.__init__ outwards. Frames that hold the loader being made
(a subclass's __init__, a framework's wrapper of the constructor, as Lightning puts on DataLoader while it calls
the user's train_dataloader()) are its construction, not its maker. A framework that re-makes a loader it was
given (accelerate's prepare(), Lightning's DistributedSampler) holds the given one in a local variable: the new
loader takes the given one's name, so that it stays named where the user made the loader they wrote."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from torch.utils.data.dataloader import DataLoader as TorchDataLoader

from loaderdoctor.plain.usercode import code_owner, is_own_file


def _no_site(loader: Any) -> str | None:
    return None


def creation_site(
    frame: FrameType | None, loader: Any = None, known: Callable[[Any], str | None] = _no_site
) -> str | None:
    """The name of `loader` from `frame`, the caller of its DataLoader.__init__: the innermost line of the user's
    own code, preceded by the framework's method when the loader was made inside a package the user called
    ("Trainer.get_train_dataloader (train.py:42)"), or the name `known` gives a loader that a package re-makes
    from it; the innermost package line when no user code called; None when loaderdoctor made the loader."""
    makers: list[FrameType] = []  # the package frames that made the loader, innermost first
    while frame is not None:
        filename = frame.f_code.co_filename
        owner = code_owner(filename)
        if loader is not None and _holds(frame, loader):
            pass  # the loader's own construction: a subclass's __init__, a wrapper of the constructor
        elif owner == "user":
            line = _file_line(frame)
            return f"{_maker(makers)} ({line})" if makers else line
        elif owner == "internal" and is_own_file(filename) and not makers:
            return None  # loaderdoctor's own loader (a guard's), made on behalf of a watched one
        elif owner == "package":
            inherited = _remade_from(frame, loader, known)
            if inherited is not None:
                return inherited
            makers.append(frame)
        frame = frame.f_back
    return _file_line(makers[0]) if makers else None


def _file_line(frame: FrameType) -> str:
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"


def _maker(makers: list[FrameType]) -> str:
    """The method that made the loader: the innermost public one of the package's frames ("get_train_dataloader",
    not its helper "_get_dataloader"), else the one the user's code called (a class for its __init__: a wrapper
    of a loader, "WebLoader")."""
    public = [f for f in makers if not f.f_code.co_name.startswith(("_", "<"))]
    code = (public or makers[-1:])[0].f_code
    return code.co_qualname.replace(".<locals>", "").removesuffix(".__init__")


def _holds(frame: FrameType, loader: Any) -> bool:
    """Whether `frame` holds `loader` itself in a local variable: it is constructing it."""
    try:
        return any(value is loader for value in frame.f_locals.values())
    except Exception:  # a frame whose locals cannot be read: not the loader's construction, as far as we know
        return False


def _remade_from(frame: FrameType, loader: Any, known: Callable[[Any], str | None]) -> str | None:
    """The name of the loader that a package's `frame` re-makes as `loader`: the one name of the named loaders
    among its local variables (None when none is, or when several are and which one is unclear)."""
    try:
        names = {
            known(value)
            for value in frame.f_locals.values()
            if value is not loader and isinstance(value, TorchDataLoader)
        }
    except Exception:  # an odd object among the locals: the loader is named by its own stack
        return None
    names.discard(None)
    return names.pop() if len(names) == 1 else None
