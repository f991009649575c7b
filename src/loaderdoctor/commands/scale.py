"""`loaderdoctor scale`: the loaders of a target under 1, 2, 4... DDP ranks (torch.distributed's elastic launcher),
the scaling efficiency, the causes across ranks, and the DDP plan."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from loaderdoctor.commands.arguments import (
    add_budget_arg,
    add_history_arg,
    add_json_arg,
    add_step_arg,
    add_target_args,
    count,
)
from loaderdoctor.commands.measuring import run_measuring
from loaderdoctor.commands.showing import add_html_arg
from loaderdoctor.render.progress import LiveProgress
from loaderdoctor.scale.launch import check_rank_count
from loaderdoctor.scale.report import SCHEMA
from loaderdoctor.scale.run import DEFAULT_BUDGET_S, DEFAULT_RANKS, scale

NAME = "scale"


def prepare_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help="measure the loaders under DDP ranks: scaling, locks, samplers")
    add_target_args(parser, "scale")
    parser.add_argument(
        "--ranks",
        type=_rank_list,
        default=list(DEFAULT_RANKS),
        metavar="1,2,4",
        help="rank counts to measure, per node (default 1,2,4)",
    )
    add_step_arg(parser, ", then a collective across the ranks as DDP's gradient all-reduce")
    add_budget_arg(parser, DEFAULT_BUDGET_S, "measuring per rank count (each launch's start on top)")
    add_json_arg(parser, SCHEMA)
    add_html_arg(parser)
    add_history_arg(parser)
    nodes = parser.add_argument_group("across machines (run the same command on every node)")
    nodes.add_argument("--nnodes", type=count("nodes", minimum=1), default=1, metavar="N", help="nodes in the job")
    nodes.add_argument(
        "--node-rank", type=count("as a node rank", minimum=0), default=0, metavar="K", help="this node's rank, 0..N-1"
    )
    nodes.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="node 0's address; the i-th rank count meets at PORT+i",
    )


def _rank_list(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be rank counts separated by commas, e.g. 1,2,4, not {text!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"must be rank counts of 1 or more, e.g. 1,2,4, not {text!r}")
    return counts


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    check_rank_count(max(args.ranks), "--ranks")

    def measure(live: LiveProgress) -> Any:
        return scale(
            args.target,
            ranks=args.ranks,
            step_ms=args.step_ms,
            budget_s=args.budget,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            rdzv_endpoint=args.rdzv_endpoint,
            progress=live.scale_update,
        )

    stopped = "every rank was ended"
    budget_s = args.budget * len(set(args.ranks))  # a launch per rank count
    return run_measuring(NAME, args, out, err, measure, stopped=stopped, budget_s=budget_s)
