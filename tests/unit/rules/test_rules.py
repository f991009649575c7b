"""The rules on hand-made Recordings: each fires with exact figures, stays quiet below its line, and a healthy
loader gets no warning from any of them."""

from __future__ import annotations

import dataclasses
import json

import pytest
from recordings import MIB, make_host, make_iterators, make_recording, make_worker_samples

from loaderdoctor import rules
from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import (
    HostReading,
    SampleError,
    StackFrame,
    Stall,
    StrayProcess,
    WorkerDeath,
    WorkerStack,
)
from loaderdoctor.recording.usage import loading_cpu
from loaderdoctor.report import Finding
from loaderdoctor.rules.data import sample_errors
from loaderdoctor.rules.host import cpu_oversubscription, fd_limit, shm_capacity, stray_workers
from loaderdoctor.rules.memory import memory_growth, pin_memory
from loaderdoctor.rules.safety import fork_unsafe, stall
from loaderdoctor.rules.throughput import input_bound, slow_start, worker_respawn

IN_MAIN_PROCESS = Settings()
TWO_PERSISTENT = Settings(num_workers=2, persistent_workers=True)


# input-bound


def test_input_bound_in_main_process_suggests_a_worker_per_core():
    rec = make_recording(settings=IN_MAIN_PROCESS, wait_s=0.03, step_s=0.05)
    finding = input_bound(rec)
    assert finding.rule == "input-bound"
    assert finding.severity == "critical"
    assert finding.title == "The training step waits for data 38% of the time"
    assert finding.evidence == {
        "wait_fraction": 0.375,
        "wait_ms_mean": 30.0,
        "wait_ms_p50": 30.0,
        "step_ms": 50.0,
        "num_workers": 0,
        "loading_cores": 0.9,
        "available_cores": 2.0,
        "loading_cpu_share": 0.9,
        "usable_cores": 2.0,
    }
    assert finding.fix.startswith("Loading computes (the main process kept 0.9 of the 2.0 available cores busy)")
    assert finding.settings_change == {"num_workers": 2, "persistent_workers": True}
    assert finding.snippet == Settings(num_workers=2, persistent_workers=True).snippet()
    assert finding.impact == pytest.approx(0.375)


def test_another_job_taking_a_core_meanwhile_is_said_but_does_not_cut_the_fix():
    """Load from other processes comes and goes: the fix is planned for the machine's cores (a worker each),
    and the words say what the other processes took, so that the numbers add up."""
    rec = make_recording(settings=IN_MAIN_PROCESS, wait_s=0.03, step_s=0.05)
    rec.host_samples = [
        HostReading(t_s=t / 4, busy_cpu_s=(1.0 + 0.9 * 0.375) * t / 4, main_cpu_s=0.9 * 0.375 * t / 4)
        for t in range(int(rec.wall_s * 4) + 1)
    ]
    finding = input_bound(rec)
    assert finding.evidence["available_cores"] == 1.0
    assert finding.fix.startswith(
        "Loading computes (the main process kept 0.9 of the 1.0 available cores busy while other processes took "
        "1.0) in the main process, between training steps: use 2 workers, one per core,"
    )
    assert finding.settings_change == {"num_workers": 2, "persistent_workers": True}


@pytest.mark.parametrize(
    ("wait_s", "step_s", "severity"),
    [
        (0.0049, 0.0951, None),  # 4.9%: not input-bound
        (0.0051, 0.0949, "warning"),
        (0.0199, 0.0801, "warning"),
        (0.0201, 0.0799, "critical"),  # 20.1%
    ],
)
def test_input_bound_severity_lines(wait_s, step_s, severity):
    finding = input_bound(make_recording(settings=IN_MAIN_PROCESS, wait_s=wait_s, step_s=step_s))
    assert (finding and finding.severity) == severity


@pytest.mark.parametrize(
    ("workers", "cores", "suggested"),
    [
        (2, 2.0, 4),  # at least 4
        (4, 8.0, 16),  # twice the cores
        (12, 16.0, 16),  # capped
    ],
)
def test_input_bound_waiting_on_io_suggests_more_workers_than_cores(workers, cores, suggested):
    rec = make_recording(
        settings=Settings(num_workers=workers, persistent_workers=True),
        host=make_host(usable_cores=cores, cpu_count=int(cores), affinity_cores=int(cores)),
        cpu_share=0.2,
        wait_s=0.03,
    )
    finding = input_bound(rec)
    assert finding.evidence["loading_cpu_share"] == 0.2
    assert finding.settings_change == {"num_workers": suggested, "persistent_workers": True}


def test_input_bound_io_workers_grow_with_the_wait_but_fit_the_cores():
    # 2 workers, waiting 80% of the time: batches must come 5 times as often: 2 x 5 x 1.25 = 12.5 -> 13 workers.
    rec = make_recording(settings=TWO_PERSISTENT, cpu_share=0.05, wait_s=0.2)
    assert input_bound(rec).settings_change["num_workers"] == 13
    # The same wait with workers busy 40% of the time: 2 cores hold 5 of them.
    busier = make_recording(settings=TWO_PERSISTENT, cpu_share=0.4, wait_s=0.2)
    assert input_bound(busier).settings_change["num_workers"] == 5


