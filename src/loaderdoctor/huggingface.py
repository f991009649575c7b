"""loaderdoctor for Hugging Face: LoaderDoctorTrainerCallback measures a Trainer's training as watch() measures a loop
(needs the `huggingface` extra: pip install 'loaderdoctor[huggingface]').

    trainer = transformers.Trainer(model, args, train_dataset=data, callbacks=[LoaderDoctorTrainerCallback()])
"""

from loaderdoctor.integrations.huggingface import LoaderDoctorTrainerCallback

__all__ = ["LoaderDoctorTrainerCallback"]
