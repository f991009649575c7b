"""The parts of a Recording that lower layers produce live in those layers (plain data at or below the layer that
reads it), and a Recording saved before they moved there loads and saves the same JSON."""

from __future__ import annotations

import json
from pathlib import Path

from test_layers import LAYER_OF, imports_running_back_up

from loaderdoctor.host.facts import HostFacts, OtherProcess, StrayProcess
from loaderdoctor.host.forkhazards import AliveThread, IteratorFacts
from loaderdoctor.plain.frames import StackFrame
from loaderdoctor.recording.record import Recording
from loaderdoctor.workers.deaths import WorkerDeath
from loaderdoctor.workers.readings import HostReading, WorkerReading, WorkerStack

# Written by Recording.to_dict() on main 8f84b53, when every part of a Recording lived in recording/record.py:
# every kind of part present at least once.
SAVED_BEFORE_THE_MOVE = Path(__file__).parents[1] / "saved" / "recording-8f84b53.json"


def test_below_the_recording_no_module_imports_from_a_layer_above():
    below = {part for part, layer in LAYER_OF.items() if layer < LAYER_OF["recording"]}
    found = imports_running_back_up()  # 'loaderdoctor.tap.iterator -> loaderdoctor.recording.record'
    assert [line for line in found if line.split(" ")[0].rstrip(":").split(".")[1] in below] == []


def test_a_recording_saved_before_its_parts_moved_down_saves_the_same_json():
    text = SAVED_BEFORE_THE_MOVE.read_text()
    rec = Recording.from_dict(json.loads(text))
    saved_again = rec.to_dict()
    for batch in saved_again["batches"]:  # fields added since, at their defaults: the only difference allowed
        assert batch.pop("step_run_delay_s") is None
        assert batch.pop("after_restart") is False
    for epoch in saved_again["epochs"]:
        assert epoch.pop("restarts") == 0
    assert saved_again.pop("ceiling") is None
    for sample in saved_again["worker_samples"]:
        assert sample.pop("thread_cpu_s") is None
    for process in saved_again["other_processes"]:
        assert process.pop("same_user") is None
    added = ("sampler", "sampler_distributed", "samples_per_epoch", "drawn_indices", "drawn_fingerprints",
             "loader_class")  # fmt: skip
    assert [saved_again.pop(name) for name in added] == ["", None, None, None, [], ""]
    assert json.dumps(saved_again, indent=1) + "\n" == text


def test_its_parts_are_rebuilt_as_the_classes_of_the_layers_that_produce_them():
    rec = Recording.from_dict(json.loads(SAVED_BEFORE_THE_MOVE.read_text()))
    assert rec.stall is not None
    stack = rec.stall.stacks[0]
    rebuilt = {
        HostFacts: rec.host,
        StrayProcess: rec.host.stray_workers[0],
        OtherProcess: rec.other_processes[0],
        IteratorFacts: rec.iterators[0],
        AliveThread: rec.iterators[0].threads[0],
        WorkerReading: rec.worker_samples[0],
        HostReading: rec.host_samples[0],
        WorkerStack: stack,
        StackFrame: stack.stuck_frame,
        WorkerDeath: rec.worker_deaths[0],
    }
    assert {cls: type(part) for cls, part in rebuilt.items()} == {cls: cls for cls in rebuilt}
    assert stack.stuck_at() == "pid 11 at a.py:1 in f"
