"""tune()'s inputs and the limits it searches within: sizes, trial lengths, start methods, budgets."""

from __future__ import annotations

import pytest
import torch
from recordings import GIB, make_host, make_iterators, make_recording
from torch.utils.data import DataLoader, TensorDataset

from loaderdoctor import tune
from loaderdoctor.errors import UsageError
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.tune.run import MAX_WORKERS, MIN_TRIAL_S, limits_for, parse_size, trial_seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [("8G", 8 * GIB), ("512M", 512 * 2**20), ("1.5GiB", int(1.5 * GIB)), ("2gb", 2 * GIB), ("1000", 1000), (42, 42)],
)
def test_sizes_are_read_in_the_usual_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1G", "0", "8X"])
def test_a_size_that_cannot_be_read_is_a_usage_error(text):
    with pytest.raises(UsageError, match=r"size|more than 0"):
        parse_size(text)


def test_trials_get_a_share_of_the_budget_within_bounds():
    assert trial_seconds(160.0) == 10.0
    assert trial_seconds(48.0) == 3.0
    assert trial_seconds(5.0) == MIN_TRIAL_S
    assert trial_seconds(48.0, quick=True) == 6.0


def _spec(**loader_kwargs) -> LoaderSpec:
    return LoaderSpec.from_loader(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, **loader_kwargs))


def test_fork_is_left_out_of_the_search_when_the_baseline_saw_a_hazard():
    hazard = make_recording(settings=Settings(), iterators=make_iterators(2, None, threads=["prefetcher"]))
    assert limits_for(_spec(), hazard, GIB, None).start_method == "forkserver"
    assert limits_for(_spec(), make_recording(settings=Settings()), GIB, None).start_method is None


def test_the_users_own_start_method_is_kept_when_it_is_not_fork():
    hazard = make_recording(settings=Settings(), iterators=make_iterators(2, None, threads=["prefetcher"]))
    spec = _spec(num_workers=1, multiprocessing_context="spawn")
    assert limits_for(spec, hazard, GIB, None).start_method == "spawn"


def test_the_worker_ceiling_respects_the_file_descriptor_limit_and_the_callers_cap():
    few_fds = make_recording(host=make_host(fd_soft_limit=256, open_fds=64))
    assert limits_for(_spec(), few_fds, GIB, None).max_workers == (256 - 64) // 16
    many_fds = make_recording(host=make_host(fd_soft_limit=65536))
    assert limits_for(_spec(), many_fds, GIB, None).max_workers == MAX_WORKERS
    assert limits_for(_spec(), many_fds, GIB, 6).max_workers == 6


def test_cores_are_shared_by_the_local_ranks():
    rec = make_recording(host=make_host(usable_cores=8.0, local_ranks=4))
    assert limits_for(_spec(), rec, GIB, None).cores == 2.0


def test_a_budget_too_small_to_tune_is_refused_before_anything_runs():
    with pytest.raises(UsageError, match="too small to tune"):
        tune(DataLoader(TensorDataset(torch.arange(8.0))), budget_s=2.0)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_max_workers_must_be_a_positive_whole_number(bad):
    with pytest.raises(UsageError, match="max_workers"):
        tune(DataLoader(TensorDataset(torch.arange(8.0))), max_workers=bad)