def test_input_bound_with_cpu_bound_workers_on_every_core_changes_no_setting():
    rec = make_recording(settings=TWO_PERSISTENT, cpu_share=0.95, wait_s=0.03)
    finding = input_bound(rec)
    assert finding.severity == "critical"
    assert finding.settings_change == {}
    assert finding.snippet is None
    assert "more workers cannot help" in finding.fix


def test_input_bound_does_not_read_idle_workers_as_waiting_on_io():
    # Workers that mostly keep up (a warning-level wait) idle between batches: their low CPU share says
    # nothing about I/O, so no more workers than cores are prescribed.
    rec = make_recording(settings=TWO_PERSISTENT, cpu_share=0.2, wait_s=0.005)
    finding = input_bound(rec)
    assert finding.severity == "warning"
    assert finding.settings_change == {}


def test_input_bound_needs_a_training_step():
    assert input_bound(make_recording(settings=IN_MAIN_PROCESS, wait_s=0.05, step_s=None)) is None


# worker-respawn

SPAWN_EACH_EPOCH = Settings(num_workers=2, start_method="spawn")


@pytest.mark.parametrize(("batches_per_epoch", "severity"), [(20, "critical"), (100, "warning"), (500, None)])
def test_worker_respawn_costs_later_epochs_first_batches(batches_per_epoch, severity):
    rec = make_recording(
        settings=SPAWN_EACH_EPOCH,
        start_method="spawn",
        epochs=3,
        batches_per_epoch=batches_per_epoch,
        first_batch_s=[1.2, 1.1, 1.1],
    )
    finding = worker_respawn(rec)
    assert (finding and finding.severity) == severity
    if finding is None:
        return
    # Steady batches take 0.001 s wait + 0.05 s step; epochs 2 and 3 each lose 1.1 - 0.051 s to start-up, of an
    # epoch that would otherwise take its batches' steady time.
    share = 1.049 / (1.049 + batches_per_epoch * 0.051)
    assert finding.evidence == {
        "first_batch_s": [1.2, 1.1, 1.1],
        "respawn_s_per_epoch": 1.049,
        "respawn_share_of_epoch": round(share, 3),
        "start_method": "spawn",
        "epochs": 3,
    }
    assert finding.impact == pytest.approx(share)
    assert finding.title.endswith(f"{round(share * 100)}% of an epoch")
    assert finding.settings_change == {"persistent_workers": True}
    assert "persistent_workers=True" in finding.snippet
    assert "no longer reach the workers" in finding.fix


def test_worker_respawn_share_is_the_epochs_whatever_the_measurement_held():
    """Beside busy processes a budget holds fewer epochs (and a cut-short last one), and the first epoch's start-up
    weighs more in it: a share of the measurement changed with the load, the share of an epoch does not."""
    many = make_recording(settings=SPAWN_EACH_EPOCH, start_method="spawn", epochs=6, first_batch_s=[1.2] + [1.1] * 5)
    few = make_recording(settings=SPAWN_EACH_EPOCH, start_method="spawn", epochs=2, first_batch_s=[2.4, 1.1])
    cut = dataclasses.replace(
        few,
        epochs=[few.epochs[0], dataclasses.replace(few.epochs[1], batches=5, ended="time")],
        batches=[b for b in few.batches if b.epoch == 0 or b.index < 5],
        wall_s=few.wall_s / 2,
    )
    findings = [worker_respawn(rec) for rec in (many, few, cut)]
    assert {(f.severity, f.evidence["respawn_share_of_epoch"]) for f in findings} == {("critical", 0.507)}


def test_worker_respawn_quiet_with_persistent_workers_or_one_epoch():
    slow = {"start_method": "spawn", "first_batch_s": [1.2, 1.1, 1.1], "epochs": 3, "wall_s": 8.0}
    persistent = Settings(num_workers=2, start_method="spawn", persistent_workers=True)
    assert worker_respawn(make_recording(settings=persistent, **slow)) is None
    single = make_recording(settings=SPAWN_EACH_EPOCH, start_method="spawn", epochs=1, first_batch_s=1.2, wall_s=4.0)
    assert worker_respawn(single) is None


def test_worker_respawn_quiet_when_the_same_workers_serve_every_epoch():
    rec = make_recording(
        settings=SPAWN_EACH_EPOCH,
        epochs=3,
        first_batch_s=[1.2, 1.1, 1.1],
        worker_pids=[[7, 8]] * 3,
        wall_s=8.0,
    )
    assert worker_respawn(rec) is None


@pytest.mark.parametrize(("later_first_s", "fires"), [(1.1, True), (0.15, False)])
def test_worker_respawn_without_pids_reads_slow_first_batches(later_first_s, fires):
    # Steady batches come every 0.051 s; a first batch over 3 times that shows a restart.
    rec = make_recording(
        settings=SPAWN_EACH_EPOCH,
        epochs=3,
        first_batch_s=[1.2, later_first_s, later_first_s],
        worker_pids=[[], [], []],
        wall_s=2.0,
    )
    assert (worker_respawn(rec) is not None) == fires


def test_worker_respawn_quiet_when_restarts_are_cheap():
    rec = make_recording(settings=Settings(num_workers=2), epochs=3, first_batch_s=0.03)
    assert worker_respawn(rec) is None


