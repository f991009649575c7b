"""`loaderdoctor run`'s job: the script run as its own `__main__` (`script.py`), every DataLoader it makes watched
(`loaders.py`, named by where it was made: `sites.py`), every Python process it starts watched through the job's
folder (`joining.py`, with the standard-library-only startup hook `hook.py` and a process's own part `process.py`:
the one import loop of the package, hook.py <-> process.py) and its ranks (`ranks.py`)."""
