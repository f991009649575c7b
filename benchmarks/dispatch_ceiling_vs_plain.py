"""The ceiling of a two-rank training on a stream, which accelerate dispatches from rank 0 (its DataLoaderDispatcher:
rank 0 alone reads, every rank gets its slice of each step's batch), as the Hugging Face callback's `ceiling=` and
`loaderdoctor run --ceiling` measure it, against a plain two-rank loop in turns.

Usage: python benchmarks/dispatch_ceiling_vs_plain.py [--rounds N] [MODE ...]

Modes: `starved` (each sample takes 4 ms to read: rank 0 reads 8 a step, against a 20 ms step) and `compute-bound`
(0.2 ms a sample). The model: a linear layer whose forward sleeps 20 ms, standing for an accelerator's step; gloo,
the Trainer's DDP. For each mode, `rounds` times:
  - callback: torchrun, a Trainer of 300 steps with LoaderDoctorTrainerCallback(ceiling=60): the `job-ceiling`
    finding on rank 0's report (the job's batches/s with the input taken away, its real rate, the input's cost);
  - run: `loaderdoctor run --nproc-per-node 2 --ceiling` on the same Trainer without the callback: its job-ceiling;
  - plain: torchrun, the same model, optimizer and accelerate-prepared loader in a plain loop, in turns of 3 s
    (harness/ranks.py: real, cached, real, cached, real, the cached turns stepping on each rank's last batch without
    asking the dispatcher, both ranks switching at the same step).
The table gives each round's ceilings and their ratio to the plain one, and the input's cost from each (points
apart). It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import harness
from harness.ranks import BENCHMARKS

MODES = {"starved": 0.004, "compute-bound": 0.0002}  # the read of one sample, seconds

SCRIPT = """\
import json, sys, time
import torch
import transformers
from torch.utils.data import DataLoader, IterableDataset

READ_S, HOW, OUT = float(sys.argv[1]), sys.argv[2], sys.argv[3]


class Stream(IterableDataset):
    def __iter__(self):
        for index in range(10**7):
            time.sleep(READ_S)  # storage: the core is free meanwhile
            yield {"x": torch.ones(8), "labels": torch.ones(1)}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def forward(self, x, labels):
        time.sleep(0.020)  # the accelerator's step
        return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}


if HOW in ("callback", "train"):
    callbacks = []
    if HOW == "callback":
        from loaderdoctor.huggingface import LoaderDoctorTrainerCallback
        callbacks.append(LoaderDoctorTrainerCallback("bench", ceiling=60, history=False))
    args = transformers.TrainingArguments(output_dir=OUT, use_cpu=True, ddp_backend="gloo", max_steps=300,
                                          per_device_train_batch_size=4, report_to=[], save_strategy="no",
                                          logging_strategy="no", disable_tqdm=True)
    trainer = transformers.Trainer(Model(), args, train_dataset=Stream(), callbacks=callbacks)
    trainer.train()
    if callbacks and trainer.is_world_process_zero():
        report = callbacks[0].reports["bench/train"]
        (job,) = [f for f in report.findings if f.rule == "job-ceiling"]
        with open(OUT + "/callback.json", "w") as out:
            json.dump(job.evidence, out)
else:  # plain turns (harness/ranks.py)
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(Stream(), batch_size=4))

    def step(batch):
        accelerator.backward(model(**batch)["loss"])
        optimizer.step()
        optimizer.zero_grad()

    from harness.ranks import turns

    real, cached = turns(loader, step)
    if accelerator.is_main_process:
        print("TURNS", real, cached, flush=True)
"""

ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join(filter(None, [BENCHMARKS, os.environ.get("PYTHONPATH")])),
}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _callback(script: Path, read_s: float, work: Path) -> dict:
    out = work / "callback"
    out.mkdir(exist_ok=True)
    result = subprocess.run([*TORCHRUN, str(script), str(read_s), "callback", str(out)], env=ENV, capture_output=True,
                            text=True, timeout=600, check=False)  # fmt: skip
    if not (out / "callback.json").exists():
        raise SystemExit(f"the callback wrote no job-ceiling: {result.stderr[-800:]}")
    return json.loads((out / "callback.json").read_text())


def _run(script: Path, read_s: float, work: Path) -> dict:
    env = {**ENV, "LOADERDOCTOR_HOME": str(work / "home")}
    arguments = ["--nproc-per-node", "2", "--ceiling", str(script), str(read_s), "train", str(work / "trainer")]
    loaders = harness.run_json(arguments, work / "run.json", 600, env=env)["loaders"].values()
    (job,) = [f for loader in loaders for f in loader["findings"] if f["rule"] == "job-ceiling"]
    return job["evidence"]


def _plain(script: Path, read_s: float, work: Path) -> tuple[float, float]:
    result = subprocess.run([*TORCHRUN, str(script), str(read_s), "turns", str(work)], env=ENV, capture_output=True,
                            text=True, timeout=600, check=True)  # fmt: skip
    line = next(line for line in result.stdout.splitlines() if line.startswith("TURNS"))
    real, cached = (float(v) for v in line.split()[1:])
    return real, cached


COLUMNS = [
    harness.Column("mode", 14, align="<"),
    harness.Column("round", 5),
    harness.Column("by", 9, align="<"),
    harness.Column("ceiling", 8, ".1f"),
    harness.Column("plain", 7, ".1f", key="plain_ceiling"),
    harness.Column("ratio", 6, ".2f"),
    harness.Column("cost", 5, ".0f", "%", gap=2, key="cost_pct"),
    harness.Column("plain", 6, ".0f", "%", key="plain_cost_pct"),
    harness.Column("points", 6, "+.1f"),
    harness.Column("real b/s (tool, plain)", align="<", gap=2, key="real"),
]


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser(__doc__, rounds=2)
    parser.add_argument("modes", nargs="*", default=list(MODES))
    args = parser.parse_args(argv)
    table = harness.Table(COLUMNS, rule=False)
    with (
        harness.Results(__file__, args) as results,
        harness.script_folder("dispatch-ceiling-bench-", "ranks.py", SCRIPT) as script,
    ):
        work = script.parent
        table.header()
        for mode in args.modes:
            read_s = MODES[mode]
            sides = {way: functools.partial(way_of, script, read_s, work) for way, way_of in WAYS.items()}
            for round_, measured in enumerate(harness.in_turns(sides, args.rounds, order="same"), start=1):
                real, cached = measured.pop("plain")
                for by, job in measured.items():
                    against = harness.ceiling_against_plain(job["ceiling_batches_per_s"], job["measured_input_cost"],
                                                            real, cached)  # fmt: skip
                    tool_real = job["real_batches_per_s"]
                    row = table.row(mode, round_, by, *against, f"{tool_real:.1f}, {real:.1f}")
                    results.add(**row, tool_real=tool_real, plain_real=real)
            for by in ("callback", "run"):
                mine = [r for r in results.rows if r["mode"] == mode and r["by"] == by]
                results.figures[f"{mode}, by {by}: ceiling tool/plain"] = harness.median(r["ratio"] for r in mine)
                results.figures[f"{mode}, by {by}: cost points apart"] = harness.median(r["points"] for r in mine)


WAYS = {"callback": _callback, "run": _run, "plain": _plain}  # measured in this order, each round


if __name__ == "__main__":
    main()
