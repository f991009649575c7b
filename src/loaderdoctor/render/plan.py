"""The console rendering of a DDP plan (a DdpPlan or its dict), for `loaderdoctor plan` and every scale report."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from loaderdoctor.loader.ddp import DdpPlan, SameEffectiveBatch
from loaderdoctor.plain.words import plural


def render(plan: DdpPlan | dict[str, Any], console: Console) -> None:
    """Print the plan: its heading, one line per figure, and the table that keeps its effective batch."""
    console.print(plan_view(plan))


def plan_view(plan: DdpPlan | dict[str, Any]) -> Group:
    """The plan as a renderable, so that a scale report can place it under its own heading."""
    if isinstance(plan, dict):
        plan = DdpPlan.from_dict(plan)
    heading = Text.assemble(
        ("DDP plan ", "bold"),
        f"{_many(plan.dataset_size, 'sample')}, batch {plan.batch_size:,} per rank, {_many(plan.world_size, 'rank')}",
    )
    return Group(heading, _figures(plan), Text(""), _keep_batch_table(plan))


def _figures(plan: DdpPlan) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim", justify="right", no_wrap=True)
    table.add_column()
    table.add_row("samples per rank", _samples(plan))
    table.add_row("batches per rank", _batches(plan))
    table.add_row("optimizer steps", _steps(plan))
    table.add_row(
        "effective batch",
        f"{plan.effective_batch_size:,} samples per optimizer step ({plan.batch_size:,} per rank × "
        f"{plural(plan.world_size, 'rank')} × {plural(plan.grad_accum, 'batch')} accumulated)",
    )
    table.add_row("learning rate", _learning_rate(plan))
    return table


def _samples(plan: DdpPlan) -> str:
    """How the sampler evens the ranks out: it repeats the first indices of the epoch's order (shuffled or not)
    or, with its own drop_last, cuts the last ones."""
    sampler = f"DistributedSampler, drop_last={plan.sampler_drop_last}"
    if plan.repeated_samples:
        return (
            f"{plan.samples_per_rank:,} ({sampler}): {plan.total_samples:,} drawn in all, "
            f"{plural(plan.repeated_samples, 'sample')} drawn again (the first of the epoch's order) to even the "
            "ranks out"
        )
    if plan.dropped_by_sampler:
        return (
            f"{plan.samples_per_rank:,} ({sampler}): {plural(plan.dropped_by_sampler, 'sample')} dropped (the last "
            "of the epoch's order) to even the ranks out; no rank sees them this epoch"
        )
    return f"{plan.samples_per_rank:,} ({sampler}): the dataset splits evenly, nothing repeated or dropped"


def _batches(plan: DdpPlan) -> str:
    loader = f"DataLoader, drop_last={plan.drop_last}"
    if not plan.samples_per_rank:
        return (
            f"[bold red]0 per epoch ({loader}): the sampler leaves each rank no sample, so no rank trains; use "
            "fewer ranks than samples, or the sampler's drop_last=False[/]"
        )
    if not plan.batches_per_rank:
        return (
            f"[bold red]0 per epoch ({loader}): each rank's {plural(plan.samples_per_rank, 'sample')} make no "
            "full batch, so no rank trains; use a smaller batch or drop_last=False[/]"
        )
    text = f"{plan.batches_per_rank:,} per epoch ({loader})"
    if plan.dropped_by_loader_per_rank:
        dropped = plan.dropped_by_loader_per_rank
        return text + (
            f": the last, partial batch of {plural(dropped, 'sample')} is dropped on each rank "
            f"({dropped * plan.world_size:,} in all)"
        )
    if plan.last_batch_size < plan.batch_size:
        return text + f": the last holds {plural(plan.last_batch_size, 'sample')}"
    return text + ": every batch full"


def _steps(plan: DdpPlan) -> str:
    if plan.grad_accum == 1:
        return f"{plan.optimizer_steps:,} per epoch (one per batch, no gradient accumulation)"
    text = f"{plan.optimizer_steps:,} per epoch (one per {plural(plan.grad_accum, 'batch')} accumulated)"
    if not plan.leftover_batches:
        return text
    leftover, their = (
        ("batch makes", "its") if plan.leftover_batches == 1 else (f"{plan.leftover_batches} batches make", "their")
    )
    return text + (
        f"; the last {leftover} no full step: a plain `if (i + 1) % {plan.grad_accum} == 0` "
        f"loop adds {their} gradients to the next epoch's first step (lost after the last epoch, or every epoch where "
        "the loop zeroes gradients as an epoch starts)"
    )


def _learning_rate(plan: DdpPlan) -> str:
    scale, root = plan.lr_scale, plan.lr_scale**0.5
    reference = f"one process with batch {plan.batch_size:,} and no accumulation"
    if plan.base_lr is None or plan.linear_lr is None or plan.sqrt_lr is None:
        return (
            f"the learning rate of {reference}, ×{scale:g} (linear) or ×{root:.4g} (square root); "
            "--base-lr gives the figures"
        )
    return (
        f"{plan.linear_lr:.6g} linear (×{scale:g}), {plan.sqrt_lr:.6g} square root (×{root:.4g}), from "
        f"{plan.base_lr:.6g} for {reference}"
    )


def _keep_batch_table(plan: DdpPlan) -> Group:
    title = Text.assemble(
        (f"Keep the effective batch of {plan.effective_batch_size:,} at another world size", "bold"),
        (
            f": set the batch per rank (accumulating {plural(plan.grad_accum, 'batch')}) or the batches accumulated "
            f"(batch {plan.batch_size:,} per rank) to",
            "dim",
        ),
    )
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 1))
    table.add_column("ranks", justify="right", no_wrap=True)
    table.add_column("batch per rank", justify="right", no_wrap=True)
    table.add_column("or accumulate", justify="right", no_wrap=True)
    table.add_column("")
    for row in plan.same_effective_batch:
        here = row.world_size == plan.world_size
        table.add_row(
            str(row.world_size),
            _amount(row.batch_size, row.batch_size_is_whole),
            _amount(row.grad_accum, row.grad_accum_is_whole),
            _row_note(row, here, plan.effective_batch_size),
            style="bold" if here else None,
        )
    return Group(title, Padding(table, (0, 0, 0, 2)))


def _many(count: int, noun: str) -> str:
    """plural() with a thousands separator: '10,000 samples'."""
    words = plural(count, noun)
    return f"{count:,}{words[len(str(count)) :]}"


def _amount(value: float, whole: bool) -> str:
    return f"{int(value):,}" if whole else f"[yellow]{value:.4g}[/]"


def _row_note(row: SameEffectiveBatch, here: bool, effective_batch_size: int) -> str:
    if here:
        return "this plan"
    if row.batch_size_is_whole and row.grad_accum_is_whole:
        return ""
    if not row.batch_size_is_whole and not row.grad_accum_is_whole:
        share, remainder = divmod(effective_batch_size, row.world_size)
        if remainder:
            return f"[yellow]not kept: {effective_batch_size:,} is no multiple of {row.world_size}[/]"
        return f"[yellow]change both: batch × accumulation = {share:,}[/]"
    return "[dim]a fraction is no setting[/]"
