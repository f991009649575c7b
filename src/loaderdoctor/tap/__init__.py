"""The instrumented iterator and what keeps it alive: the tap's events, fingerprints, the watchdog, the one stall
responder, interrupts and signals."""
