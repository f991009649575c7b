"""loaderdoctor for Lightning: LoaderDoctorCallback measures a Trainer's fit as watch() measures a loop (needs the
`lightning` extra: pip install 'loaderdoctor[lightning]').

    trainer = lightning.pytorch.Trainer(callbacks=[LoaderDoctorCallback()])
"""

from loaderdoctor.integrations.lightning.callback import LoaderDoctorCallback

__all__ = ["LoaderDoctorCallback"]
