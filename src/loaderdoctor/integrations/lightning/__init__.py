"""Lightning's callback (`callback.py`; its public home is loaderdoctor.lightning), what it keeps per fit
(`state.py`), where Lightning keeps the train loader and an epoch's length (`ceiling.py`) and the figures it hands
the trainer's loggers (`log.py`)."""
