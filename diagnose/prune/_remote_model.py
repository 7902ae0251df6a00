"""Written by `diagnose prune` into a pruned Hugging Face folder as pruned_heads.py.

transformers 5 builds every layer with the config's one head count (its `prune_heads` and the
`pruned_heads` config field are gone), so a folder whose layers kept different numbers of heads
cannot load through the family's class alone. This file, which transformers' Auto classes load
when asked with trust_remote_code=True, is the family's own class plus one
step: after building, it gives the attention projections the pruned shapes listed in the config
(`diagnose_pruned`), so the saved weights load as they are. It imports only torch and
transformers; read it before trusting it, as any remote code. diagnose itself never runs this
copy: its loader rebuilds such a folder with the same `pruned` from its own installed code.
"""

import torch
import torch.nn as nn
import transformers

BASE = None  # the pruned model's class name, filled in when the folder is written
# the only module attributes a cut changes; a config naming any other (a method) is refused
ATTRIBUTES = {"all_head_size", "in_features", "n_heads", "nf", "num_attention_heads", "num_heads",
              "num_key_value_groups", "nx", "out_features", "split_size"}


def shrink(model, spec):
    """Give each listed parameter its pruned shape and each listed module its pruned attributes."""
    for owner, attributes in spec["attributes"].items():
        for key, value in attributes.items():
            if key not in ATTRIBUTES or type(value) is not int or value < 0:
                raise ValueError(f"diagnose_pruned: {owner}.{key} = {value!r} is not a pruned size")
    for name, shape in spec["shapes"].items():
        if not name.endswith((".weight", ".bias")):
            raise ValueError(f"diagnose_pruned: {name} is not a weight or bias")
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        old = getattr(module, attr)
        new = torch.empty(shape, dtype=old.dtype, device=old.device)
        setattr(module, attr, nn.Parameter(new, requires_grad=old.requires_grad))
    for owner, attributes in spec["attributes"].items():
        module = model.get_submodule(owner)
        for key, value in attributes.items():
            setattr(module, key, value)


def pruned(base):
    """The family's class `base`, built with the pruned shapes of config.diagnose_pruned."""

    class PrunedModel(base):
        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            shrink(self, config.diagnose_pruned)

    PrunedModel.__name__ = PrunedModel.__qualname__ = base.__name__  # it is that family's model
    return PrunedModel


PrunedModel = pruned(getattr(transformers, BASE)) if BASE else None
