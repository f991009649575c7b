"""Waiting for an accelerator's queued work, for a measurement whose clock must hold that work: the CPU runs ahead
of an asynchronous device (a CUDA or ROCm GPU), so a time read without waiting counts work launched but not yet
done, and the turn after pays for it. Only the devices this process already uses are waited for, and CUDA is
never initialized here (a forked worker could not use it after)."""

from __future__ import annotations

import torch


def wait_for_devices() -> bool:
    """Wait until each CUDA device on which this process holds memory has done the work queued on it; True when
    one was waited for. Does nothing where this process never initialized CUDA. A device whose work failed is
    left to the loop's own next call, which raises the error where the user sees it."""
    if not torch.cuda.is_initialized():
        return False
    waited = False
    try:
        for device in range(torch.cuda.device_count()):
            if torch.cuda.memory_allocated(device) > 0:  # in use: no context is made on a device the job never used
                torch.cuda.synchronize(device)
                waited = True
    except RuntimeError:
        return waited
    return waited
