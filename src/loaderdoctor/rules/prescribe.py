"""Prescribe: combine the findings' fixes into one Settings (verify.py measures it)."""

from __future__ import annotations

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.forksafety import safe_start_method
from loaderdoctor.recording.record import Recording
from loaderdoctor.rules.finding import Finding


def prescribe(recording: Recording, findings: list[Finding]) -> Settings | None:
    """The recorded settings with the changes of every warning and critical finding applied (the main
    diagnosis wins a conflict), or None when they change nothing."""
    changes: dict[str, object] = {}
    for finding in findings:
        if finding.severity == "info":
            continue
        for key, value in finding.settings_change.items():
            changes.setdefault(key, value)
    if not changes:
        return None
    settings = recording.settings.replace(**changes)
    # More workers must not mean forking into the state that makes fork hang, where forkserver can work.
    start_method = safe_start_method(recording, settings)
    if start_method != settings.start_method:
        settings = settings.replace(start_method=start_method, persistent_workers=True)
    return None if settings == recording.settings else settings
