"""Which dataset index each of the guard's workers is loading at this moment, kept where the main process can
read it after the worker died: so that the sample that killed a worker (a segfault, SIGKILL, the OOM killer) is
named by its index, and skipped under on_sample_error="skip".

A small file in the guard's temporary folder holds one 8-byte slot per worker; each worker maps it into memory
and writes the index before it loads a sample and clears it after (two stores, well under a microsecond per
sample). Only the path is pickled, so the same object reaches forked, forkserver and spawned workers alike.
"""

from __future__ import annotations

import mmap
import operator
import os
import struct
import tempfile
from typing import Any

from torch.utils.data import get_worker_info

_SLOT = struct.Struct("<q")
_NONE = -(2**63)  # no sample in hand: between samples, or an index that is not an integer


class InHand:
    """The slots of one internal loader's workers: written in the workers, read in the main process."""

    def __init__(self, folder: str, num_workers: int) -> None:
        descriptor, self.path = tempfile.mkstemp(prefix="in-hand-", suffix=".bin", dir=folder)
        try:
            os.write(descriptor, _SLOT.pack(_NONE) * max(1, num_workers))
        finally:
            os.close(descriptor)
        self._map: mmap.mmap | None = None
        self._offset = 0
        self._pid = 0  # the process whose mapping self._map is

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._map, self._offset, self._pid = None, 0, 0

    def loading(self, index: Any) -> None:
        """In a worker: `index` is being loaded now (a worker that dies before done() died on it)."""
        if self._pid != os.getpid() and not self._attach():
            return
        try:
            value = operator.index(index)
        except TypeError:
            value = _NONE
        _SLOT.pack_into(self._map, self._offset, value)  # type: ignore[arg-type]

    def done(self) -> None:
        """In a worker: the sample came back (or raised): nothing in hand."""
        if self._pid == os.getpid() and self._map is not None:
            _SLOT.pack_into(self._map, self._offset, _NONE)

    def read(self, worker_id: int) -> int | None:
        """In the main process: the index worker `worker_id` was loading, None when it held none."""
        try:
            with open(self.path, "rb") as file:
                file.seek(worker_id * _SLOT.size)
                data = file.read(_SLOT.size)
        except OSError:
            return None
        if len(data) < _SLOT.size:
            return None
        (value,) = _SLOT.unpack(data)
        return None if value == _NONE else value

    def _attach(self) -> bool:
        """Map the file in this process, at this worker's slot; False in the main process (no worker)."""
        info = get_worker_info()
        if info is None:
            return False
        with open(self.path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), 0)
        self._offset = info.id * _SLOT.size
        self._pid = os.getpid()
        return True