def test_worker_respawn_quiet_when_restarts_are_quick_even_in_a_short_run():
    # Forked workers restart in ~30 ms: a big share of a 0.4 s loading-only run, but nothing worth fixing.
    rec = make_recording(settings=Settings(num_workers=2), epochs=3, first_batch_s=[0.04, 0.035, 0.035], wall_s=0.4)
    assert worker_respawn(rec) is None
    slow = make_recording(settings=Settings(num_workers=2), epochs=3, first_batch_s=[0.3, 0.25, 0.25], wall_s=1.0)
    assert worker_respawn(slow) is not None


# slow-start

SPAWN_PERSISTENT = Settings(num_workers=4, persistent_workers=True, start_method="spawn")


def _spawned(settings=SPAWN_PERSISTENT, first_batch_s=None, pickled=50 * MIB, wall_s=5.0, **kwargs):
    return make_recording(
        settings=settings,
        start_method=settings.start_method,
        first_batch_s=first_batch_s or [2.0, 0.05],
        pickled_dataset_bytes=pickled,
        wall_s=wall_s,
        **kwargs,
    )


def test_slow_start_with_a_large_pickled_dataset_suggests_fork_when_safe():
    finding = slow_start(_spawned())
    assert finding.rule == "slow-start"
    assert finding.severity == "critical"
    assert finding.title == "Workers take 2.0 s to start: each unpickles a 50 MB dataset"
    assert finding.evidence == {
        "pickled_dataset_mb": 50.0,
        "num_workers": 4,
        "start_method": "spawn",
        "first_batch_s": [2.0, 0.05],
        "startup_fraction": 0.41,
    }
    assert finding.impact == pytest.approx(2.05 / 5.0)
    assert finding.settings_change == {"start_method": "fork"}
    assert "__getstate__" in finding.snippet


def test_slow_start_adds_persistent_workers_when_they_restart():
    rec = _spawned(settings=Settings(num_workers=4, start_method="forkserver"), first_batch_s=[2.0, 2.0])
    assert slow_start(rec).settings_change == {"start_method": "fork", "persistent_workers": True}


def test_slow_start_keeps_the_start_method_when_fork_is_unsafe():
    threads = make_iterators(2, "spawn", threads=["uploader"])
    not_persistent = _spawned(settings=Settings(num_workers=4, start_method="spawn"), iterators=threads)
    assert slow_start(not_persistent).settings_change == {"persistent_workers": True}
    persistent = _spawned(iterators=threads)
    assert slow_start(persistent).settings_change == {}


@pytest.mark.parametrize(("wall_s", "severity"), [(5.0, "critical"), (20.0, "warning"), (100.0, "info")])
def test_slow_start_severity_follows_the_startup_share(wall_s, severity):
    assert slow_start(_spawned(wall_s=wall_s)).severity == severity


def test_slow_start_lines():
    assert slow_start(_spawned(first_batch_s=[0.99, 0.05])) is None
    # 4 workers x 8 MiB is the 32 MiB line.
    assert slow_start(_spawned(pickled=8 * MIB - 1)) is None
    assert slow_start(_spawned(pickled=8 * MIB)) is not None
    assert slow_start(_spawned(pickled=None)) is None
    forked = Settings(num_workers=4, persistent_workers=True, start_method="fork")
    assert slow_start(_spawned(settings=forked)) is None


# fork-unsafe

FORKED = Settings(num_workers=2, persistent_workers=True, start_method="fork")


def test_fork_unsafe_warns_on_threads_alive_at_fork():
    rec = make_recording(settings=FORKED, iterators=make_iterators(2, threads=["pin_memory", "metrics-uploader"]))
    finding = fork_unsafe(rec)
    assert finding.severity == "warning"
    assert finding.impact == 0.0
    assert finding.evidence == {
        "threads": ["metrics-uploader", "pin_memory"],
        "cuda_initialized": False,
        "compiled_frames": 0,
        "compile_workers": 0,
        "native_threads": 0,
        "start_method": "fork",
        "forkserver_blocker": None,
        "stalled": False,
        "worker_deaths": 0,
    }
    assert finding.settings_change == {"start_method": "forkserver", "persistent_workers": True}
    assert "multiprocessing_context='forkserver'" in finding.snippet
    assert "2 other threads ran (metrics-uploader; pin_memory)" in finding.title


@pytest.mark.parametrize("hazard", [{"cuda_initialized": True}, {"compiled_frames": 2}])
def test_fork_unsafe_warns_on_cuda_or_compiled_functions(hazard):
    finding = fork_unsafe(make_recording(settings=FORKED, iterators=make_iterators(2, **hazard)))
    assert finding.severity == "warning"
    assert all(finding.evidence[key] == value for key, value in hazard.items())


def test_fork_unsafe_keeps_fork_where_forkserver_cannot_load_the_loader():
    blocker = "the loader's collate_fn (function) cannot be pickled"
    rec = make_recording(
        settings=FORKED, iterators=make_iterators(2, threads=["tqdm_monitor"]), forkserver_blocker=blocker
    )
    finding = fork_unsafe(rec)
    assert finding.severity == "warning"
    assert finding.settings_change == {}  # never a setting that fails
    assert finding.snippet is None
    assert blocker in finding.fix and "keep fork" in finding.fix
    assert "start the loaders' workers before those threads" in finding.fix
    assert "tqdm_monitor" in finding.title


