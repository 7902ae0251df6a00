"""Head ablation through the one head gate: which heads matter, with significance."""

from .engine import METHODS, ablate_heads
from .gate import Gate, gated
from .result import SCHEMA, HeadEffect, HeadsResult
from .together import GroupEffect, ablate_together

__all__ = ["METHODS", "SCHEMA", "Gate", "GroupEffect", "HeadEffect", "HeadsResult", "ablate_heads",
           "ablate_together", "gated"]
