"""A family's projection layout: where each head's rows sit, so that one slicer can cut any family.

Head h of width D owns D output features of each query/key/value projection and the same D
input features of the output projection (the adapter's `site.out_proj`). Where those features
sit is all a family declares:

- SEPARATE: one projection per part (q_proj, k_proj, v_proj): head h is features h*D:(h+1)*D.
- BLOCKED: one fused projection [q; k; v] (GPT-2's c_attn, the reference model's qkv): head h is
  features h*D:(h+1)*D of each of the three H*D blocks.
- INTERLEAVED: one fused projection grouped per head [q0 k0 v0 q1 k1 v1 ...] (some families fuse
  this way): head h is features 3hD:3(h+1)D.

An adapter declares its layout as `layout`: a ProjectionLayout (a class attribute, the same for
every site), or a method `layout(site)` that returns one or raises ConfigError (one line) when
the site's heads cannot be cut. An adapter without `layout` cannot be pruned; it still measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .base import AttentionSite

SEPARATE, BLOCKED, INTERLEAVED = "separate", "blocked", "interleaved"
PARTS = {SEPARATE: 1, BLOCKED: 3, INTERLEAVED: 3}  # q/k/v parts each projection holds
# transformers reshapes head outputs with view(..., -1, head_dim), which an empty layer cannot do
HF_MIN_HEADS_NOTE = "transformers cannot build an attention layer without heads: every layer keeps at least one"


@dataclass(frozen=True)
class Projection:
    """One projection whose output features are per head.

    path: the submodule, from the attention module ("self.query", "c_attn"); kind: SEPARATE,
    BLOCKED or INTERLEAVED; kv: its heads are key/value heads of grouped-query attention (query
    head q reads key/value head q // (H / Hkv)), kept while any query of their group is kept.
    """

    path: str
    kind: str = SEPARATE
    kv: bool = False

    def __post_init__(self) -> None:
        if self.kind not in PARTS:
            raise ConfigError(f"projection {self.path!r}: kind {self.kind!r} is not one of {', '.join(PARTS)}")
        if self.kv and self.kind != SEPARATE:
            raise ConfigError(f"projection {self.path!r}: key/value heads of grouped-query attention must sit in "
                              "their own (separate) projections")


@dataclass(frozen=True)
class ProjectionLayout:
    """How one family's attention module holds its heads, and what a cut must update.

    inputs: the query/key/value projections. conv1d: weights are stored [in, out] (Hugging Face
    Conv1D), for the inputs and the output projection alike. heads / widths / kv_groups: module
    attributes (paths from the attention module, "self.num_attention_heads") set after a cut to the
    heads kept, to heads kept * head_dim, and to the query heads per key/value head. model_heads: a
    path from the model set to the list of heads left per layer (a config that rebuilds the shapes).
    min_heads: the fewest heads a layer may keep (min_heads_note: why, said in the result's notes).
    """

    inputs: tuple[Projection, ...]
    conv1d: bool = False
    heads: tuple[str, ...] = ()
    widths: tuple[str, ...] = ()
    kv_groups: tuple[str, ...] = ()
    model_heads: str | None = None
    min_heads: int = 0
    min_heads_note: str = ""

    @property
    def attributes(self) -> tuple[str, ...]:
        """The module attribute names a cut of this layout changes (what a pruned folder may set)."""
        return tuple(path.rpartition(".")[2] for path in self.heads + self.widths + self.kv_groups)


def layout_of(site: "AttentionSite") -> ProjectionLayout:
    """The site's projection layout, as its adapter declares it; ConfigError when it declares none."""
    declared = getattr(site.adapter, "layout", None)
    if isinstance(declared, ProjectionLayout):
        return declared
    if callable(declared):
        return declared(site)
    raise ConfigError(f"heads of the {site.adapter.family!r} family cannot be cut: its adapter declares no "
                      "projection layout (diagnose/adapters/layout.py); the heads command still measures them")



def stored_in_out(site: "AttentionSite") -> bool:
    """Whether the site's projections keep their weight [in, out] (the layout's `conv1d`, GPT-2's Conv1D)
    rather than [out, in] (nn.Linear); an adapter whose layout cannot be had (its heads cannot be cut)
    stores them as nn.Linear does."""
    try:
        return layout_of(site).conv1d
    except ConfigError:
        return False
