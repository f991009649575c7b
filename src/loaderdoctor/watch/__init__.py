"""watch, the core that the trainers' callbacks (loaderdoctor.integrations) and `run`'s job (loaderdoctor.job) read:
a DataLoader observed in the user's own training loop (`watched.py`), what a watch keeps and its end
(`watchrun.py`), the tap's events recorded (`recorder.py`), the progress line's figures (`progress.py`) and the
ranks' ceilings handed to the main one (`rankceilings.py`); its run diagnosed with check's rules and kept in the
history."""

from loaderdoctor.watch.watched import WatchedLoader, watch

__all__ = ["WatchedLoader", "watch"]
