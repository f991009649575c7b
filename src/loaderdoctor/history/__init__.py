"""The run history: every watch, check, tune and scale run kept as a RunRecord in a SQLite database."""
