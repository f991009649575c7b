"""The machine a loader runs on: its facts and limits, what makes fork hazardous there, a snapshot for the history,
and the tool's own temporary folders."""
