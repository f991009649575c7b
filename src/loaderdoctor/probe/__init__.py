"""Measuring a loader: a probe session window by window, its epochs, the fix verified in turns, the budget, the
user's random state kept."""
