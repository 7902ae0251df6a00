"""Independent references for the prune tests: the original model with each removed head's
slice of the output projection zeroed (no gate, no cut), and file hashes."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import torch

from diagnose._tolerance import model_size
from diagnose.objectives import call_model, logits_of, score, targets_for

from .. import tolerance


def zeroed(model, sites, removed):
    """A copy of `model` whose output projections ignore the removed heads (zero ablation by hand)."""
    twin = copy.deepcopy(model)
    names = {id(m): n for n, m in model.named_modules()}
    mods = dict(twin.named_modules())
    for layer, head in removed:
        site = sites[layer]
        proj = mods[names[id(site.out_proj)]]
        conv1d = type(proj).__name__ == "Conv1D"  # GPT-2 stores weight [in, out]
        with torch.no_grad():
            proj.weight.narrow(0 if conv1d else 1, head * site.head_dim, site.head_dim).zero_()
    return twin


def outputs(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return logits_of(call_model(model.eval(), inputs)).float()


def evaluate(model, batches, task: str) -> tuple[float, float]:
    """(accuracy, loss) per scored unit, plain forwards."""
    correct = loss = count = 0.0
    with torch.no_grad():
        for inputs, labels in batches:
            s = score(logits_of(call_model(model.eval(), inputs)), targets_for(task, inputs, labels))
            correct, loss, count = correct + float(s.correct.sum()), loss + float(s.loss_sum.sum()), \
                count + float(s.count.sum())
    return correct / count, loss / count


def assert_close(a: torch.Tensor, b: torch.Tensor, sites) -> None:
    """Equal within the tolerance policy for the model's depth and width (float32 rounding of a
    differently shaped matmul): the same judgement `diagnose prune` makes before it saves."""
    tolerance.assert_close(a, b, **size(sites))


def size(sites) -> dict[str, int]:
    """The policy's depth and width of the model the sites were found in."""
    depth, width = model_size(sites)
    return {"depth": depth, "width": width}


def digest(path: Path) -> str:
    """One hash over every file under path (or the file itself)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in files:
        h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def state_hash(model) -> str:
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
