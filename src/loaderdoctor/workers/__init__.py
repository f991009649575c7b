"""Worker processes seen from outside (samples, stacks, deaths) and from inside (the hook, call sites, file locks,
the index in hand)."""
