"""The built-in entries of the monitor's registries, in order: each registry (_measure.py, _detect.py)
registers these the first time it is read (diagnose/registry.py).

The order of MEASUREMENTS is the order of the parts of a step's vector; the order of DETECTORS is
the order in which the kinds are checked, and so of a step's alerts. A new built-in measurement or
alert kind is a new file plus its line here; a user's own is passed to `register_measurement` /
`register_detector` from their code.
"""

from __future__ import annotations

from ._detect_attention import EntropyCollapse
from ._detect_layers import ActivationGrowth, NoWarmup, RankCollapse, VanishingGrad
from ._detect_loss import Divergence, GradSpike, LossSpike, Nonfinite
from ._detect_signals import AdamEps, AttentionLogitGrowth, LogitDivergence, UpdateSize
from ._head_events import HEAD_EVENTS
from ._head_importance import HEADS, ICL
from ._probes import ACTIVATIONS, ATTENTION, GRAD_NORMS, LOSS
from ._probes_logits import ATTENTION_LOGIT, LOGIT_Z
from ._probes_optim import OPTIMIZER

BUILTIN_MEASUREMENTS = (LOSS, ACTIVATIONS, ATTENTION, ATTENTION_LOGIT, LOGIT_Z, GRAD_NORMS, OPTIMIZER, HEADS,
                        ICL)
BUILTIN_DETECTORS = (Nonfinite, GradSpike, LossSpike, Divergence, VanishingGrad, ActivationGrowth,
                     EntropyCollapse, AttentionLogitGrowth, LogitDivergence, RankCollapse, NoWarmup,
                     UpdateSize, AdamEps, *HEAD_EVENTS)
