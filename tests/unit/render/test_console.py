"""The console report's code: each line of a snippet printed whole at any terminal width, so that it pastes as
written (a comment or an expression wrapped over two lines is a SyntaxError), while the prose still wraps."""

from __future__ import annotations

import io

from recordings import make_recording
from rich.console import Console

from loaderdoctor.history.records import run_record
from loaderdoctor.render.console import render
from loaderdoctor.render.history import render_run
from loaderdoctor.report import Finding, LoaderReport, Report

SNIPPET = """\
class Shards(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        # each worker reads its own share: the shards whose number modulo num_workers is its id (or every
        # num_workers-th item of one stream)
        for shard in self.shards[info.id :: info.num_workers]:
            yield from read_records(shard, offsets=self.offsets[shard.index : shard.index + 1], decode=True)"""


def _report() -> Report:
    finding = Finding(
        "duplicate-samples",
        "critical",
        "Each of the 2 workers delivers the whole stream: every sample twice an epoch",
        {"typical_copies": 2},
        "Split the stream between the workers with get_worker_info(), as below; the fix is proved by measuring it "
        "in turns with the loader's own settings, which takes a while on a busy machine.",
        snippet=SNIPPET,
        settings_change={},
        impact=0.5,
    )
    return Report("train.py", {"train": LoaderReport("train", make_recording(), [finding], None)})


def _printed(width: int) -> list[str]:
    console = Console(record=True, width=width, file=io.StringIO())
    render(_report(), console)
    return console.export_text().splitlines()


def test_a_snippet_prints_whole_lines_that_compile_at_any_width_while_prose_wraps():
    for width in (40, 60, 80):
        lines = _printed(width)
        first = lines.index("    class Shards(IterableDataset):")
        code = [line.removeprefix("    ") for line in lines[first : first + len(SNIPPET.splitlines())]]
        assert code == SNIPPET.splitlines()
        compile("\n".join(code), "<pasted>", "exec")  # what a user pastes runs
        # the words around the code still wrap at the width
        assert all(len(line) <= width for line in lines[:first])
        assert any("every sample twice an epoch" in line for line in lines)


def test_a_history_run_shows_its_findings_code_whole_too():
    now = "2026-11-27T10:00:00+00:00"
    record = run_record("check", "train", _report().loaders["train"], now, now, {"cpu_count": 2}, "train.py")
    console = Console(record=True, width=50, file=io.StringIO())
    render_run({"id": 1, **record.to_dict()}, console)
    text = console.export_text()
    assert all(line in text for line in SNIPPET.splitlines() if line.strip())


def _job_report() -> Report:
    straggler = Finding(
        "rank-straggler",
        "critical",
        "ranks 2, 3 on node1 wait 90 ms per batch for data",
        {"rank": 3, "ranks": [2, 3]},
        "Make their loading as fast as the others'.",
        impact=0.9,
    )
    unsplit = Finding(
        "distributed-sampler",
        "critical",
        "no DistributedSampler: each of the 4 ranks loads all 256",
        {"world_size": 4},
        "Give the DataLoader a DistributedSampler.",
        impact=1.0,
    )
    never = Finding(
        "distributed-sampler",
        "warning",
        "set_epoch() was never called",
        {"epochs": 2, "sampler_epoch": 0},
        "Call sampler.set_epoch(epoch).",
        impact=0.0,
    )
    loaders = {
        f"train.py:15/rank{rank}": LoaderReport(f"train.py:15/rank{rank}", make_recording(), findings, None)
        for rank, findings in [(0, [unsplit, never]), (1, []), (2, []), (3, [straggler])]
    }
    return Report("train.py", loaders, "run")


def test_a_jobs_findings_across_its_ranks_come_first_once_and_a_ranks_own_stay_in_its_section():
    console = Console(record=True, width=100, file=io.StringIO())
    render(_job_report(), console)
    text = console.export_text()
    heading = text.index("the job: loader 'train.py:15' across its ranks")
    first_rank = text.index("loader 'train.py:15/rank0'")
    assert heading < text.index("rank-straggler") < first_rank
    assert heading < text.index("no DistributedSampler") < first_rank
    assert text.count("rank-straggler") == 1 and text.count("no DistributedSampler") == 1
    assert first_rank < text.index("set_epoch() was never called")  # rank 0's own epochs gave it
    assert "Summary: 2 critical, 1 warning." in " ".join(text.split())


def test_a_long_runs_first_batches_are_its_first_and_last_few_with_their_median_and_longest():
    from loaderdoctor.render.console import _first_batches

    assert _first_batches([0.5, None, 0.04]) == "0.50 s, -, 0.04 s (per epoch, from iter())"
    many = _first_batches([0.9] + [0.04] * 98 + [0.06])
    assert many == (
        "0.90 s, 0.04 s, 0.04 s ... 0.04 s, 0.06 s (100 epochs: median 0.04 s, longest 0.90 s; per epoch, from iter())"
    )
