"""The run history: every watch, check, tune and scale run kept as a RunRecord in a SQLite database, and the
run-to-run comparison that reads RunRecords (run-degradation, what changed between runs)."""
