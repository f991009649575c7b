"""What the trainers' callbacks share: a loader watched through a trainer's hooks (`hooked.py`), the hook that never
lets loaderdoctor's failure reach the training (`hooks.py`), the ceiling's turns through a trainer's train loader
(`ceiling.py`), the processes a fit started (`census.py`) and which errors come from loading (`loadingerrors.py`)."""