def _stall(**overrides) -> Stall:
    fields = {"epoch": 0, "batch": 3, "waited_s": 30.0, "threshold_s": 10.0, "reason": "no batch"}
    fields.update(overrides)
    return Stall(**fields)


@pytest.mark.parametrize(
    "failure", [{"stall": _stall()}, {"worker_deaths": [WorkerDeath(epoch=0, batch=3, message="killed")]}]
)
def test_fork_unsafe_is_critical_once_the_loader_hung_or_crashed(failure):
    rec = make_recording(settings=FORKED, iterators=make_iterators(2, threads=["t"]), **failure)
    finding = fork_unsafe(rec)
    assert finding.severity == "critical"
    assert finding.impact == 1.0


def test_native_thread_pools_explain_a_hang_only_when_workers_start_pools_again():
    pools = {"iterators": make_iterators(2, native_threads=3)}
    assert fork_unsafe(make_recording(settings=FORKED, **pools)) is None
    # A worker stuck with a plain thread count: the hang is not the copied pools' doing.
    assert fork_unsafe(make_recording(settings=FORKED, stall=_stall(), threads_per_worker=2, **pools)) is None
    finding = fork_unsafe(make_recording(settings=FORKED, stall=_stall(), threads_per_worker=18, **pools))
    assert finding.severity == "critical"
    assert finding.evidence["native_threads"] == 3
    assert "3 native threads ran" in finding.title


def test_a_batch_that_outlasts_the_budget_with_busy_workers_is_slow_not_hung():
    slow = _stall(over_budget=True, workers_cpu_idle=False, reason="the measuring budget ran out")
    rec = make_recording(settings=FORKED, iterators=make_iterators(2, threads=["t"]), stall=slow)
    finding = stall(rec)
    assert finding.severity == "warning"
    assert "longer than the whole measuring budget" in finding.title
    assert "--budget" in finding.fix
    assert fork_unsafe(rec).severity == "warning"  # a slow batch shows no fork hang
    idle = _stall(over_budget=True, workers_cpu_idle=True, reason="the measuring budget ran out")
    assert stall(make_recording(settings=FORKED, stall=idle)).severity == "critical"


def test_fork_unsafe_quiet_without_hazards_or_without_fork():
    assert fork_unsafe(make_recording(settings=FORKED)) is None
    threads = {"iterators": make_iterators(2, threads=["t"])}
    spawned = Settings(num_workers=2, persistent_workers=True, start_method="spawn")
    assert fork_unsafe(make_recording(settings=spawned, start_method="spawn", **threads)) is None
    # No workers yet: said, as information, only for the fix that would add them (tests/unit/rules/test_prescribe.py).
    assert fork_unsafe(make_recording(settings=IN_MAIN_PROCESS, **threads)).severity == "info"


# stall

USER_FRAME = StackFrame("/home/u/data.py", 42, "__getitem__")
LOCK_FRAME = StackFrame("/usr/lib/python3.11/threading.py", 320, "wait")
STACKS = [
    WorkerStack(pid=1001, frames=[LOCK_FRAME, USER_FRAME], stuck_frame=USER_FRAME),
    WorkerStack(
        pid=1002, frames=[LOCK_FRAME, StackFrame("/usr/lib/python3.11/queue.py", 180, "get")], stuck_frame=None
    ),
    WorkerStack(pid=1003, frames=[], stuck_frame=None),
]


def test_stall_names_the_batch_and_where_workers_are_stuck():
    hung = _stall(epoch=1, batch=7, waited_s=60.04, stacks=STACKS, workers_cpu_idle=True)
    finding = stall(make_recording(stall=hung, outcome="stalled"))
    assert finding.severity == "critical"
    assert finding.impact == 1.0
    assert finding.title == "Batch 7 of epoch 1 never came: the loop waited 60 s for it"
    assert finding.evidence == {
        "epoch": 1,
        "batch": 7,
        "waited_s": 60.0,
        "threshold_s": 10.0,
        "reason": "no batch",
        "workers_cpu_idle": True,
        "stuck_frames": [
            "pid 1001 at /home/u/data.py:42 in __getitem__",
            "pid 1002 at /usr/lib/python3.11/threading.py:320 in wait",
        ],
    }
    assert finding.settings_change == {}
    assert "/home/u/data.py:42" in finding.fix
    assert "timeout=" in finding.fix


def test_stall_points_at_fork_hazards_when_there_are_some():
    rec = make_recording(settings=FORKED, iterators=make_iterators(2, cuda_initialized=True), stall=_stall())
    assert "fork-unsafe" in stall(rec).fix


def test_stall_quiet_without_one():
    assert stall(make_recording()) is None


# sample-errors

ERRORS = [
    SampleError(epoch=0, batch=2, index=17, error_type="ValueError", message="cannot decode image"),
    SampleError(epoch=0, batch=5, index=3, error_type="ValueError", message="cannot decode image"),
    SampleError(epoch=1, batch=1, index=40, error_type="KeyError", message="'label'"),
]


