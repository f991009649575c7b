"""The job's ceiling under a trainer's own launcher (torchrun, accelerate launch): as the training ends every process
hands its ceiling to the others through the process group the trainer made, and the main one judges the job from
them (rules/ceiling.py's job_ceiling), as `run` does for the ranks it launches."""

from __future__ import annotations

import warnings
from typing import Any

from loaderdoctor.errors import LoaderDoctorWarning
from loaderdoctor.rules.ceiling import job_ceiling
from loaderdoctor.rules.finding import Finding
from loaderdoctor.tap.ceiling import Ceiling


def ranks_ceilings(ceiling: Ceiling | None) -> dict[int, Ceiling] | None:
    """Every rank's ceiling by rank (this one's `ceiling` among them; a rank that measured none is left out), None
    outside a distributed run of two processes or more, or when they could not be gathered (a warning says why). A
    collective: every process of the job calls it at the same point of its training."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
            return None
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, ceiling)
    except Exception as error:  # the job's figure is not worth the training run's end
        warnings.warn(
            f"loaderdoctor could not gather the ranks' ceilings: {type(error).__name__}: {error}",
            LoaderDoctorWarning,
            stacklevel=2,
        )
        return None
    return {rank: c for rank, c in enumerate(gathered) if isinstance(c, Ceiling)}


def job_ceiling_finding(ceiling: Ceiling | None) -> Finding | None:
    """The job's ceiling (job-ceiling) from every rank's, gathered (see ranks_ceilings: a collective); None on a
    single process or with fewer than two ranks measured."""
    ceilings = ranks_ceilings(ceiling)
    return job_ceiling(ceilings) if ceilings else None
