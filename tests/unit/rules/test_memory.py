"""The memory-growth rule on hand-made recordings: growth that still rises and growth that levelled off (a
one-time copy, as copy-on-read under fork) are both named, whatever the run's length, and small growth is not."""

from __future__ import annotations

import json

import pytest
from recordings import MIB, make_host, make_recording

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.usage import worker_samples_after_startup
from loaderdoctor.rules.memory import memory_growth

TWO_PERSISTENT = Settings(num_workers=2, persistent_workers=True)


def _copy_on_read(copied_mb: float = 340.0, over_s: float = 30.0, start_mb: float = 15.0):
    """USS of a forked worker that copies `copied_mb` of the dataset's objects over `over_s`, then holds it."""
    return lambda t: start_mb + copied_mb * min(t, over_s) / over_s


def _run(wall_s: float, uss_mb_at, settings: Settings = TWO_PERSISTENT, **fields):
    return make_recording(settings=settings, wall_s=wall_s, uss_mb_at=uss_mb_at, **fields)


def test_levelled_off_copy_is_named_with_its_cost_and_never_a_leak():
    finding = memory_growth(_run(150.0, _copy_on_read(300.0)))
    assert finding is not None
    assert finding.severity == "warning"
    evidence = finding.evidence
    assert evidence["still_rising"] is False
    assert evidence["growth_mb_per_worker"] == pytest.approx(297.5, abs=0.2)  # from its first sample at 0.25 s
    assert evidence["total_mb"] == pytest.approx(2 * evidence["growth_mb_per_worker"], abs=0.1)
    assert evidence["local_ranks"] == 1
    assert evidence["growth_mb_per_min"] is None  # a rate of a growth that stopped would only reflect the run
    assert json.loads(json.dumps(finding.to_dict()))["evidence"] == evidence  # plain JSON values
    assert "levelled off" in finding.title and f"{evidence['total_mb']:g} MB in all (2 workers)" in finding.title
    assert "13246" in finding.fix and "numpy" in finding.fix and "numpy" in finding.snippet
    words = (finding.title + finding.fix + finding.snippet).lower()
    assert "leak" not in words and "still growing" not in words


@pytest.mark.parametrize("wall_s", [20.0, 45.0, 150.0])
def test_the_same_copy_is_named_however_long_the_run(wall_s):
    # 340 MB per worker copied over 30 s: a 20 s run sees it still rising, a 150 s run sees it flat.
    finding = memory_growth(_run(wall_s, _copy_on_read()))
    assert finding is not None and finding.rule == "memory-growth"
    assert finding.severity in ("warning", "critical")
    assert finding.evidence["growth_mb_per_worker"] >= 200
    if wall_s == 20.0:
        assert finding.evidence["still_rising"] is True
    if wall_s == 150.0:
        assert finding.evidence["still_rising"] is False and "leak" not in finding.fix


def test_copies_on_every_local_rank_add_up_to_critical():
    # The case: 340 MB in each of 4 workers, on each of 8 ranks of the node: 10.6 GB of copies.
    settings = Settings(num_workers=4, persistent_workers=True)
    rec = _run(60.0, _copy_on_read(), settings=settings, host=make_host(local_ranks=8))
    finding = memory_growth(rec)
    assert finding.severity == "critical"
    assert finding.evidence["local_ranks"] == 8
    assert finding.evidence["total_mb"] == pytest.approx(32 * finding.evidence["growth_mb_per_worker"], rel=1e-3)
    assert "4 workers × 8 local ranks" in finding.title
    assert "leak" not in (finding.title + finding.fix).lower()


@pytest.mark.parametrize(
    ("workers", "copied_mb", "severity"),
    [(2, 90.0, "info"), (2, 140.0, "warning"), (16, 90.0, "warning"), (2, 63.0, None)],
)
def test_levelled_off_severity_goes_by_the_cost(workers, copied_mb, severity):
    # 90 MB in 2 workers costs 180 MB; in 16 workers, 1.4 GB.
    settings = Settings(num_workers=workers, persistent_workers=True)
    finding = memory_growth(_run(60.0, _copy_on_read(copied_mb + 0.2, over_s=10.0), settings=settings))
    assert (finding and finding.severity) == severity


def test_rising_growth_is_named_as_before():
    finding = memory_growth(_run(60.0, lambda t: 200.0 + 5.0 * t))  # 300 MB over the run, still climbing
    assert finding.severity == "critical"
    assert finding.evidence["still_rising"] is True
    assert finding.evidence["growth_mb_per_min"] == pytest.approx(300.0)
    assert "still growing" in finding.title


def test_allocator_warm_up_is_not_named():
    # A few MB as the worker's allocator and caches settle after its first batch, then flat; or a slow drift.
    assert memory_growth(_run(150.0, _copy_on_read(8.0, over_s=5.0))) is None
    assert memory_growth(_run(60.0, lambda t: 200.0 + 0.2 * t)) is None


def test_growth_of_about_a_batchs_size_is_not_named():
    # 80 MB is worth naming for batches of 96 KiB, not for batches of 40 MB: a worker holds those it built.
    grown = _copy_on_read(80.0, over_s=5.0)
    assert memory_growth(_run(60.0, grown)) is not None
    assert memory_growth(_run(60.0, grown, batch_bytes=40 * MIB)) is None


def test_a_spawned_workers_one_time_fill_gets_no_copy_on_read_advice():
    spawned = Settings(num_workers=2, persistent_workers=True, start_method="spawn")
    rec = _run(150.0, _copy_on_read(300.0), settings=spawned, start_method="spawn")
    finding = memory_growth(rec)
    assert finding.severity == "warning" and finding.evidence["still_rising"] is False
    assert "13246" not in finding.fix and "copy-on-read" not in finding.fix
    assert "lru_cache" in finding.fix and "lru_cache" in finding.snippet
    assert "leak" not in (finding.title + finding.fix).lower()


def test_growth_seen_in_too_few_readings_to_tell_its_trend_is_named_all_the_same():
    # A cache that grows 1 MiB a sample in 3 short epochs: two readings of each worker after its first batch.
    rec = _run(0.6, lambda t: 15.0 + 500.0 * t)
    assert {len(s) for s in worker_samples_after_startup(rec).values()} == {2}
    finding = memory_growth(rec)
    assert finding is not None and finding.severity == "warning"
    assert finding.evidence["still_rising"] is None and finding.evidence["growth_mb_per_worker"] >= 140
    assert "too few readings to tell whether it still grows" in finding.title
    assert "lru_cache" in finding.fix or "numpy" in finding.fix
