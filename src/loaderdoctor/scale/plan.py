"""The DDP plan's public path, `from loaderdoctor.scale.plan import ddp_plan` (the README's): its arithmetic lives
in loader/ddp.py, and these are its names imported from there."""

from loaderdoctor.loader.ddp import DdpPlan, SameEffectiveBatch, ddp_plan

__all__ = ["DdpPlan", "SameEffectiveBatch", "ddp_plan"]
