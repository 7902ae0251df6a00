"""Wiring checks: causal leak, padding leak, attention scaling, positions, init and optimiser."""

from .finding import SCHEMA, Finding, Findings
from .runner import CHECKS, check_model
from .training_setup import check_training_setup

__all__ = ["CHECKS", "SCHEMA", "Finding", "Findings", "check_model", "check_training_setup"]
