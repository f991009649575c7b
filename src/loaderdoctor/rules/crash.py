"""The rule about a loader that crashed: a worker that died (a signal, the OOM killer, an exit as it started) or a
worker_init_fn that raised. Never a healthy report: it says which worker, how it ended, and the sample it held."""

from __future__ import annotations

import signal

from loaderdoctor.plain.words import plural
from loaderdoctor.recording.record import Recording, WorkerDeath
from loaderdoctor.rules._common import mb, samples_by_worker
from loaderdoctor.rules.finding import Finding
from loaderdoctor.workers.deaths import CRASH_SIGNALS, signal_name

SKIP_SNIPPET = """\
import loaderdoctor

# the same batches as torch's DataLoader; a sample that kills its worker is skipped and reported
loader = loaderdoctor.DataLoader(dataset, batch_size=..., num_workers=..., on_sample_error="skip")"""


def _memory_at_death(rec: Recording, pid: int | None) -> tuple[float | None, float | None]:
    """The dead worker's private memory (USS) and resident memory (RSS) when last seen, in MiB."""
    samples = samples_by_worker(rec).get(pid, []) if pid is not None else []
    if not samples:
        return None, None
    private = [s.uss_bytes for s in samples if s.uss_bytes is not None]
    return (mb(private[-1]) if private else None), mb(samples[-1].rss_bytes)


def _sample(death: WorkerDeath) -> str:
    return f"dataset[{death.index}]" if death.index is not None else "a sample"


def _cause(rec: Recording, death: WorkerDeath, uss_mb: float | None) -> tuple[str, str]:
    """(how the worker ended, in words; what to do), from its exit status, the sample it held and the setting."""
    held = f" while loading {_sample(death)}" if death.index is not None else ""
    memory = f" (last seen with {uss_mb:.0f} MB of private memory)" if uss_mb is not None else ""
    sig = signal_name(death.exitcode)
    code = death.exitcode
    if code is not None and code < 0 and -code in CRASH_SIGNALS:
        return (
            f"killed by {sig}{held}: native code crashed in the worker",
            f"Native code (a decoder, an extension, a C library) crashed on {_sample(death)}: load it alone in one "
            "process under `python -X faulthandler` to see where, then repair or leave out that sample. "
            "loaderdoctor.DataLoader(on_sample_error='skip') keeps training past a sample that kills its worker.",
        )
    if code == -signal.SIGKILL:
        if death.oom_kill:
            why = f"the kernel's OOM killer ended it (SIGKILL){held}{memory}: the memory this job may use ran out"
        else:
            why = f"killed by SIGKILL{held}{memory}: the OOM killer or another process (kill -9) ended it"
        return (
            why,
            "Give loading less memory: fewer workers, a smaller prefetch_factor, smaller samples or batches; look "
            f"at what {_sample(death)} allocates. Each worker holds prefetch_factor batches and its own copy of "
            "every Python object of the dataset it touched (copy-on-read under fork).",
        )
    if code is not None and code < 0:
        return (
            f"ended by {sig}{held}",
            f"Another process sent {sig} to the worker: find what sends it (a job scheduler, a watchdog script).",
        )
    method = rec.start_method or "fork"
    if rec.forkserver_blocker is not None and method in ("spawn", "forkserver"):
        return (
            f"exited with status {code} as it started: workers started with {method} cannot load this loader",
            f"{rec.forkserver_blocker[0].upper()}{rec.forkserver_blocker[1:]}.",
        )
    status = f"exited with status {code}" if code is not None else "ended"
    return (
        f"{status}{held}",
        "The worker's own traceback, printed on standard error as it ended, says why; run the loader with "
        "num_workers=0 to see the error raised in the training process itself.",
    )


def worker_crash(rec: Recording) -> Finding | None:
    """Workers died or could not start: the loader crashed (a training loop would end there), or a guard started
    them again. Which worker, how it ended, the sample it held, the memory it had."""
    if rec.worker_init_error is not None:
        return Finding(
            rule="worker-crash",
            severity="critical",
            title="The worker_init_fn raised as each worker started: every batch of those workers fails",
            evidence={"worker_init_error": rec.worker_init_error, "start_method": rec.start_method},
            fix=(
                f"worker_init_fn raised {rec.worker_init_error}. It runs once in each worker before its first "
                "sample, so a training loop fails at its first batch: repair it, and try it as "
                "worker_init_fn(0) in the training process."
            ),
            snippet=None,
            settings_change={},
            impact=1.0,
        )
    if not rec.worker_deaths:
        return None
    death = rec.worker_deaths[0]
    uss_mb, rss_mb = _memory_at_death(rec, death.pid)
    how, fix = _cause(rec, death, uss_mb)
    crashed = rec.outcome == "crashed"
    worker = f"worker pid {death.pid}" if death.pid is not None else "a worker"
    where = f"batch {death.batch} of epoch {death.epoch}"
    restarts = sum(epoch.restarts for epoch in rec.epochs)
    if crashed:
        after = f" after {plural(restarts, 'restart')} (the guard's: it gave up)" if restarts else ""
        title = f"The loader crashed at {where}{after}: {worker} {how}"
    else:
        title = f"{worker[0].upper()}{worker[1:]} {how} at {where}; the loader was started again"
    return Finding(
        rule="worker-crash",
        severity="critical" if crashed else "warning",
        title=title,
        evidence={
            "deaths": len(rec.worker_deaths),
            "restarts": restarts,
            "epoch": death.epoch,
            "batch": death.batch,
            "pid": death.pid,
            "exitcode": death.exitcode,
            "signal": signal_name(death.exitcode),
            "index": death.index,
            "oom_kill": death.oom_kill,
            "uss_mb": uss_mb,
            "rss_mb": rss_mb,
            "start_method": rec.start_method,
        },
        fix=fix,
        snippet=SKIP_SNIPPET if death.index is not None and rec.start_method is not None else None,
        settings_change={},
        impact=1.0 if crashed else 0.5,
    )
