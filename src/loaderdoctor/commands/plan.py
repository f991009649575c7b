"""`loaderdoctor plan`: print the DDP plan of a dataset, batch size and world size, computed as torch does."""

from __future__ import annotations

import argparse
import json
import math

from rich.console import Console

from loaderdoctor.commands.arguments import add_json_arg, count
from loaderdoctor.loader.ddp import ddp_plan
from loaderdoctor.render import plan as plan_render

NAME = "plan"
SCHEMA = "loaderdoctor.plan/1"


def prepare_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        NAME, help="plan a DDP run: samples, batches and optimizer steps per rank, effective batch, learning rate"
    )
    parser.add_argument(
        "--dataset-size", type=count("samples", minimum=1), required=True, metavar="N", help="samples in the dataset"
    )
    parser.add_argument(
        "--batch-size", type=count("samples", minimum=1), required=True, metavar="B", help="the batch size per rank"
    )
    parser.add_argument(
        "--world-size", type=count("ranks", minimum=1), required=True, metavar="W", help="ranks (processes) in all"
    )
    parser.add_argument(
        "--grad-accum",
        type=count("batches", minimum=1),
        default=1,
        metavar="A",
        help="batches whose gradients are accumulated per optimizer step (default 1: none)",
    )
    parser.add_argument(
        "--drop-last", action="store_true", help="the DataLoader's drop_last: drop each rank's last, partial batch"
    )
    parser.add_argument(
        "--sampler-drop-last",
        action="store_true",
        help="DistributedSampler's drop_last: drop the dataset's tail instead of repeating samples to even out ranks",
    )
    parser.add_argument(
        "--base-lr",
        type=_learning_rate,
        default=None,
        metavar="LR",
        help="the learning rate of one process with batch B and no accumulation, to scale for the run",
    )
    add_json_arg(parser, SCHEMA)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    plan = ddp_plan(
        args.dataset_size,
        args.batch_size,
        args.world_size,
        grad_accum=args.grad_accum,
        drop_last=args.drop_last,
        sampler_drop_last=args.sampler_drop_last,
        base_lr=args.base_lr,
    )
    if args.json:
        print(json.dumps({"schema": SCHEMA, "plan": plan.to_dict()}, indent=2, allow_nan=False))
    else:
        plan_render.render(plan, out)
    return 0


def _learning_rate(text: str) -> float:
    """An argparse type: a positive, finite learning rate."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, not {text!r}")
    return value
