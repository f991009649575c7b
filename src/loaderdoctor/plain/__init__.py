"""Plain data and plain words, the bottom layer: dataclasses rebuilt from JSON, bounded JSON text, words for counts
and shares, numbers as reports round them, and whose code a frame runs."""
