"""Head ablation through the one head gate: which heads matter, with significance."""

from .engine import METHODS, ablate_heads
from .gate import Gate, gated
from .result import SCHEMA, HeadEffect, HeadsResult

__all__ = ["METHODS", "SCHEMA", "Gate", "HeadEffect", "HeadsResult", "ablate_heads", "gated"]