def test_sample_errors_lists_the_bad_samples_and_a_subset_without_them():
    finding = sample_errors(make_recording(sample_errors=ERRORS))
    assert finding.severity == "critical"
    assert finding.impact == 1.0
    # 2 epochs x 20 batches x 8 samples delivered, and 3 that raised.
    assert finding.evidence == {
        "count": 3,
        "fraction": round(3 / 323, 4),
        "indices": [3, 17, 40],
        "error_types": {"ValueError": 2, "KeyError": 1},
        "first_message": "ValueError: cannot decode image",
    }
    assert finding.title == "3 samples raised an error while loading (0.9% of the samples seen)"
    scope = {"dataset": list(range(50))}
    exec(finding.snippet, scope)
    assert len(scope["dataset"]) == 47
    assert not {3, 17, 40} & set(scope["dataset"])


def test_sample_errors_without_indices_has_no_snippet():
    errors = [SampleError(epoch=0, batch=1, index=None, error_type="OSError", message="truncated")]
    finding = sample_errors(make_recording(sample_errors=errors))
    assert finding.evidence["indices"] == []
    assert finding.snippet is None


def test_sample_errors_shows_at_most_twenty_indices():
    errors = [SampleError(0, i, i, "ValueError", "bad") for i in range(25)]
    assert sample_errors(make_recording(sample_errors=errors)).evidence["indices"] == list(range(20))


def test_sample_errors_quiet_without_errors():
    assert sample_errors(make_recording()) is None


# cpu-oversubscription


def test_cpu_oversubscription_by_thread_pools_limits_worker_threads():
    finding = cpu_oversubscription(make_recording(settings=TWO_PERSISTENT, threads_per_worker=8))
    assert finding.severity == "warning"  # the loader still keeps up
    assert finding.title == "2 workers × 8 threads compete for 2 usable cores"
    assert finding.evidence == {
        "num_workers": 2,
        "threads_per_worker": 8,
        "local_ranks": 1,
        "usable_cores": 2.0,
        "affinity_cores": 2,
        "cgroup_cpu_quota": None,
        "cores_busy_share": 0.8,
        "loading_cores": 1.6,
        "wait_fraction": 0.02,
    }
    assert finding.settings_change == {"worker_threads": 1}
    assert "torch.set_num_threads(1)" in finding.snippet


@pytest.mark.parametrize(
    ("workers", "threads", "cpu_share"),
    [
        (2, 4, 0.8),  # 8 threads on 2 cores, 1.6 of them busy: not saturated, and at the line of 4 per core
        (4, 3, 0.2),  # 4 workers on 2 cores, 3 threads each (a plain worker's count), waiting: 0.8 cores busy
        (2, 3, 1.0),  # as many workers as cores, saturated: no competition
    ],
)
def test_cpu_oversubscription_quiet_at_its_lines(workers, threads, cpu_share):
    settings = Settings(num_workers=workers, persistent_workers=True)
    rec = make_recording(settings=settings, threads_per_worker=threads, cpu_share=cpu_share)
    assert cpu_oversubscription(rec) is None


def test_four_cpu_bound_workers_on_two_cores_compete():
    # Each gets half a core: the 2 cores are saturated, and torch itself warns of 4 workers here.
    rec = make_recording(settings=Settings(num_workers=4, persistent_workers=True), cpu_share=0.5, wait_s=0.03)
    finding = cpu_oversubscription(rec)
    assert finding.title == "4 workers compete for 2 usable cores"
    assert finding.settings_change == {"num_workers": 2}
    assert finding.evidence["cores_busy_share"] == 1.0
    assert "use 2 workers, one per usable core" in finding.fix


def _beside_other_processes(workers: int, worker_cores: float, run_delay_cores: float, other_cores: float):
    """A recording of `workers` persistent workers that used `worker_cores` in all and waited `run_delay_cores` for a
    core, while other processes of the machine took `other_cores` (of 2)."""
    rec = make_recording(settings=Settings(num_workers=workers, persistent_workers=True), wait_s=0.03)
    for sample in rec.worker_samples:
        sample.cpu_s = worker_cores / workers * sample.t_s
        sample.run_delay_s = run_delay_cores / workers * sample.t_s
    times = sorted({s.t_s for s in rec.worker_samples})
    rec.host_samples = [HostReading(t, busy_cpu_s=(worker_cores + other_cores) * t, main_cpu_s=0.0) for t in times]
    return rec


def test_workers_that_wait_while_other_processes_fill_the_cores_do_not_compete():
    """4 workers held up by a lock (0.3 cores, hardly ever kept from a core) on a machine other jobs keep busy:
    fewer workers would not give anyone a core back."""
    rec = _beside_other_processes(4, worker_cores=0.3, run_delay_cores=0.05, other_cores=1.7)
    assert loading_cpu(rec).machine_share >= 0.85  # the cores were busy: not with loading
    assert cpu_oversubscription(rec) is None


def test_cpu_bound_workers_beside_other_processes_still_compete():
    """4 CPU-bound workers beside a hog: they got 1 core, and were ready to run for 3 more."""
    rec = _beside_other_processes(4, worker_cores=1.0, run_delay_cores=3.0, other_cores=1.0)
    finding = cpu_oversubscription(rec)
    assert finding is not None and finding.settings_change == {"num_workers": 2}


