"""watch: a DataLoader observed in the user's own training loop (and the Lightning callback's measuring), its
run diagnosed with check's rules and kept in the history."""

from loaderdoctor.watch.watched import WatchedLoader, watch

__all__ = ["WatchedLoader", "watch"]
