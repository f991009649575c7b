"""Safe settings: the changes the guard makes to a loader's settings before workers start, with reasons."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from loaderdoctor.host.forkhazards import ForkHazards
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.recording.forksafety import forkserver_blocker

log = logging.getLogger("loaderdoctor")


@dataclass(frozen=True)
class SettingChange:
    """A safer value for one setting; `kept` when the user chose the old one explicitly (then only warned)."""

    setting: str
    before: Any
    after: Any
    reason: str
    kept: bool = False

    def apply(self, settings: Settings) -> Settings:
        return settings if self.kept else settings.replace(**{self.setting: self.after})


def persistent_workers_change(settings: Settings, *, explicit: bool) -> SettingChange | None:
    """Persistent workers, unless the user said persistent_workers=False."""
    if settings.num_workers == 0 or settings.persistent_workers or explicit:
        return None
    return SettingChange(
        "persistent_workers",
        False,
        True,
        "workers start once instead of every epoch (a restart costs about 1 s per epoch under spawn or "
        "forkserver); from the second epoch on, random draws in workers (augmentation) continue instead of "
        "being seeded anew, so those batches differ from the plain DataLoader's, and changes the main process "
        "makes to the dataset no longer reach the workers: pass persistent_workers=False to keep torch's "
        "behaviour",
    )


def start_method_change(
    settings: Settings, hazards: ForkHazards, *, explicit: bool, blocker: str | None
) -> SettingChange | None:
    """forkserver instead of fork when what runs in the parent (threads, CUDA, compiling) could hang a forked
    worker; fork kept, with the reason, when the user chose it or forkserver cannot load this loader
    (`blocker` says why)."""
    if settings.effective_start_method != "fork" or not hazards:
        return None
    why = (
        f"fork is risky now: {hazards.describe()}. A forked worker inherits every lock those hold, without the "
        "thread that would release it"
    )
    remedy = hazards.remedy()
    if explicit:
        return SettingChange(
            "start_method",
            "fork",
            "fork",
            why + "; multiprocessing_context='fork' was chosen explicitly, so it is kept: use 'forkserver'",
            kept=True,
        )
    if blocker is not None:
        return SettingChange(
            "start_method",
            "fork",
            "fork",
            why
            + f"; fork is kept because forkserver cannot work for this loader: {blocker}"
            + (f". Meanwhile {remedy}" if remedy else ""),
            kept=True,
        )
    return SettingChange(
        "start_method", "fork", "forkserver", why + "; pass multiprocessing_context='fork' to keep fork"
    )


class StartSafety:
    """For one guarded loader: whether workers that are not forked can load it (found once, logged once), and
    the start-method change that what runs in this process now calls for."""

    def __init__(self, spec: LoaderSpec) -> None:
        self.spec = spec
        self.explicit = spec.settings.start_method is not None  # multiprocessing_context was given
        self._known = False
        self._blocker: str | None = None

    def blocker(self) -> str | None:
        """Why workers that are not forked could not load this loader; None when they could."""
        if not self._known:
            self._known = True
            self._blocker = forkserver_blocker(self.spec)
            if self._blocker is not None:
                log.warning("loaderdoctor guard: only forked workers can load this loader: %s", self._blocker)
        return self._blocker

    def picklable(self) -> bool:
        """Whether workers started with forkserver or spawn can load the dataset and its functions."""
        return self.blocker() is None

    def change_now(self, settings: Settings) -> SettingChange | None:
        """Before workers start with `settings`: forkserver instead of fork when what runs now (threads, CUDA,
        compiling) could hang forked workers; a kept change (to warn of) when fork must or was chosen to stay."""
        if settings.effective_start_method != "fork":
            return None
        hazards = ForkHazards.now()
        if not hazards:
            return None
        blocker = None if self.explicit else self.blocker()
        return start_method_change(settings, hazards, explicit=self.explicit, blocker=blocker)
