"""The result of a check: findings, verification and the report they make, all plain data."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.loader.ddp import DdpPlan
from loaderdoctor.plain.data import dataclass_from_written
from loaderdoctor.plain.numbers import rounded
from loaderdoctor.probe.verification import NO_RATE, Verification
from loaderdoctor.recording.epochcost import EpochCost
from loaderdoctor.recording.limit import Limit, host_limit, share_of_limit
from loaderdoctor.recording.rates import (
    batches_per_s,
    delivered_batches,
    epoch_batches,
    epoch_overhead_s,
    first_startup_s,
    interval_s,
    rate_range,
    training_rate,
)
from loaderdoctor.recording.record import (
    Recording,
    descheduled_wait_s,
    mean_batch_bytes,
    steady_batches,
    wait_fraction,
)
from loaderdoctor.recording.usage import loading_cpu, other_cores, worker_uss_after_startup
from loaderdoctor.rules.finding import Finding

SCHEMA = "loaderdoctor.check/1"


def measurements(rec: Recording, limit: Limit | None = None) -> dict[str, Any]:
    """The figures a report shows for a recording (the JSON schema's "measurements"), with the host's limit
    (by default as this recording alone shows it; see LoaderReport.limit)."""
    steady_waits = [b.wait_s for b in steady_batches(rec)]
    uss = worker_uss_after_startup(rec)
    rate = training_rate(rec)
    spread = rate_range(rec)
    wf = wait_fraction(rec)
    batch_bytes = mean_batch_bytes(rec)
    cpu = loading_cpu(rec)
    others = other_cores(rec)
    per_batch = sum(b.samples for b in rec.batches) / len(rec.batches) if rec.batches else None
    limit = host_limit(rec) if limit is None else limit
    share = share_of_limit(rate, limit)
    return {
        "batches_per_s": rounded(rate, 3),
        # the run's own spread: its rate over three stretches of its steady batches (history's CI gate reads it)
        "batches_per_s_range": None if spread is None else [round(spread[0], 3), round(spread[1], 3)],
        "samples_per_s": None if rate is None or per_batch is None else round(rate * per_batch, 3),
        "wait_fraction": rounded(wf, 4),
        "interval_ms": _ms(interval_s(rec)),
        "epoch_overhead_s": round(epoch_overhead_s(rec), 4),
        "first_startup_s": rounded(first_startup_s(rec), 4),
        "first_batch_s": [rounded(e.first_batch_s, 4) for e in rec.epochs],
        "epochs": len(rec.epochs),
        "batches": delivered_batches(rec),
        "batches_per_epoch": epoch_batches(rec),
        "wall_s": round(rec.wall_s, 3),
        "run_batches_per_s": round(batches_per_s(rec), 3),
        "step_ms": _ms(rec.step_s),
        "wait_ms_mean": _ms(statistics.mean(steady_waits) if steady_waits else None),
        "wait_ms_p50": _ms(statistics.median(steady_waits) if steady_waits else None),
        "wait_ms_p95": _ms(_percentile(steady_waits, 0.95)),
        "wait_descheduled_ms_mean": _ms(descheduled_wait_s(rec)),
        "batch_mb": None if batch_bytes is None else round(batch_bytes / 2**20, 3),
        "loading_cores": None if cpu is None else round(cpu.cores, 3),
        "loading_cpu_share": None if cpu is None else round(cpu.share, 3),
        "available_cores": None if cpu is None else round(cpu.available_cores, 3),
        "other_processes_cores": rounded(others, 3),
        "other_processes": [dataclasses.asdict(p) for p in rec.other_processes],
        "worker_uss_mb_max": round(max(uss) / 2**20, 1) if uss else None,
        "start_method": rec.start_method,
        "outcome": rec.outcome,
        "sample_errors": len(rec.sample_errors),
        "limit": limit.to_dict(),
        "share_of_limit": rounded(share, 3),
        "ceiling": ceiling_figures(rec),
    }


def ceiling_figures(rec: Recording) -> dict[str, Any] | None:
    """What the data-free turns measured (`run --ceiling`), None without them: the loop's rate with its input taken
    away and in the real turns beside, the input's cost measured and as the waits tell it, the data-free steps."""
    c = rec.ceiling
    if c is None:
        return None
    turns = c.pair_speedups()
    return {
        "ceiling_batches_per_s": rounded(c.rate("data-free"), 3),
        "real_batches_per_s": rounded(c.rate("real"), 3),
        "speedup": rounded(c.speedup, 3),
        "input_cost": rounded(c.input_cost, 4),
        "wait_model_input_cost": rounded(c.wait_estimate, 4),
        "turn_speedups_range": [round(min(turns), 3), round(max(turns), 3)] if turns else None,
        "data_free_steps": c.data_free_steps,
        "trained_on_repeated_batches": c.trained_on_repeated_batches and c.data_free_steps > 0,
        "complete": c.complete,
        "epochs_kept_length": c.kept_length,
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


@dataclass
class LoaderReport:
    """One loader's check: its recording, the findings on it, the fix measured, and an epoch's cost."""

    name: str
    recording: Recording
    findings: list[Finding]
    verification: Verification | None = None
    epoch_cost: EpochCost | None = None  # an epoch's time (and money) now and with the fix, when asked for
    plan: DdpPlan | None = None  # a distributed run's DDP plan (`loaderdoctor run --nproc-per-node`), on rank 0

    @property
    def limit(self) -> Limit:
        """The rate this host could reach (limit.py): measured on the fix's run when it ran workers and its
        loading's CPU is known (workers load with one thread each, where the training process's own loading
        may count the spinning of torch's thread pool as work), else on the user's settings' run."""
        after = None if self.verification is None else self.verification.after_recording
        if after is not None and after.settings.num_workers and after.settings.backend == "process":
            fixed = host_limit(after)
            if fixed.loading_cpu_batches_per_s is not None:
                return fixed
        return host_limit(self.recording)

    @property
    def fixed_rate(self) -> float | None:
        """The fix's measured rate, for every fix whose run delivered on the same data (a rescue's too)."""
        v = self.verification
        if v is None or v.after_outcome != "completed" or v.after <= 0:
            return None
        return None if v.verdict in NO_RATE else v.after

    def as_report(self) -> Report:
        """This loader's report as a report of its own, as `run` makes one (what show(), print() and a notebook
        show of what watch() or a callback returned)."""
        return Report(target=self.name, loaders={self.name: self}, command="run")

    def __repr__(self) -> str:
        """Its report's short view (a notebook shows this for `watched.report`), not every batch's dataclass."""
        return repr(self.as_report())

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.recording.settings.to_dict(),
            "measurements": measurements(self.recording, self.limit),
            "findings": [f.to_dict() for f in self.findings],
            "verification": None if self.verification is None else self._verification_dict(self.verification),
            "epoch": None if self.epoch_cost is None else self.epoch_cost.to_dict(),
            **({} if self.plan is None else {"plan": self.plan.to_dict()}),
            "recording": self.recording.to_dict(),  # last: the figures above are what a reader looks for
        }

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any]) -> LoaderReport:
        """The LoaderReport of loader `name` whose to_dict() is `data` (its measurements recomputed)."""
        return dataclass_from_written(cls, data, {"epoch": "epoch_cost"}, name=name)

    def _verification_dict(self, verification: Verification) -> dict[str, Any]:
        """The verification, with the fix's rate as a share of the limit the report states (self.limit), and
        the fix's recording last."""
        written = verification.to_dict()
        after_recording = written.pop("after_recording")
        share = share_of_limit(self.fixed_rate, self.limit)
        return {**written, "share_of_limit": rounded(share, 3), "after_recording": after_recording}