def test_the_workers_of_every_local_rank_count_against_the_cores():
    # 2 workers would fit 2 cores; 2 DDP ranks on the machine start 2 each, and the cores are saturated.
    settings = Settings(num_workers=2, persistent_workers=True)
    alone = make_recording(settings=settings, threads_per_worker=3, cpu_share=1.0)
    assert cpu_oversubscription(alone) is None
    ranks = make_recording(settings=settings, threads_per_worker=3, cpu_share=1.0, host=make_host(local_ranks=2))
    finding = cpu_oversubscription(ranks)
    assert finding.title == "2 ranks × 2 workers compete for 2 usable cores"
    assert finding.settings_change == {"num_workers": 1}
    assert finding.evidence["local_ranks"] == 2
    assert "per rank: the 2 ranks here share the cores" in finding.fix


def test_cpu_oversubscription_by_too_many_workers_is_critical_when_the_step_starves():
    rec = make_recording(settings=Settings(num_workers=5, persistent_workers=True), wait_s=0.03)
    finding = cpu_oversubscription(rec)
    assert finding.severity == "critical"
    assert finding.title == "5 workers compete for 2 usable cores"
    assert finding.settings_change == {"num_workers": 2}
    assert finding.impact == pytest.approx(0.375)


def test_cpu_oversubscription_without_a_step_is_a_warning():
    rec = make_recording(settings=TWO_PERSISTENT, step_s=None, threads_per_worker=8, cpu_share=1.0)
    finding = cpu_oversubscription(rec)
    assert finding.severity == "warning"
    assert finding.impact == 0.0


def test_cpu_oversubscription_quiet_for_many_workers_waiting_on_io():
    rec = make_recording(settings=Settings(num_workers=8, persistent_workers=True), cpu_share=0.2)
    assert cpu_oversubscription(rec) is None


def test_cpu_oversubscription_explains_an_affinity_mask():
    host = make_host(cpu_count=16, affinity_cores=1, usable_cores=1.0)
    finding = cpu_oversubscription(make_recording(settings=Settings(num_workers=4), host=host))
    assert finding.settings_change == {"num_workers": 1}
    assert "affinity allows 1 of 16 CPUs" in finding.fix


# memory-growth

LONG_RUN = {"settings": TWO_PERSISTENT, "wall_s": 60.0}


def _growing(growth_mb: float):
    return lambda t: 200.0 + growth_mb * t / 60.0


def test_memory_growth_critical_for_a_steady_climb():
    finding = memory_growth(make_recording(uss_mb_at=_growing(300), **LONG_RUN))
    assert finding.severity == "critical"
    # From each worker's first sample after its first batch (at 0.25 s) to the end of the run.
    assert finding.evidence == {
        "workers": 2,
        "uss_start_mb": 201.2,
        "uss_end_mb": 500.0,
        "growth_mb_per_worker": 298.8,
        "growth_mb_per_min": 300.0,
        "seconds": 59.8,
        "start_method": "fork",
        "still_rising": True,
        "local_ranks": 1,
        "total_mb": 597.5,
    }
    assert finding.settings_change == {}
    assert finding.impact == pytest.approx(298.75 / 1024)
    assert "13246" in finding.fix  # copy-on-read: forked workers


def test_memory_growth_of_spawned_workers_gets_no_copy_on_read_advice():
    spawned = Settings(num_workers=2, persistent_workers=True, start_method="spawn")
    rec = make_recording(uss_mb_at=_growing(300), settings=spawned, start_method="spawn", wall_s=60.0)
    finding = memory_growth(rec)
    assert "13246" not in finding.fix and "copy-on-read" not in finding.fix
    assert "lru_cache" in finding.snippet


def test_a_spawned_workers_start_up_is_not_growth():
    # Each worker imports torch until its first batch at 4 s (42 -> 235 MB), then stays level.
    spawned = Settings(num_workers=2, persistent_workers=True, start_method="spawn")
    rec = make_recording(
        uss_mb_at=lambda t: 42.0 + 193.0 * min(t, 4.0) / 4.0,
        settings=spawned,
        start_method="spawn",
        first_batch_s=[4.0, 0.01],
        wall_s=8.0,
    )
    assert memory_growth(rec) is None


@pytest.mark.parametrize(
    ("growth_mb", "severity"), [(63.0, None), (64.0, "warning"), (255.0, "warning"), (256.0, "critical")]
)
def test_memory_growth_lines(growth_mb, severity):
    # growth_mb from the first sample after start-up (0.25 s) to the last (60 s).
    uss_mb_at = lambda t: 200.0 + growth_mb * max(0.0, t - 0.25) / 59.75  # noqa: E731
    finding = memory_growth(make_recording(uss_mb_at=uss_mb_at, **LONG_RUN))
    assert (finding and finding.severity) == severity


def test_memory_growth_levelled_off_is_named_as_a_one_time_copy_not_a_leak():
    # 150 MB in the first 15 s (a cache filled once, or copy-on-read), flat after: see test_memory.py.
    rec = make_recording(uss_mb_at=lambda t: 200.0 + 10.0 * min(t, 15.0), **LONG_RUN)
    finding = memory_growth(rec)
    assert finding.severity == "warning" and finding.evidence["still_rising"] is False
    assert "leak" not in finding.title + finding.fix


