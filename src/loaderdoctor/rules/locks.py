"""Rule about workers that wait on a lock: the line where they wait, which lock, what it costs the training
loop, and whether the lock may go (a lock around reads of read-only files) or guards writes and must stay.

The waiting is measured inside each worker (see workers/sites.py): the wall time the workers' main threads spent
at the lock call with the CPU idle, over the time they had work. Time a worker waits in torch's loop for its
next indices is left out of that total (reported apart as workers_idle_share): workers that keep up idle
there, and a lock they wait on briefly between idle stretches still costs each sample its wait.
"""

from __future__ import annotations

from loaderdoctor.plain.usercode import display_path
from loaderdoctor.plain.words import percent, plural
from loaderdoctor.recording.forksafety import recorded_hazards
from loaderdoctor.recording.record import Recording, wait_fraction
from loaderdoctor.rules.finding import Finding, time_cost_severity
from loaderdoctor.workers.activity import LockCalls, WorkerActivity, WorkerSite

# A lock site counts when the workers were seen there this often, waiting this share of their busy time.
MIN_SITE_SAMPLES = 20
MIN_WAITING_SHARE = 0.10

# Locks taken through fcntl.flock, fcntl.lockf or os.lockf: the ones a lock-free run makes no-ops on read-only
# files (see filelocks.py); the libraries lock files through them too.
_CALLED_FILE_LOCKS = ("fcntl.", "os.lockf")
_FILE_LOCK_LIBRARIES = ("filelock.", "portalocker.", "fasteners.")

SHARED_LOCK_SNIPPET = """\
with open(path, "rb") as f:
    # A file nobody writes needs no lock. Where a writer may come,
    # readers share one: they read together, a writer still waits.
    fcntl.flock(f, fcntl.LOCK_SH)
    data = f.read()"""


def contended_lock(activity: WorkerActivity) -> tuple[WorkerSite, float] | None:
    """The site where the workers waited longest on a lock, and that wait's share of the time they had work;
    None when no lock site was seen often enough."""
    busy_s = activity.busy_s
    sites = [s for s in activity.sites if s.lock is not None and s.samples >= MIN_SITE_SAMPLES]
    if busy_s <= 0 or not sites:
        return None
    site = max(sites, key=lambda s: s.waiting_s)
    return site, site.waiting_s / busy_s


def is_file_lock(lock: str) -> bool:
    """Whether a lock (as callsites.py names it) locks a file: fcntl, os.lockf, or a file-lock library."""
    return lock.startswith(_CALLED_FILE_LOCKS + _FILE_LOCK_LIBRARIES)


def lock_free_provable(activity: WorkerActivity | None) -> bool:
    """Whether the contended lock of the workers' `activity` (one rank's, or every rank's joined) can be
    measured away: it is taken through fcntl or os.lockf, which a lock-free run makes no-ops on read-only files,
    and the workers took some on read-only files."""
    found = None if activity is None else contended_lock(activity)
    if activity is None or found is None:
        return False
    lock = found[0].lock or ""
    return lock.startswith(_CALLED_FILE_LOCKS) and activity.lock_calls.read_only > 0


def lock_contention(rec: Recording) -> Finding | None:
    """The workers wait on a lock: where, which, its share of their time, and what to do about it."""
    activity = rec.worker_activity
    if activity is None or activity.lock_free:
        return None
    if rec.stall is not None and rec.start_method == "fork" and recorded_hazards(rec):
        # Workers forked while threads ran, stuck on a lock: the copy of a lock a thread held at the fork, which
        # nobody will release. fork-unsafe names that cause; the lock is its symptom.
        return None
    fraction = wait_fraction(rec)
    if rec.step_s is not None and fraction is None:
        return None  # no steady running measured (a stall): nothing says what the lock costs the loop
    return lock_finding(activity, fraction)


