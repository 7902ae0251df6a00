"""Wiring checks: causal leak, padding leak, attention scaling, positions, init and optimiser."""

from ._finding import Finding, Findings
from ._runner import check_model
from ._training_setup import check_training_setup

__all__ = ["Finding", "Findings", "check_model", "check_training_setup"]