def test_memory_growth_needs_enough_samples():
    two_samples = make_worker_samples([1000, 1001], 60.0, every_s=60.0, uss_mb_at=_growing(300))
    assert memory_growth(make_recording(worker_samples=two_samples, **LONG_RUN)) is None
    assert memory_growth(make_recording(settings=IN_MAIN_PROCESS)) is None


# shm-capacity


def _shm(batch_mb: float, workers: int, free_mb: float = 64.0, ranks: int = 1):
    host = make_host(shm_free_bytes=int(free_mb * MIB), shm_total_bytes=int(free_mb * MIB), local_ranks=ranks)
    settings = Settings(num_workers=workers, persistent_workers=True)
    return make_recording(settings=settings, batch_bytes=int(batch_mb * MIB), host=host)


def test_shm_capacity_critical_when_batches_in_flight_exceed_free_shm():
    finding = shm_capacity(_shm(batch_mb=10, workers=4))
    assert finding.severity == "critical"
    assert finding.impact == 1.0
    assert finding.evidence == {
        "batch_mb": 10.0,
        "prefetch_factor": 2,
        "num_workers": 4,
        "local_ranks": 1,
        "shm_in_flight_mb": 80.0,
        "shm_free_mb": 64.0,
        "shm_total_mb": 64.0,
    }
    # Prefetch 1 and 3 workers hold 30 MB: under half the free 64 MB.
    assert finding.settings_change == {"prefetch_factor": 1, "num_workers": 3}
    assert "--shm-size" in finding.fix


def test_shm_capacity_counts_every_local_rank():
    finding = shm_capacity(_shm(batch_mb=10, workers=2, ranks=2))
    assert finding.evidence["shm_in_flight_mb"] == 80.0
    assert finding.settings_change == {"prefetch_factor": 1, "num_workers": 1}


def test_shm_capacity_changes_no_setting_when_none_fits():
    assert shm_capacity(_shm(batch_mb=100, workers=2)).settings_change == {}


@pytest.mark.parametrize(("batch_mb", "severity"), [(5.0, "warning"), (4.125, "warning"), (4.0, None)])
def test_shm_capacity_warns_over_half_the_free_space(batch_mb, severity):
    # 4 workers x prefetch 2: 40 MB and 33 MB are over half of 64 MB, 32 MB is exactly half.
    finding = shm_capacity(_shm(batch_mb=batch_mb, workers=4))
    assert (finding and finding.severity) == severity
    if finding:
        assert finding.settings_change == {}


def test_shm_capacity_quiet_without_workers():
    assert shm_capacity(_shm(batch_mb=100, workers=0)) is None


# fd-limit


def _fds(open_fds: int, limit: int, strategy: str = "file_descriptor"):
    host = make_host(open_fds=open_fds, fd_soft_limit=limit, sharing_strategy=strategy)
    return make_recording(settings=Settings(num_workers=4, persistent_workers=True), host=host)


def test_fd_limit_warns_near_the_limit():
    finding = fd_limit(_fds(open_fds=1000, limit=1024))
    assert finding.severity == "warning"
    assert finding.evidence == {
        "open_fds": 1000,
        "fds_in_flight_estimate": 16,  # 4 workers x prefetch 2 x 2 tensors
        "fd_soft_limit": 1024,
        "sharing_strategy": "file_descriptor",
        "num_workers": 4,
        "prefetch_factor": 2,
    }
    assert finding.settings_change == {}
    assert "setrlimit" in finding.snippet


def test_fd_limit_critical_over_the_limit():
    finding = fd_limit(_fds(open_fds=1010, limit=1024))
    assert finding.severity == "critical"
    assert finding.impact == 1.0


@pytest.mark.parametrize(("open_fds", "fires"), [(784, False), (785, True)])
def test_fd_limit_line_is_eighty_percent(open_fds, fires):
    assert (fd_limit(_fds(open_fds=open_fds, limit=1000)) is not None) == fires


def test_fd_limit_quiet_with_the_file_system_strategy():
    assert fd_limit(_fds(open_fds=1020, limit=1024, strategy="file_system")) is None


# stray-workers


def _strays(*cpu_percents: float):
    strays = [
        StrayProcess(pid=4242 + i, cmdline="python train.py --lr 0.1 " + "x" * 200, cpu_percent=cpu, age_s=3600)
        for i, cpu in enumerate(cpu_percents)
    ]
    return make_recording(host=make_host(stray_workers=strays))


def test_stray_workers_critical_when_they_take_cores():
    finding = stray_workers(_strays(30.0, 30.0))
    assert finding.severity == "critical"
    assert finding.title == "2 worker processes left from earlier runs use 60% CPU"
    assert finding.evidence["pids"] == [4242, 4243]
    assert finding.evidence["cpu_percent"] == 60.0
    assert finding.evidence["programs"] == ["python train.py"]  # not its arguments
    assert finding.fix.count("kill 4242 4243") == 1 and finding.snippet is None  # the kill line once
    assert finding.impact == pytest.approx(0.3)  # 0.6 of a core out of 2


