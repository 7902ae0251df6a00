"""Wiring checks: causal leak, padding leak, attention scaling, positions, init and optimiser."""

from .finding import Finding, Findings
from .runner import check_model
from .training_setup import check_training_setup

__all__ = ["Finding", "Findings", "check_model", "check_training_setup"]
