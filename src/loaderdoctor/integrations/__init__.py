"""loaderdoctor inside the tools people train with: the trainers' callbacks (`trainer/` what they share,
`lightning/`, `huggingface.py`), accelerate's dispatcher (`accelerate.py`) and the experiment trackers
(`trackers/`). Each reads the watch core (loaderdoctor.watch); none is read by it."""