@dataclass
class UnwatchedProcess:
    """A process of a run's job that could not be watched (a rank, or a process that made a loader, that wrote
    nothing of what it measured), and why; its pid None where it never said (a rank of --nproc-per-node)."""

    pid: int | None
    rank: int | None
    why: str
    argv: str = ""

    def words(self) -> str:
        """ "rank 1 (pid 1234) could not be watched: ..." """
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        who = f"rank {self.rank}{pid}" if self.rank is not None else f"process {self.pid} ({self.argv})"
        return f"{who} could not be watched: {self.why}"


@dataclass
class Report:
    """A check of a target's loaders (schema loaderdoctor.check/1); or, with `command` "run", what the loaders of
    a script (`target`: its command line) measured on its real steps, and the processes of its job that could not
    be watched."""

    target: str
    loaders: dict[str, LoaderReport]
    command: str = "check"
    unwatched: list[UnwatchedProcess] = field(default_factory=list)
    # _repr_html_ (a notebook's view) and __str__ (the console text) are lent by commands/showing.py: render/ is above

    @property
    def critical(self) -> bool:
        return any(f.severity == "critical" for lr in self.loaders.values() for f in lr.findings)

    @property
    def exit_status(self) -> int:
        return 1 if self.critical else 0

    def __repr__(self) -> str:
        """A line per loader, its main finding and its fix's verdict (a notebook shows this; the whole report is
        `loaderdoctor.show(report)`), not the thousand lines of every batch's dataclass."""
        lines = [f"<loaderdoctor {self.command} of {self.target!r}: {len(self.loaders)} loader(s)"]
        for name, lr in self.loaders.items():
            main = f"{lr.findings[0].severity} {lr.findings[0].rule}" if lr.findings else "no problems found"
            v = lr.verification
            fix = ""
            if v is not None:
                fix = f"; fix {v.verdict}" + (f" {v.speedup:.2f}x" if v.speedup and not v.unsteady else "")
            lines.append(f"  {name!r}: {main}{fix}")
        return "\n".join(lines) + "\n  (loaderdoctor.show(report) prints it whole)>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": self.command,
            "target": self.target,
            "loaders": {name: lr.to_dict() for name, lr in self.loaders.items()},
            "unwatched": [dataclasses.asdict(process) for process in self.unwatched],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """The Report whose to_dict() is `data`."""
        return dataclass_from_written(cls, data)
