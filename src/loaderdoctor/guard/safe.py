"""Safe settings: the changes the guard makes to a loader's settings before workers start, with reasons."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loaderdoctor.recording import IteratorFacts
from loaderdoctor.settings import Settings


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
        "forkserver); changes the main process makes to the dataset after the first epoch no longer reach "
        "them: pass persistent_workers=False to keep workers that restart every epoch",
    )


def fork_hazards(facts: IteratorFacts) -> list[str]:
    """Why forking workers now could hang them: state of the parent that fork copies half-way."""
    hazards = []
    if facts.threads:
        names = ", ".join(facts.threads[:5]) + (", ..." if len(facts.threads) > 5 else "")
        hazards.append(f"{len(facts.threads)} other thread(s) alive in this process ({names})")
    if facts.cuda_initialized:
        hazards.append("CUDA is initialised")
    if facts.inductor_loaded:
        hazards.append("torch.compile's inductor is loaded (it runs compile threads)")
    return hazards


def start_method_change(settings: Settings, facts: IteratorFacts, *, explicit: bool) -> SettingChange | None:
    """forkserver instead of fork when the parent holds state that a forked worker could hang on."""
    if settings.effective_start_method != "fork":
        return None
    hazards = fork_hazards(facts)
    if not hazards:
        return None
    why = (
        "fork is unsafe now: "
        + "; ".join(hazards)
        + ". A forked worker inherits every lock those hold, without the thread that would release it"
    )
    if explicit:
        return SettingChange(
            "start_method",
            "fork",
            "fork",
            why + "; multiprocessing_context='fork' was chosen explicitly, so it is kept: use 'forkserver'",
            kept=True,
        )
    return SettingChange(
        "start_method", "fork", "forkserver", why + "; pass multiprocessing_context='fork' to keep fork"
    )