def lock_finding(activity: WorkerActivity, loop_wait_fraction: float | None) -> Finding | None:
    """The lock-contention finding for the workers' activity (one rank's, or every rank's joined) while the
    training loop waits for data `loop_wait_fraction` of its time (None without a training step: the loop then
    does nothing but wait for loading); None when no lock costs it enough to mention. The loop's wait times the
    workers' share of waiting on the lock estimates the share of the run the lock costs."""
    loop_waits = 1.0 if loop_wait_fraction is None else loop_wait_fraction
    found = contended_lock(activity)
    if found is None:
        return None
    site, share = found
    cost = loop_waits * share
    severity = time_cost_severity(cost)
    if share < MIN_WAITING_SHARE or severity is None or site.lock is None:
        return None
    where = f"{display_path(site.file)}:{site.line} in {site.function}"
    evidence: dict[str, object] = {
        "site": where,
        "lock": site.lock,
        "waiting_share": round(share, 3),
        "site_cpu_share": round(site.cpu_s / site.wall_s, 3) if site.wall_s > 0 else None,
        "worker_processes": activity.workers,
        "workers_idle_share": round(activity.idle_s / activity.sampled_s, 3) if activity.sampled_s > 0 else None,
        "wait_fraction": None if loop_wait_fraction is None else round(loop_wait_fraction, 3),
        "estimated_run_share": round(cost, 3),
    }
    calls = activity.lock_calls
    file_lock = is_file_lock(site.lock)
    if file_lock:
        evidence.update(
            read_only_lock_calls=calls.read_only,
            exclusive_read_only_lock_calls=calls.read_only_exclusive,
            writable_lock_calls=calls.writable,
        )
    fix, snippet = _fix(site.lock, calls) if file_lock else (_other_fix(site.lock), None)
    return Finding(
        rule="lock-contention",
        severity=severity,
        title=f"Workers wait on {site.lock} {percent(share)} of their time, at {where}",
        evidence=evidence,
        fix=fix,
        snippet=snippet,
        impact=cost,
    )


def _fix(lock: str, calls: LockCalls) -> tuple[str, str | None]:
    """What to do about a contended file lock, from the access mode of the files the workers locked."""
    if calls.writable and calls.read_only:
        return (
            f"The workers lock files opened for writing ({plural(calls.writable, 'call')}): the lock guards writes, "
            "do not remove it there; hold it only around the writes, not across slow reads. On the files opened "
            f"read-only ({plural(calls.read_only, 'call')}), a shared lock (LOCK_SH) or none lets readers run "
            "together."
        ), None
    if calls.writable:
        return (
            f"The lock is taken on files opened for writing ({plural(calls.writable, 'call')}): it guards writes, "
            "do not remove it. Hold it only around the writes themselves, not across slow reads or decoding, or "
            "give each worker a file of its own."
        ), None
    if calls.read_only_exclusive:
        return (
            f"{lock} takes an exclusive lock (LOCK_EX) on files opened read-only "
            f"({plural(calls.read_only_exclusive, 'call')}): one worker reads at a time, however many there are "
            "(and the workers of every rank, where ranks share the file). A file nobody writes needs no lock: "
            "remove it; where a writer may come, take a shared lock (LOCK_SH) to read, so that readers run "
            "together."
        ), SHARED_LOCK_SNIPPET
    if calls.read_only_shared:
        return (
            "The workers take a shared lock (LOCK_SH) on files opened read-only and still wait: another process "
            "holds an exclusive lock on the file (a writer, or a reader taking LOCK_EX): find it (`lslocks`), and "
            "hold no lock across slow reads."
        ), None
    return (
        f"No call of fcntl.flock, fcntl.lockf or os.lockf was counted for {lock}, so whether it guards writes "
        "is not known: hold it only around what it protects, not across slow reads."
    ), None


def _other_fix(lock: str) -> str:
    """What to do about a contended lock that is not a file lock."""
    if lock.startswith("sqlite3."):
        return (
            "sqlite3 waits here with the CPU idle: a writer holds the database lock (its busy wait) or its reads "
            "wait on storage. Open the database read-only in each worker (sqlite3.connect(f'file:{path}?mode=ro', "
            "uri=True); immutable=1 for a file that never changes) and keep writes out of the workers."
        )
    return (
        f"{lock} is shared by the workers (or their threads) and serialises them: hold it only around the "
        "state it protects, not across slow reads or computation, or give each worker its own."
    )
