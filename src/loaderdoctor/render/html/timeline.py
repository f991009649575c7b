"""The charts of one Recording: the timeline of its batches (each one's wait in next() and the step after it,
epochs, stalls and dead workers marked), the rate of each epoch, and each worker's memory over time."""

from __future__ import annotations

from collections.abc import Sequence

from loaderdoctor.recording import rates
from loaderdoctor.recording.record import BatchRecord, Recording
from loaderdoctor.render.html.svg import Bar, Marker, Series, bar_chart, legend, line_chart

# A timeline of more batches than this shows groups of consecutive batches (their means) as one bar each.
MAX_BARS = 360
# Epochs named under the rate per epoch at most (every k-th beyond).
MAX_EPOCH_TICKS = 20
# Worker lines drawn at most (the rest are named in the chart's title).
MAX_WORKERS = 6


def _ordered(rec: Recording) -> list[BatchRecord]:
    return sorted(rec.batches, key=lambda b: (b.delivered_s, b.epoch, b.index))


def timeline_peak_ms(rec: Recording) -> float:
    """The tallest bar a timeline of `rec` draws (ms), so that two timelines can share a scale."""
    return max(_bar_heights(rec), default=0.0)


def _groups(batches: list[BatchRecord]) -> list[list[BatchRecord]]:
    size = max(1, -(-len(batches) // MAX_BARS))
    groups: list[list[BatchRecord]] = []
    for batch in batches:
        # A group never spans two epochs, so that an epoch's start stays visible.
        if groups and len(groups[-1]) < size and groups[-1][-1].epoch == batch.epoch:
            groups[-1].append(batch)
        else:
            groups.append([batch])
    return groups


def _bar_heights(rec: Recording) -> list[float]:
    return [sum(b.wait_s + b.step_s for b in group) / len(group) * 1000 for group in _groups(_ordered(rec))]


def timeline(rec: Recording, label: str, y_high_ms: float | None = None) -> str:
    """Per batch (or per group of consecutive batches, means), the wait in next() stacked on the step, in
    delivery order; a dashed line where each epoch starts, a red one where an epoch started its workers again
    (after the first), at a stall or at a worker's death."""
    batches = _ordered(rec)
    if not batches:
        return f'<p class="muted">{label}: no batch was delivered, so there is no timeline.</p>'
    groups = _groups(batches)
    grouped = any(len(g) > 1 for g in groups)
    bars = [_bar(group) for group in groups]
    markers: list[Marker] = []
    place: dict[tuple[int, int], int] = {}
    restarted = _workers_started(rec)
    for index, group in enumerate(groups):
        for batch in group:
            place[(batch.epoch, batch.index)] = index
        if index == 0 or group[0].epoch != groups[index - 1][0].epoch:
            started = group[0].epoch in restarted
            words = f"epoch {group[0].epoch}" + (": workers started" if started else "")
            markers.append(Marker(index, words, "restart" if started and index else "mark"))
    for death in rec.worker_deaths:
        at = place.get((death.epoch, death.batch), place.get((death.epoch, death.batch - 1), len(groups) - 1))
        markers.append(Marker(at + 0.5, f"worker died: {death.message}", "died"))
    if rec.stall is not None:
        stall = rec.stall
        markers.append(
            Marker(
                len(groups),
                f"stall: batch {stall.batch} of epoch {stall.epoch} never came ({stall.waited_s:.0f} s)",
                "stall",
            )
        )
    unit = "batches, in groups (means)" if grouped else "batches, in the order delivered"
    chart = bar_chart(
        bars,
        label=label,
        x_label=f"{len(batches)} {unit}",
        y_label="ms per batch",
        markers=markers,
        y_high=y_high_ms,
    )
    return legend([("wait", "wait in next()"), ("step", "training step")]) + chart


def _workers_started(rec: Recording) -> set[int]:
    """The epochs whose iterator started worker processes (their pids new): every epoch's without persistent
    workers, where starting them again is a cost each epoch pays."""
    started, previous = set(), None
    for epoch in rec.epochs:
        if epoch.worker_pids and epoch.worker_pids != previous:
            started.add(epoch.epoch)
        previous = epoch.worker_pids
    return started


def _bar(group: Sequence[BatchRecord]) -> Bar:
    n = len(group)
    wait_ms = sum(b.wait_s for b in group) / n * 1000
    step_ms = sum(b.step_s for b in group) / n * 1000
    first, last = group[0], group[-1]
    which = f"epoch {first.epoch}, batch {first.index}" + (f"-{last.index} (mean of {n})" if n > 1 else "")
    title = f"{which}: wait {wait_ms:.1f} ms, step {step_ms:.1f} ms, at {first.delivered_s:.2f} s"
    return Bar(((step_ms, "step"), (wait_ms, "wait")), title)


def epoch_rates(named: Sequence[tuple[str, Recording]], label: str) -> str:
    """The rate of every epoch (rates.epoch_rates), one series per recording."""
    series = []
    for number, (name, rec) in enumerate(named):
        epochs = {e.epoch: e for e in rec.epochs}
        points = tuple(
            (
                float(epoch),
                rate,
                f"{name}, epoch {epoch}: {epochs[epoch].batches} batches, {rate:.1f} batches/s "
                f"(first batch {_s(epochs[epoch].first_batch_s)}; ended: {epochs[epoch].ended})",
            )
            for epoch, rate in rates.epoch_rates(rec).items()
        )
        if points:
            series.append(Series(name, points, f"s{number % 6}"))
    if not series:
        return '<p class="muted">No epoch delivered a batch: no rate per epoch.</p>'
    epochs = sorted({int(x) for s in series for x, _, _ in s.points})
    every = -(-len(epochs) // MAX_EPOCH_TICKS)
    ticks = [(float(e), str(e)) for e in epochs[::every]]
    chart = line_chart(series, label=label, x_label="epoch", y_label="batches/s", x_ticks=ticks)
    return chart + (
        '<p class="muted small">An epoch counts from its iter() to its end: the first epoch holds the workers\' '
        "start-up, which persistent workers pay once per run and others every epoch.</p>"
    )


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def worker_memory(rec: Recording, label: str) -> str:
    """Each worker's private memory (USS) over the run, a line per worker process."""
    by_pid: dict[int, list[tuple[float, float, str]]] = {}
    for sample in rec.worker_samples:
        if sample.uss_bytes is None:
            continue  # a round that read the CPU only
        mb = sample.uss_bytes / 2**20
        by_pid.setdefault(sample.pid, []).append(
            (sample.t_s, mb, f"pid {sample.pid} at {sample.t_s:.1f} s: {mb:.0f} MB")
        )
    if not by_pid:
        return '<p class="muted">No worker process was sampled (loading ran in the training process).</p>'
    pids = sorted(by_pid, key=lambda pid: by_pid[pid][0][0])
    shown = pids[:MAX_WORKERS]
    series = [Series(f"worker pid {pid}", tuple(by_pid[pid]), f"s{n % 6}") for n, pid in enumerate(shown)]
    chart = line_chart(series, label=label, x_label="seconds since the run started", y_label="USS, MB")
    if len(pids) > len(shown):
        chart += f'<p class="muted small">The first {len(shown)} of {len(pids)} workers are drawn.</p>'
    return chart
