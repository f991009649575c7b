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
    (rank_turns.py: real, cached, real, cached, real, the cached turns stepping on each rank's last batch without
    asking the dispatcher, both ranks switching at the same step).
The table gives each round's ceilings and their ratio to the plain one, and the input's cost from each (points
apart). It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rank_turns import BENCHMARKS

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
else:  # plain turns (rank_turns.py)
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(Stream(), batch_size=4))

    def step(batch):
        accelerator.backward(model(**batch)["loss"])
        optimizer.step()
        optimizer.zero_grad()

    from rank_turns import turns

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
    out = work / "run.json"
    env = {**ENV, "LOADERDOCTOR_HOME": str(work / "home")}
    command = [sys.executable, "-m", "loaderdoctor", "run", "--nproc-per-node", "2", "--ceiling", "--json", str(out),
               "--no-history", str(script), str(read_s), "train", str(work / "trainer")]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    if not out.exists():
        raise SystemExit(f"run wrote no JSON: {result.stderr[-800:]}")
    loaders = json.loads(out.read_text())["loaders"].values()
    (job,) = [f for loader in loaders for f in loader["findings"] if f["rule"] == "job-ceiling"]
    return job["evidence"]


def _plain(script: Path, read_s: float, work: Path) -> tuple[float, float]:
    result = subprocess.run([*TORCHRUN, str(script), str(read_s), "turns", str(work)], env=ENV, capture_output=True,
                            text=True, timeout=600, check=True)  # fmt: skip
    line = next(line for line in result.stdout.splitlines() if line.startswith("TURNS"))
    real, cached = (float(v) for v in line.split()[1:])
    return real, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("modes", nargs="*", default=list(MODES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dispatch-ceiling-bench-") as folder:
        work = Path(folder)
        script = work / "ranks.py"
        script.write_text(SCRIPT)
        print(f"{'mode':<14} {'round':>5} {'by':<9} {'ceiling':>8} {'plain':>7} {'ratio':>6}   "
              f"{'cost':>5} {'plain':>6} {'points':>6}   real b/s (tool, plain)")  # fmt: skip
        for mode in args.modes:
            read_s = MODES[mode]
            for round_ in range(1, args.rounds + 1):
                measured = {"callback": _callback(script, read_s, work), "run": _run(script, read_s, work)}
                real, cached = _plain(script, read_s, work)
                plain_cost = max(0.0, 1 - real / cached)
                for by, job in measured.items():
                    ceiling, cost = job["ceiling_batches_per_s"], job["measured_input_cost"]
                    print(
                        f"{mode:<14} {round_:>5} {by:<9} {ceiling:>8.1f} {cached:>7.1f} {ceiling / cached:>6.2f}   "
                        f"{cost * 100:>4.0f}% {plain_cost * 100:>5.0f}% {(cost - plain_cost) * 100:>+6.1f}   "
                        f"{job['real_batches_per_s']:.1f}, {real:.1f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
