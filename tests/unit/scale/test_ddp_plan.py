"""The DDP plan says what torch's DistributedSampler and DataLoader really give each rank (checked against torch
itself), and `loaderdoctor plan` prints it and its JSON."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console
from torch.utils.data import DataLoader, DistributedSampler

from loaderdoctor.cli import main
from loaderdoctor.errors import UsageError
from loaderdoctor.render import plan as plan_render
from loaderdoctor.scale.plan import DdpPlan, ddp_plan

# (dataset_size, batch_size, world_size, grad_accum, drop_last, sampler_drop_last)
CASES = [
    pytest.param(10_000, 8, 4, 1, False, False, id="issue-example-313"),
    pytest.param(10_000, 8, 4, 1, True, False, id="issue-example-loader-drop-last"),
    pytest.param(100, 10, 1, 1, False, False, id="one-rank-divisible"),
    pytest.param(101, 10, 1, 1, False, False, id="one-rank-partial-batch"),
    pytest.param(103, 8, 4, 1, False, False, id="uneven-ranks-padded"),
    pytest.param(103, 8, 4, 1, False, True, id="uneven-ranks-sampler-drops"),
    pytest.param(103, 8, 4, 1, True, True, id="both-drop-last"),
    pytest.param(96, 8, 4, 1, False, True, id="even-ranks-sampler-drop-last-drops-nothing"),
    pytest.param(5, 2, 8, 1, False, False, id="more-ranks-than-samples"),
    pytest.param(5, 2, 8, 1, False, True, id="more-ranks-than-samples-sampler-drops-all"),
    pytest.param(3, 2, 16, 1, False, False, id="padding-larger-than-dataset"),
    pytest.param(30, 16, 4, 1, False, False, id="batch-larger-than-share"),
    pytest.param(30, 16, 4, 1, True, False, id="batch-larger-than-share-drop-last"),
    pytest.param(1000, 8, 4, 4, False, False, id="accumulation-even"),
    pytest.param(1000, 8, 3, 4, False, False, id="accumulation-leftover"),
    pytest.param(1000, 8, 3, 4, True, False, id="accumulation-leftover-drop-last"),
    pytest.param(64, 8, 2, 5, True, True, id="accumulation-more-than-leftover"),
]


def _what_torch_does(dataset_size, batch_size, world_size, grad_accum, drop_last, sampler_drop_last) -> dict:
    """Run a real DistributedSampler and DataLoader for every rank, and a plain `(i + 1) % A` accumulation loop."""
    dataset = range(dataset_size)
    drawn: list[int] = []
    per_rank = []
    for rank in range(world_size):
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, drop_last=sampler_drop_last)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last)
        batches = [batch.tolist() for batch in loader]
        assert len(batches) == len(loader)
        steps = sum(1 for i in range(len(batches)) if (i + 1) % grad_accum == 0)
        drawn.extend(sampler)
        per_rank.append(
            {
                "samples_per_rank": len(sampler),
                "batches_per_rank": len(loader),
                "last_batch_size": len(batches[-1]) if batches else 0,
                "dropped_by_loader_per_rank": len(sampler) - sum(len(batch) for batch in batches),
                "optimizer_steps": steps,
                "leftover_batches": len(batches) - steps * grad_accum,
            }
        )
    assert all(rank == per_rank[0] for rank in per_rank)  # every rank gets the same figures
    return {
        **per_rank[0],
        "total_samples": len(drawn),
        "repeated_samples": len(drawn) - len(set(drawn)),
        "dropped_by_sampler": dataset_size - len(set(drawn)),
    }


@pytest.mark.parametrize(
    ("dataset_size", "batch_size", "world_size", "grad_accum", "drop_last", "sampler_drop_last"), CASES
)
def test_the_plan_matches_what_torch_does(
    dataset_size, batch_size, world_size, grad_accum, drop_last, sampler_drop_last
):
    plan = ddp_plan(
        dataset_size,
        batch_size,
        world_size,
        grad_accum=grad_accum,
        drop_last=drop_last,
        sampler_drop_last=sampler_drop_last,
    )
    torch_figures = _what_torch_does(dataset_size, batch_size, world_size, grad_accum, drop_last, sampler_drop_last)
    assert {key: getattr(plan, key) for key in torch_figures} == torch_figures
    assert plan.effective_batch_size == batch_size * world_size * grad_accum


def test_ten_thousand_samples_batch_8_on_4_ranks_is_313_batches_not_312():
    plan = ddp_plan(10_000, 8, 4)
    assert plan.samples_per_rank == 2500
    assert plan.batches_per_rank == 313
    assert plan.last_batch_size == 4
    assert plan.repeated_samples == 0
    assert plan.optimizer_steps == 313
    assert plan.effective_batch_size == 32
    assert ddp_plan(10_000, 8, 4, drop_last=True).batches_per_rank == 312


def test_learning_rates_scale_from_one_process_without_accumulation():
    plan = ddp_plan(1000, 8, 4, grad_accum=2, base_lr=0.1)
    assert plan.lr_scale == 8
    assert plan.linear_lr == pytest.approx(0.8)
    assert plan.sqrt_lr == pytest.approx(0.1 * math.sqrt(8))
    unscaled = ddp_plan(1000, 8, 1)
    assert unscaled.lr_scale == 1
    assert ddp_plan(1000, 8, 1, base_lr=0.1).linear_lr == pytest.approx(0.1)
    assert unscaled.linear_lr is None and unscaled.sqrt_lr is None  # no base learning rate given


def test_what_keeps_the_effective_batch_at_other_world_sizes():
    plan = ddp_plan(1000, 6, 3, grad_accum=2)  # effective batch 36
    rows = {row.world_size: row for row in plan.same_effective_batch}
    assert sorted(rows) == [1, 2, 3, 4, 6, 8]  # 1, 2, 4, 8, the plan's own and twice it
    for size, row in rows.items():
        assert row.batch_size * size * plan.grad_accum == plan.effective_batch_size
        assert row.grad_accum * size * plan.batch_size == plan.effective_batch_size
    assert (rows[3].batch_size, rows[3].grad_accum) == (6, 2)  # the plan itself
    assert (rows[1].batch_size, rows[1].grad_accum) == (18, 6)
    assert rows[4].batch_size == 4.5 and not rows[4].batch_size_is_whole
    assert rows[4].grad_accum == 1.5 and not rows[4].grad_accum_is_whole
    assert rows[6].batch_size_is_whole and rows[6].grad_accum_is_whole  # batch 3 with 2, or batch 6 with 1


def test_the_plan_round_trips_through_json():
    plan = ddp_plan(1003, 6, 3, grad_accum=3, drop_last=True, base_lr=3e-4)
    loaded = DdpPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert loaded == plan
    assert loaded.same_effective_batch[0].batch_size_is_whole


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"dataset_size": 0}, "dataset_size must be 1 or more samples, not 0"),
        ({"batch_size": -4}, "batch_size must be 1 or more samples, not -4"),
        ({"world_size": 0}, "world_size must be 1 or more ranks, not 0"),
        ({"grad_accum": 0}, "grad_accum must be 1 or more batches, not 0"),
        ({"batch_size": 2.5}, "batch_size must be a whole number of samples, not 2.5"),
        ({"batch_size": True}, "batch_size must be a whole number of samples, not True"),
        ({"base_lr": 0.0}, "base_lr must be a positive finite number, not 0.0"),
        ({"base_lr": float("nan")}, "base_lr must be a positive finite number, not nan"),
    ],
)
def test_bad_input_is_a_usage_error_saying_what_is_wrong(arguments, words):
    values = {"dataset_size": 100, "batch_size": 8, "world_size": 2, **arguments}
    with pytest.raises(UsageError) as raised:
        ddp_plan(values.pop("dataset_size"), values.pop("batch_size"), values.pop("world_size"), **values)
    assert raised.value.message == words
    assert raised.value.hint
    assert raised.value.exit_status == 2


# the command line and the console rendering


def test_plan_command_prints_the_figures(capsys):
    argv = ["plan", "--dataset-size", "10000", "--batch-size", "8", "--world-size", "3", "--grad-accum", "4"]
    assert main([*argv, "--base-lr", "0.1"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "DDP plan 10,000 samples, batch 8 per rank, 3 ranks" in text
    assert "samples per rank 3,334 (DistributedSampler, drop_last=False): 10,002 drawn in all, 2 samples drawn" in text
    assert "batches per rank 417 per epoch (DataLoader, drop_last=False): the last holds 6 samples" in text
    assert "optimizer steps 104 per epoch (one per 4 batches accumulated); the last batch makes no full step" in text
    assert "`if (i + 1) % 4 == 0`" in text
    assert "effective batch 96 samples per optimizer step (8 per rank × 3 ranks × 4 batches accumulated)" in text
    assert "1.2 linear (×12), 0.34641 square root (×3.464), from 0.1 for one process with batch 8" in text
    assert "3 8 4 this plan" in text  # the row of its own world size in the table that keeps the effective batch
    assert "8 3 1.5 a fraction is no setting" in text


def test_plan_command_issue_example_says_313(capsys):
    assert main(["plan", "--dataset-size", "10000", "--batch-size", "8", "--world-size", "4"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "batches per rank 313 per epoch" in text
    assert "×4 (linear) or ×2 (square root)" in text  # no --base-lr: the factors


def test_plan_command_json(capsys):
    argv = ["plan", "--dataset-size", "103", "--batch-size", "8", "--world-size", "4", "--drop-last"]
    assert main([*argv, "--sampler-drop-last", "--grad-accum", "2", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "loaderdoctor.plan/1"
    assert set(document) == {"schema", "plan"}
    expected = ddp_plan(103, 8, 4, grad_accum=2, drop_last=True, sampler_drop_last=True)
    assert DdpPlan.from_dict(document["plan"]) == expected
    assert document["plan"]["samples_per_rank"] == 25
    assert document["plan"]["dropped_by_sampler"] == 3


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--dataset-size", "0", "--batch-size", "8", "--world-size", "4"], "--dataset-size must be 1 or more"),
        (["--dataset-size", "10", "--batch-size", "x", "--world-size", "4"], "--batch-size must be a whole number"),
        (["--dataset-size", "10", "--batch-size", "8", "--world-size", "-1"], "--world-size must be 1 or more ranks"),
        (["--dataset-size", "10", "--batch-size", "8"], "required: --world-size"),
        (["--dataset-size", "10", "--batch-size", "8", "--world-size", "2", "--base-lr", "-1"], "--base-lr must be"),
    ],
)
def test_plan_command_bad_values_exit_2_with_a_message(capsys, argv, words):
    assert main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert words in " ".join(captured.err.split())
    assert "hint:" in captured.err


def test_plan_command_bad_value_with_json_is_a_json_error(capsys):
    assert main(["plan", "--dataset-size", "0", "--batch-size", "8", "--world-size", "4", "--json"]) == 2
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "loaderdoctor.plan/1"
    assert "--dataset-size must be 1 or more samples" in document["error"]


def _rendered(plan: DdpPlan | dict) -> str:
    console = Console(record=True, width=80, file=io.StringIO())
    plan_render.render(plan, console)
    return console.export_text()


def test_the_rendering_reads_the_plan_or_its_dict_the_same_within_80_columns():
    plan = ddp_plan(5, 2, 8, sampler_drop_last=True)
    text = _rendered(plan)
    assert text == _rendered(plan.to_dict())
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = " ".join(text.split())
    assert "5 samples dropped (the last of the epoch's order)" in flat
    assert "the sampler leaves each rank no sample, so no rank trains" in flat


def test_the_rendering_warns_when_drop_last_leaves_no_batch():
    flat = " ".join(_rendered(ddp_plan(30, 16, 4, drop_last=True)).split())
    assert "0 per epoch (DataLoader, drop_last=True): each rank's 8 samples make no full batch" in flat
