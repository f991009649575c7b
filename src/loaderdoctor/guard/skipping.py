"""GuardedLoader's account of the samples replaced under on_sample_error="skip": each delivered batch's reports
recorded as events, and the run ended once too many of the samples seen were bad (samples.too_many_bad). A base
class of GuardedLoader, split off by responsibility: it reads and sets the loader's own state, declared below."""

from __future__ import annotations

from typing import Any

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.guard.events import GuardEvent
from loaderdoctor.guard.inner import Inner
from loaderdoctor.guard.samples import too_many_bad
from loaderdoctor.guard.texts import skipped_event, too_many_bad_error
from loaderdoctor.loader.settings import LoaderSpec


class SkippedSamples:
    """The replaced samples' bookkeeping of a GuardedLoader (see guard/samples.py)."""

    _spec: LoaderSpec
    _epoch: int
    _samples_seen: int  # samples delivered, over the loader's life
    skipped: list[int]  # the dataset indices replaced, in order
    max_bad_fraction: float
    events: list[GuardEvent]

    def _record(self, event: GuardEvent) -> None:
        raise NotImplementedError

    def _end_epoch(self) -> None:
        raise NotImplementedError

    def _count_samples(self, inner: Inner, position: int, planned: Any) -> None:
        """Record the samples replaced in the batch at `position` (of the indices `planned`), just delivered;
        end the run when too many of the samples seen so far were bad."""
        self._samples_seen += len(planned) if self._spec.batch_sampler is not None else 1
        reports = inner.reports.take((inner.iteration, position))
        for report in reports:
            self.skipped.append(report["index"])
            self._record(skipped_event(self._epoch, position, report))
        # The bound on the bad share rises only with a new bad sample: checked then.
        if reports and too_many_bad(len(self.skipped), self._samples_seen, self.max_bad_fraction):
            self._end_epoch()
            raise self._too_many_bad(position)

    def _too_many_bad(self, position: int) -> LoaderDoctorError:
        last = self.events[-1].detail
        return too_many_bad_error(self._epoch, position, self.skipped, self._samples_seen, self.max_bad_fraction, last)
