"""Changes in the processes beside a run: other processes, and DataLoader workers that earlier runs left behind,
taking more cores than during the runs compared."""

from __future__ import annotations

import statistics
from typing import Any

from loaderdoctor.history.figures import (
    HOST_LOAD,
    TAKES_CORES,
    Change,
    figure,
    number,
    share,
    takes_cores,
    usable_cores,
)
from loaderdoctor.history.records import RunRecord
from loaderdoctor.host.facts import program_name
from loaderdoctor.plain.words import plural
from loaderdoctor.rules.host import CMDLINE_CHARS

# Below a tenth of a core a process is noise (OtherLoad names none below it); at most this many are named.
NAMED_CORES = 0.1
NAMED_PROCESSES = 5


def cores_taken_by_others(run: RunRecord) -> float:
    """The cores processes outside the run (stray workers apart) took during it."""
    strays = {p.get("pid") for p in _stray_list(run.host)}
    return sum((_cores(p) for p in _process_list(run.host) if p.get("pid") not in strays), 0.0)


def other_processes(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """Processes outside the run (stray workers apart) taking more cores during it than during the runs compared."""
    strays = {p.get("pid") for p in _stray_list(run.host)}
    now = [p for p in _process_list(run.host) if p.get("pid") not in strays]
    now_cores = sum((_cores(p) for p in now), 0.0)
    known_before = [r.host["other_processes"] for r in compared if isinstance(r.host.get("other_processes"), list)]
    before_cores = statistics.median(sum((_cores(p) for p in ps), 0.0) for ps in known_before) if known_before else 0.0
    rise = now_cores - before_cores
    if rise < NAMED_CORES:
        return []
    # A command line that ran as busy before too is not what changed; name the rest, busiest first.
    usual: dict[str, float] = {}
    for processes in known_before:
        for p in processes:
            usual[p.get("cmdline", "")] = usual.get(p.get("cmdline", ""), 0.0) + _cores(p) / len(known_before)
    named = [p for p in now if _cores(p) - usual.get(p.get("cmdline", ""), 0.0) >= NAMED_CORES] or now
    named = sorted(named, key=_cores, reverse=True)[:NAMED_PROCESSES]
    usable = usable_cores(run)
    of_cores = f" of {figure(usable)}" if usable else ""
    was = f" ({before_cores:.1f} before)" if before_cores >= 0.05 else ""
    fix, snippet = _fix_for_others(named, f"Other processes took {now_cores:.1f}{of_cores} cores during this run")
    return [
        Change(
            what="other_processes",
            before=round(before_cores, 2),
            now=round(now_cores, 2),
            words=f"other processes took {now_cores:.1f}{of_cores} cores{was}: {_processes_words(named)}",
            fix=fix,
            snippet=snippet,
            tier=TAKES_CORES if takes_cores(rise, usable) else HOST_LOAD,
            weight=share(rise, usable),
            processes=[_named(p, stray=False) for p in named],
        )
    ]


def _fix_for_others(named: list[dict[str, Any]], taken: str) -> tuple[str, str | None]:
    """The fix for processes that took cores, and its snippet: this user's own may be ended or reniced; another
    user's (or one whose user is unknown) is theirs, so the fix says so and proposes nothing to run on it."""
    own = [str(p.get("pid")) for p in named if p.get("same_user") is True]
    theirs = [str(p.get("pid")) for p in named if p.get("same_user") is not True]
    parts = [taken]
    if own:
        pids = " ".join(own)
        parts.append(f"yours can be ended (kill {pids}) or given a lower priority (renice -n 19 -p {pids})")
    if theirs:
        known = all(p.get("same_user") is False for p in named if str(p.get("pid")) in theirs)
        one = len(theirs) == 1
        whose = ("belongs to another user" if one else "belong to other users") if known else "may not be yours"
        owners = "its owner" if one else "their owners"
        parts.append(
            f"{'pid' if one else 'pids'} {' '.join(theirs)} {whose}: ask {owners}, or run this job where its cores "
            "are its own (a reserved node, or a CPU set of its own)"
        )
    fix = ": ".join(parts[:2]) + ("; " + parts[2] if len(parts) > 2 else "") + "."
    fix = fix[0].upper() + fix[1:]
    snippet = f"renice -n 19 -p {' '.join(own)}  # or end them: kill {' '.join(own)}" if own else None
    return fix, snippet


def stray_workers(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """Orphaned DataLoader workers of earlier runs, more of them or busier than at the runs compared."""
    strays = _stray_list(run.host)
    if not strays:
        return []
    # The 0.2 s sample at the start, or what they took during the run when the caller measured it: the larger.
    during = {p.get("pid"): _cores(p) for p in _process_list(run.host)}
    cores_of = {s.get("pid"): max(_stray_cores(s), during.get(s.get("pid"), 0.0)) for s in strays}
    now_cores = sum(cores_of.values())
    known_before = [_stray_list(r.host) for r in compared if isinstance(r.host.get("stray_workers"), list)]
    before_count = statistics.median(len(s) for s in known_before) if known_before else 0
    before_cores = statistics.median(sum(map(_stray_cores, s)) for s in known_before) if known_before else 0.0
    if len(strays) <= before_count and now_cores - before_cores < NAMED_CORES:
        return []
    strays = sorted(strays, key=lambda s: cores_of[s.get("pid")], reverse=True)
    usable = usable_cores(run)
    shown = [{**s, "cores": cores_of[s.get("pid")]} for s in strays[:NAMED_PROCESSES]]
    pids = " ".join(str(s.get("pid")) for s in strays)
    return [
        Change(
            what="stray_workers",
            before=before_count,
            now=len(strays),
            words=(
                f"{plural(len(strays), 'stray DataLoader worker')} of earlier runs took {now_cores:.1f} "
                f"{'core' if round(now_cores, 1) == 1 else 'cores'}: {_processes_words(shown)}"
            ),
            fix=(
                "DataLoader workers of earlier runs that were killed hard, whose parent is gone, take cores from "
                f"every run until they end: kill {pids}"
            ),
            snippet=f"kill {pids}",
            tier=TAKES_CORES if takes_cores(now_cores, usable) else HOST_LOAD,
            weight=share(now_cores, usable),
            processes=[_named(s, stray=True) for s in shown],
        )
    ]


def _process_list(host: dict[str, Any]) -> list[dict[str, Any]]:
    processes = host.get("other_processes")
    return [p for p in processes if isinstance(p, dict)] if isinstance(processes, list) else []


def _stray_list(host: dict[str, Any]) -> list[dict[str, Any]]:
    strays = host.get("stray_workers")
    return [s for s in strays if isinstance(s, dict)] if isinstance(strays, list) else []


def _cores(process: dict[str, Any]) -> float:
    return number(process, "cores") or 0.0


def _stray_cores(stray: dict[str, Any]) -> float:
    return (number(stray, "cpu_percent") or 0.0) / 100


def _named(process: dict[str, Any], *, stray: bool) -> dict[str, Any]:
    return {
        "pid": process.get("pid"),
        "cmdline": _cmdline(process),
        "cores": round(_cores(process), 2),
        "stray": stray,
        **({} if stray else {"same_user": process.get("same_user")}),
    }


def _cmdline(process: dict[str, Any]) -> str:
    """A process's program (host.program_name: an older record kept its arguments too), cut to CMDLINE_CHARS."""
    text = program_name(str(process.get("cmdline") or "").split())
    return text if len(text) <= CMDLINE_CHARS else text[: CMDLINE_CHARS - 1].rstrip() + "…"


def _processes_words(processes: list[dict[str, Any]]) -> str:
    """'pid 4242 python hog.py (0.97 cores), pid 4243 ...'."""
    words = []
    for p in processes:
        cmdline = _cmdline(p)
        command = f" {cmdline}" if cmdline else ""
        words.append(f"pid {p.get('pid')}{command} ({_cores(p):.2f} cores)")
    return ", ".join(words)
