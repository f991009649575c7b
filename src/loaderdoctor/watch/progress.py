"""The lines a watched run logs as it goes: rate, wait share, ETA of the epoch and of the run, and the wait's cost."""

from __future__ import annotations

from dataclasses import dataclass

from loaderdoctor.plain.words import duration, money


@dataclass(frozen=True)
class Progress:
    """Where a watched run stands, in plain figures (see progress_line and epoch_line)."""

    name: str
    epoch: int  # the epoch under way (or just ended), counted from 0
    epochs: int | None  # the run's epochs, when the user said
    batch: int  # batches delivered in this epoch so far
    batches_per_epoch: int | None  # the loader's length, when it has one
    batches_per_s: float | None  # over the stretch this line covers
    samples_per_s: float | None
    wait_share: float | None  # of the stretch's time, spent waiting in next()
    cost_per_hour: float | None = None
    waiting_s: float | None = None  # how long the loop has waited for the batch it is waiting for now


def eta_s(p: Progress) -> tuple[float | None, float | None]:
    """Seconds to the epoch's end and to the run's end at the present rate (None where unknown)."""
    if not p.batches_per_s or p.batches_per_epoch is None:
        return None, None
    left_in_epoch = max(0, p.batches_per_epoch - p.batch)
    epoch_s = left_in_epoch / p.batches_per_s
    if p.epochs is None:
        return epoch_s, None
    later_epochs = max(0, p.epochs - p.epoch - 1)
    return epoch_s, (left_in_epoch + later_epochs * p.batches_per_epoch) / p.batches_per_s


def _where(p: Progress) -> str:
    epoch = f"epoch {p.epoch + 1}" + (f"/{p.epochs}" if p.epochs else "")
    batch = f"batch {p.batch:,}" + (f"/{p.batches_per_epoch:,}" if p.batches_per_epoch else "")
    return f"{epoch}, {batch}"


def _rate_words(p: Progress) -> str:
    if p.batches_per_s is None:
        return "no batch in this stretch"
    words = f"{p.batches_per_s:,.1f} batches/s"
    if p.samples_per_s is not None:
        words += f" ({p.samples_per_s:,.0f} samples/s)"
    if p.wait_share is not None:
        words += f", waiting for data {p.wait_share:.0%} of the time"
    return words


def _cost_words(p: Progress) -> str | None:
    if p.cost_per_hour is None or p.wait_share is None:
        return None
    return f"the wait costs {money(p.cost_per_hour * p.wait_share)} per hour"


def progress_line(p: Progress) -> str:
    """ "watch 'train': epoch 2/10, batch 1,200/5,000: 37.5 batches/s (600 samples/s), waiting for data 41% of
    the time; epoch ends in 1 min 41 s, the run in 25 min; the wait costs $1.23 per hour"."""
    parts = [f"watch '{p.name}': {_where(p)}: {_rate_words(p)}"]
    if p.waiting_s is not None:
        parts.append(f"waiting {duration(p.waiting_s)} for the next batch")
    epoch_s, run_s = eta_s(p)
    if epoch_s is not None:
        parts.append(
            f"epoch ends in {duration(epoch_s)}" + ("" if run_s is None else f", the run in {duration(run_s)}")
        )
    cost = _cost_words(p)
    if cost:
        parts.append(cost)
    return "; ".join(parts)


def epoch_line(p: Progress, wall_s: float) -> str:
    """ "watch 'train': epoch 3/10 done: 5,000 batches in 2 min 13 s: 37.6 batches/s (...), waiting for data 41%
    of the time; the run ends in 15 min; the wait cost $0.41 this epoch"."""
    epoch = f"epoch {p.epoch + 1}" + (f"/{p.epochs}" if p.epochs else "")
    batches = f"{p.batch:,} {'batch' if p.batch == 1 else 'batches'}"
    parts = [f"watch '{p.name}': {epoch} done: {batches} in {duration(wall_s)}: {_rate_words(p)}"]
    if p.epochs is not None and p.batches_per_epoch and p.batches_per_s:
        later = max(0, p.epochs - p.epoch - 1)
        if later:
            parts.append(f"the run ends in {duration(later * p.batches_per_epoch / p.batches_per_s)}")
    if p.cost_per_hour is not None and p.wait_share is not None:
        parts.append(f"the wait cost {money(p.cost_per_hour * p.wait_share * wall_s / 3600)} this epoch")
    return "; ".join(parts)
