"""Head ablation through the one head gate: which heads matter, with significance."""

from .engine import METHODS, ablate_heads
from .gate import Gate, gated
from .together import GroupEffect, ablate_together
from .result import SCHEMA, HeadEffect, HeadsResult

__all__ = ["METHODS", "SCHEMA", "Gate", "HeadEffect", "GroupEffect", "HeadsResult", "ablate_heads", "ablate_together", "gated"]