def test_stray_workers_warning_at_the_line_and_quiet_without_strays():
    assert stray_workers(_strays(25.0, 25.0)).severity == "warning"
    assert stray_workers(_strays(10.0)).title == "1 worker process left from earlier runs uses 10% CPU"
    assert stray_workers(make_recording()) is None


# pin-memory


def test_pin_memory_without_an_accelerator_is_info():
    rec = make_recording(settings=Settings(num_workers=2, persistent_workers=True, pin_memory=True))
    finding = pin_memory(rec)
    assert finding.severity == "info"
    assert finding.settings_change == {"pin_memory": False}
    assert "pin_memory" not in finding.snippet


@pytest.mark.parametrize(("batch_bytes", "fires"), [(2 * MIB, True), (MIB - 1, False)])
def test_pin_memory_suggested_for_large_batches_to_cuda(batch_bytes, fires):
    rec = make_recording(host=make_host(accelerator="cuda"), batch_bytes=batch_bytes)
    finding = pin_memory(rec)
    assert (finding is not None) == fires
    if finding:
        assert finding.severity == "info"
        assert finding.evidence == {"pin_memory": False, "accelerator": "cuda", "batch_mb": 2.0}
        assert "non_blocking=True" in finding.snippet


def test_pin_memory_quiet_when_set_right():
    pinned = Settings(num_workers=2, persistent_workers=True, pin_memory=True)
    assert pin_memory(make_recording(settings=pinned, host=make_host(accelerator="cuda"), batch_bytes=2 * MIB)) is None
    assert pin_memory(make_recording()) is None


# all rules together

HEALTHY = {
    "two persistent workers": make_recording(),
    "loading in the main process, fast enough": make_recording(settings=IN_MAIN_PROCESS, wait_s=0.001),
    "no training step": make_recording(step_s=None),
    "spawned workers with a small dataset": make_recording(
        settings=Settings(num_workers=2, persistent_workers=True, start_method="spawn"),
        start_method="spawn",
        first_batch_s=[1.5, 0.05],
        pickled_dataset_bytes=MIB,
    ),
    "pinned batches to cuda": make_recording(
        settings=Settings(num_workers=2, persistent_workers=True, pin_memory=True),
        host=make_host(accelerator="cuda"),
        batch_bytes=2 * MIB,
    ),
    "eight workers reading files": make_recording(
        settings=Settings(num_workers=8, persistent_workers=True), cpu_share=0.2
    ),
}


@pytest.mark.parametrize("name", HEALTHY)
def test_a_healthy_loader_gets_no_warning_from_any_rule(name):
    findings = rules.diagnose(HEALTHY[name])
    assert [f.rule for f in findings if f.severity != "info"] == []


def test_the_default_recording_gets_no_finding_at_all():
    assert rules.diagnose(make_recording()) == []


def test_every_rule_is_quiet_on_an_empty_recording():
    empty = make_recording(epochs=0, worker_samples=[])
    assert [rule(empty) for rule in rules.RULES] == [None] * len(rules.RULES)


def test_findings_are_json_ready_and_carry_their_rule_ids():
    rec = make_recording(
        settings=Settings(num_workers=2, start_method="fork"),
        iterators=make_iterators(2, threads=["t"]),
        stall=_stall(stacks=STACKS),
        sample_errors=ERRORS,
        threads_per_worker=8,
        wait_s=0.03,
        host=make_host(stray_workers=[StrayProcess(9, "python", 80.0, 10.0)], open_fds=1020),
    )
    findings = rules.diagnose(rec)
    assert {f.rule for f in findings} == {
        "stall",
        "fork-unsafe",
        "sample-errors",
        "cpu-oversubscription",
        "stray-workers",
        "fd-limit",
        "input-bound",
    }
    json.dumps([f.to_dict() for f in findings])
    json.dumps([f.settings_change for f in findings])


# order


def _finding(rule: str, severity: str, impact: float) -> Finding:
    return Finding(rule=rule, severity=severity, title="", evidence={}, fix="", impact=impact)


def test_order_puts_severity_first_then_causes_then_impact():
    findings = [
        _finding("pin-memory", "info", 0.0),
        _finding("input-bound", "warning", 0.1),
        _finding("cpu-oversubscription", "warning", 0.1),
        _finding("stall", "critical", 1.0),
        _finding("fork-unsafe", "critical", 1.0),
        _finding("worker-respawn", "warning", 0.15),
    ]
    assert [f.rule for f in rules.order(findings)] == [
        "fork-unsafe",
        "stall",
        "worker-respawn",
        "cpu-oversubscription",
        "input-bound",
        "pin-memory",
    ]


def test_diagnose_puts_fork_unsafe_before_the_stall_it_caused():
    rec = make_recording(settings=FORKED, iterators=make_iterators(2, threads=["t"]), stall=_stall())
    assert [f.rule for f in rules.diagnose(rec)] == ["fork-unsafe", "stall"]


def test_diagnose_puts_oversubscription_before_the_wait_it_causes():
    rec = make_recording(settings=TWO_PERSISTENT, threads_per_worker=8, wait_s=0.03)
    findings = rules.diagnose(rec)
    assert [(f.rule, f.severity) for f in findings] == [
        ("cpu-oversubscription", "critical"),
        ("input-bound", "critical"),
    ]
