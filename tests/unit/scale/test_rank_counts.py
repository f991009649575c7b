"""`run --nproc-per-node N` and `scale --ranks ...` refuse more ranks per node than the machine can run (issue 33.7:
100000 started a process storm), with the limit and the reason, before any process starts; LOADERDOCTOR_MAX_RANKS
moves the limit."""

from __future__ import annotations

import pytest

from loaderdoctor.cli import main
from loaderdoctor.commands import run as run_command
from loaderdoctor.commands import scale as scale_command
from loaderdoctor.host import facts as host
from loaderdoctor.job.ranks import RanksRun
from loaderdoctor.scale.launch import MAX_RANKS_ENV, rank_bound


@pytest.fixture
def launches(monkeypatch):
    """The ranks `run` would launch (none is started: a launch past the limit would be a process storm)."""
    started = []

    def run_ranks(script, topology, **options):
        started.append(topology.ranks)
        return RanksRun(0)

    monkeypatch.setattr(run_command, "run_ranks", run_ranks)
    monkeypatch.delenv(MAX_RANKS_ENV, raising=False)
    return started


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('trained')\n")
    return str(path)


def _cores(monkeypatch, cores: float) -> None:
    monkeypatch.setattr(host, "usable_cores", lambda: (cores, int(cores), None))


def _said(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())  # rich may wrap the lines


def test_run_refuses_a_rank_storm_with_the_limit_and_how_to_pass_it(monkeypatch, capsys, launches, script):
    _cores(monkeypatch, 2)
    assert main(["run", "--no-history", "--nproc-per-node", "100000", script]) == 2
    said = _said(capsys)
    assert "error: --nproc-per-node 100000 is more ranks than this machine can run: at most 16 per node" in said
    assert "2 per usable core, of 2 here" in said and f"set {MAX_RANKS_ENV}=N" in said
    assert launches == []


def test_the_limit_follows_the_usable_cores_and_never_drops_below_a_gpu_node(monkeypatch, launches):
    _cores(monkeypatch, 0.5)  # a cgroup quota of half a core
    assert rank_bound()[0] == 16
    _cores(monkeypatch, 96)
    assert rank_bound()[0] == 192


def test_run_starts_as_many_ranks_as_the_limit_allows(monkeypatch, launches, script):
    _cores(monkeypatch, 2)
    assert main(["run", "--no-history", "--nproc-per-node", "16", script]) == 0
    assert launches == [16]


def test_the_limit_can_be_moved_either_way_and_says_so(monkeypatch, capsys, launches, script):
    monkeypatch.setenv(MAX_RANKS_ENV, "4")
    assert main(["run", "--no-history", "--nproc-per-node", "5", script]) == 2
    assert f"at most 4 per node here ({MAX_RANKS_ENV} is 4)" in _said(capsys)
    monkeypatch.setenv(MAX_RANKS_ENV, "200000")
    assert main(["run", "--no-history", "--nproc-per-node", "100000", script]) == 0
    assert launches == [100000]
    monkeypatch.setenv(MAX_RANKS_ENV, "many")
    assert main(["run", "--no-history", "--nproc-per-node", "2", script]) == 2
    assert f"{MAX_RANKS_ENV} must be a whole number of ranks, 1 or more, not 'many'" in _said(capsys)
    assert launches == [100000]


def test_scale_refuses_a_rank_storm_before_measuring(monkeypatch, capsys, launches):
    measured = []
    monkeypatch.setattr(scale_command, "scale", lambda *args, **kwargs: measured.append(kwargs))
    _cores(monkeypatch, 2)
    assert main(["scale", "--no-history", "--ranks", "1,2,100000"]) == 2
    said = _said(capsys)
    assert "error: --ranks 100000 is more ranks than this machine can run: at most 16 per node" in said
    assert measured == []
