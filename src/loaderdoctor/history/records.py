"""RunRecord: one run of a loader (watched in training, checked, tuned or scaled) as the history keeps it."""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.report import LoaderReport, measurements

KINDS = ("watch", "lightning", "huggingface", "check", "tune", "scale", "run")


def now_iso() -> str:
    """The present moment as the history writes it: ISO 8601, UTC, to the millisecond."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def parse_iso(text: str) -> datetime.datetime:
    """A moment written by now_iso() (or any ISO 8601 text with a zone), as an aware datetime."""
    moment = datetime.datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)


# What each field of a run must be when it is read back: a row of other types (damaged, or written by hand) is
# refused as a whole, and the history skips it with a warning, as it does a row that is no JSON.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "kind": (str,),
    "started_at": (str,),
    "ended_at": (str,),
    "host": (dict,),
    "settings": (dict,),
    "measurements": (dict,),
    "findings": (list,),
    "dataset": (dict,),
    "target": (str, type(None)),
    "id": (int, type(None)),
}
_FINDING_TEXTS = ("rule", "severity", "title")


@dataclass
class RunRecord:
    """One run of one loader, plain data. `host` is what the host was at the run's start (snapshot.HostSnapshot
    as a dict, with `other_processes` measured during the run); `settings` is Settings.to_dict(); `measurements`
    is report.measurements() of the run's Recording (check's "measurements"); `findings` are Finding.to_dict()
    of the run, main diagnosis first; `dataset` says what was loaded ({"name", "len", "batch_size",
    "batches_per_epoch"}), so that runs over other data are told apart."""

    name: str  # what the user calls this loader's job: runs of one name are compared with each other
    kind: str  # one of KINDS
    started_at: str  # now_iso() at the run's start
    ended_at: str
    host: dict[str, Any]
    settings: dict[str, Any]
    measurements: dict[str, Any]
    findings: list[dict[str, Any]]
    dataset: dict[str, Any] = field(default_factory=dict)
    target: str | None = None  # the TARGET of check, tune and scale; None for a watched run
    id: int | None = None  # given by the history when saved

    def __post_init__(self) -> None:
        for name, kinds in _FIELD_TYPES.items():
            value = getattr(self, name)
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise TypeError(f"{name} is {type(value).__name__}, not {' or '.join(k.__name__ for k in kinds)}")
        for number, finding in enumerate(self.findings):
            if not isinstance(finding, dict) or not all(isinstance(finding.get(k), str) for k in _FINDING_TEXTS):
                raise TypeError(f"findings[{number}] is no finding (a dict with {', '.join(_FINDING_TEXTS)} as text)")
        if self.kind not in KINDS:
            raise ValueError(f"unknown run kind {self.kind!r}: one of {', '.join(KINDS)}")
        parse_iso(self.started_at), parse_iso(self.ended_at)  # ValueError for a moment that is none

    @property
    def duration_s(self) -> float:
        return (parse_iso(self.ended_at) - parse_iso(self.started_at)).total_seconds()

    @property
    def main_finding(self) -> dict[str, Any] | None:
        return self.findings[0] if self.findings else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def run_record(
    kind: str,
    name: str,
    report: LoaderReport,
    started_at: str,
    ended_at: str,
    host: dict[str, Any],
    target: str | None = None,
) -> RunRecord:
    """The RunRecord of one loader's report; `host` is the HostSnapshot taken at the run's start (as a dict), to
    which the processes outside the run that took CPU during it are added."""
    rec = report.recording
    return RunRecord(
        name=name,
        kind=kind,
        started_at=started_at,
        ended_at=ended_at,
        host={**host, "other_processes": [dataclasses.asdict(p) for p in rec.other_processes]},
        settings=rec.settings.to_dict(),
        measurements=measurements(rec, report.limit),
        findings=[f.to_dict() for f in report.findings],
        dataset={
            "name": rec.dataset,
            "len": rec.dataset_len,
            "batch_size": rec.batch_size,
            "batches_per_epoch": rec.batches_per_epoch,
            "loader_class": rec.loader_class,  # "" for torch's DataLoader itself
        },
        target=target,
    )
