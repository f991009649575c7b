"""Fork hazards come from what runs (threads, CUDA, compiling), never from what is imported; and what keeps a
loader from forkserver (unpicklable parts, an interactive __main__, a script without a main guard)."""

from __future__ import annotations

import os
import sys
import threading
import types

import pytest
import torch
from recordings import make_iterators, make_recording
from torch.utils.data import DataLoader

from loaderdoctor.host import forkhazards
from loaderdoctor.host.forkhazards import ForkHazards, iterator_facts, other_threads
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.recording.forksafety import forkserver_blocker, safe_start_method
from shared_datasets import Squares


def _spec(dataset=None, **kwargs) -> LoaderSpec:
    return LoaderSpec.from_loader(DataLoader(dataset if dataset is not None else Squares(8), **kwargs))


def test_importing_inductors_config_is_no_hazard():
    import torch._inductor.config  # noqa: F401  (what torchvision and lightning do on import)

    assert "torch._inductor" in sys.modules
    hazards = ForkHazards.now()
    assert hazards.compiled_frames == 0
    assert hazards.compile_workers == 0
    assert not hazards.cuda_initialized
    assert "compile" not in hazards.describe()


def test_compiled_functions_are_a_hazard(monkeypatch):
    fake_utils = types.SimpleNamespace(counters={"frames": {"ok": 3, "total": 4}})
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", fake_utils)
    facts = iterator_facts(0, "fork")
    assert facts.compiled_frames == 3
    hazards = ForkHazards.of([facts])
    assert hazards
    assert "torch.compile had compiled 3 functions" in hazards.describe()
    assert "before calling the compiled model" in hazards.remedy()


def test_compile_workers_are_counted_from_the_children(monkeypatch):
    class Child:
        def __init__(self, argv: list[str]) -> None:
            self.argv = argv

        def cmdline(self) -> list[str]:
            return self.argv

    class Me:
        def children(self) -> list[Child]:
            return [
                Child(["python", "/x/torch/_inductor/compile_worker/__main__.py", "--workers=2"]),
                Child(["python", "-c", "from multiprocessing.spawn import spawn_main"]),
            ]

    monkeypatch.setattr(forkhazards.psutil, "Process", Me)
    assert forkhazards.compile_workers() == 1


def test_a_thread_is_named_with_where_it_runs():
    release = threading.Event()
    users = threading.Thread(target=release.wait, args=(5.0,), name="user-prefetcher")
    own = threading.Thread(target=release.wait, args=(5.0,), name="loaderdoctor-sampler")
    users.start()
    own.start()
    try:
        alive = {t.name: t for t in other_threads()}
    finally:
        release.set()
        users.join()
        own.join()
    assert "loaderdoctor-sampler" not in alive
    thread = alive["user-prefetcher"]
    # Event.wait lives in threading.py, so the thread's own entry point is the first frame outside it: none
    # here but threading's, and then nothing is claimed.
    assert thread.runs == "" or "threading.py" not in thread.runs
    assert "user-prefetcher" not in {t.name for t in other_threads()}  # ended


def _spin(stop: threading.Event) -> None:
    stop.wait(5.0)


def test_a_threads_entry_point_is_its_target():
    stop = threading.Event()
    worker = threading.Thread(target=_spin, args=(stop,), name="uploader")
    worker.start()
    try:
        (uploader,) = [t for t in other_threads() if t.name == "uploader"]
    finally:
        stop.set()
        worker.join()
    assert uploader.runs.endswith("in _spin")
    assert os.path.relpath(__file__) in uploader.runs  # the user's code, from the current directory
    assert uploader.package is None  # the user's own code
    assert uploader.describe().startswith("uploader running ")


def test_a_library_thread_is_named_by_its_package():
    from loaderdoctor.recording.record import AliveThread

    path = "/venv/lib/python3.11/site-packages/tqdm/_monitor.py"
    assert forkhazards._package_of(path) == "tqdm"
    thread = AliveThread("tqdm_monitor", "tqdm/_monitor.py:60 in run", "tqdm")
    assert thread.describe() == "tqdm_monitor, a thread of tqdm running tqdm/_monitor.py:60 in run"


def test_a_picklable_loader_has_no_blocker():
    assert forkserver_blocker(_spec(batch_size=2)) is None


def test_an_unpicklable_collate_fn_blocks_forkserver():
    blocker = forkserver_blocker(_spec(batch_size=2, collate_fn=lambda batch: batch))
    assert blocker is not None
    assert "collate_fn" in blocker and "cannot be pickled" in blocker


def test_a_class_of_an_interactive_session_blocks_forkserver(monkeypatch):
    interactive = types.ModuleType("__main__")  # a notebook's or the REPL's: no __file__
    monkeypatch.setitem(sys.modules, "__main__", interactive)
    defined_there = type("NotebookData", (Squares,), {"__module__": "__main__"})
    interactive.NotebookData = defined_there
    blocker = forkserver_blocker(_spec(defined_there(8), batch_size=2))
    assert blocker is not None
    assert "NotebookData" in blocker and "interactive session" in blocker


@pytest.mark.parametrize(
    ("source", "blocked"),
    [
        ("import torch\nloader = make()\nfor batch in loader:\n    pass\n", True),
        ("import torch\n\ndef main():\n    pass\n\nif __name__ == '__main__':\n    main()\n", False),
        ('"""Only definitions."""\nimport torch\nSIZE = 4\n\ndef make():\n    return SIZE\n', False),
    ],
)
def test_a_script_without_a_main_guard_blocks_forkserver(monkeypatch, tmp_path, source, blocked):
    script = tmp_path / "train.py"
    script.write_text(source)
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    blocker = forkserver_blocker(_spec(batch_size=2))
    assert (blocker is not None) is blocked
    if blocked:
        assert str(script) in blocker and '__name__ == "__main__"' in blocker


def test_forkserver_where_fork_is_hazardous_and_forkserver_works():
    rec = make_recording(settings=Settings(), iterators=make_iterators(2, None, threads=["uploader"]))
    assert safe_start_method(rec, Settings(num_workers=2)) == "forkserver"


def test_fork_stays_where_forkserver_cannot_load_the_loader():
    rec = make_recording(
        settings=Settings(),
        iterators=make_iterators(2, None, threads=["tqdm_monitor"]),
        forkserver_blocker="the loader's collate_fn (function) cannot be pickled",
    )
    assert safe_start_method(rec, Settings(num_workers=2)) is None


def test_no_hazard_no_change():
    rec = make_recording(settings=Settings())
    assert safe_start_method(rec, Settings(num_workers=2)) is None
    assert safe_start_method(rec, Settings(num_workers=2, start_method="spawn")) == "spawn"


def test_cuda_is_read_as_it_is():
    assert iterator_facts(0, None).cuda_initialized is bool(torch.cuda.is_initialized())


def test_a_packages_main_module_is_never_imported_again_by_workers(monkeypatch, tmp_path):
    script = tmp_path / "__main__.py"
    script.write_text("import sys\nfrom tool.cli import main\nsys.exit(main())\n")  # `python -m tool`
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    main.__spec__ = types.SimpleNamespace(name="tool.__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert forkserver_blocker(_spec(batch_size=2)) is None
