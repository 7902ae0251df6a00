"""prune_heads on Hugging Face GPT-2, BERT and LLaMA (grouped-query attention): the pruned copy
equals the original with the removed heads' output-projection slices zeroed, and the saved folder
loads with plain transformers (a subprocess that never imports diagnose) to the same outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import diagnose
from diagnose.sites import find_heads
from diagnose.zoo.families import build

from ..tolerance import assert_close as assert_close_t, assert_exact, output_scale, tol
from .helpers import assert_close, outputs, size, zeroed

pytestmark = pytest.mark.numerics

transformers = pytest.importorskip("transformers")
V = 40


def _ids(n=16, t=8):
    return torch.randint(1, V, (n, t), generator=torch.Generator().manual_seed(1))


def _hf(name, impl="sdpa", auto=None, **overrides):
    """The family table's tiny model (diagnose/zoo/families.py), at this file's sizes."""
    return build(name, impl, auto=auto, vocab_size=V, max_position_embeddings=16, initializer_range=0.2, **overrides)


def gpt2():
    return _hf("GPT-2", bos_token_id=0, eos_token_id=0)


def bert():
    return _hf("BERT", auto="BertForSequenceClassification", num_labels=3)


def llama(impl="sdpa"):
    return _hf("Llama", impl)


def _data(model, classify):
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1::3, -2:] = 0  # some right padding
    data = {"input_ids": ids, "attention_mask": mask}
    if classify:
        data["labels"] = outputs(model, data).argmax(-1)
    return data


@pytest.mark.slow
def test_three_families_cut_equal_the_zeroed_model_and_load_without_diagnose(tmp_path):
    folders, heads_left = {}, {}
    for name, build, classify in (("gpt2", gpt2, False), ("bert", bert, True), ("llama", llama, False)):
        model = build()
        data = _data(model, classify)
        budget = {"max_drop": 100.0} if classify else {"max_loss": 100.0}
        result = diagnose.prune_heads(model, data, limit=5, **budget)
        assert len(result.order) == 5 and sorted(result.heads_left) != [4, 4]
        assert min(result.heads_left) >= 1  # transformers cannot build a layer with no heads
        inputs = {k: v for k, v in data.items() if k != "labels"}
        pruned = outputs(result.model, inputs)
        sites = find_heads(model)
        assert_close(pruned, outputs(zeroed(model, sites, result.removed), inputs), sites)
        assert result.size.parameters_after < result.size.parameters_before
        result.save_pretrained(tmp_path / name)
        # the policy's tolerance travels with the logits: the subprocess must not import diagnose
        torch.save({"inputs": inputs, "logits": pruned, "tol": tol(output_scale(pruned), **size(sites))},
                   tmp_path / f"{name}.pt")
        folders[name] = str(tmp_path / name)
        heads_left[name] = result.heads_left
    script = (
        "import sys, torch, transformers\n"
        "for name, folder in [a.split('=', 1) for a in sys.argv[1:]]:\n"
        "    auto = transformers.AutoModelForSequenceClassification if name == 'bert' else "
        "transformers.AutoModelForCausalLM\n"
        "    m = auto.from_pretrained(folder, trust_remote_code=True).eval()\n"
        "    ref = torch.load(folder + '.pt')\n"
        "    with torch.no_grad():\n"
        "        got = m(**ref['inputs']).logits.float()\n"
        "    diff = float((got - ref['logits']).abs().max())\n"
        "    assert diff <= ref['tol'], (name, diff, ref['tol'])\n"
        "assert 'diagnose' not in sys.modules\n"
        "print('loaded', len(sys.argv) - 1)\n")
    done = subprocess.run([sys.executable, "-c", script, *[f"{k}={v}" for k, v in folders.items()]],
                          capture_output=True, text=True, timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert done.returncode == 0 and "loaded 3" in done.stdout, done.stderr[-2000:]
    # LLaMA: 5 of 8 query heads gone from 2 groups of 2 per layer; its folder records what is left
    cfg = json.loads((tmp_path / "llama" / "config.json").read_text())
    assert cfg["diagnose_pruned"]["heads_left"] == heads_left["llama"]


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_llama_gqa_cuts_queries_only_and_never_grows(impl, tmp_path):
    """SmolLM2's layout in small: 3 query heads per key/value head. Uneven groups are padded with empty query
    slots, a key/value head goes only with its whole group, none is copied; the folder loads in transformers."""
    from diagnose.prune.cut import cut

    model = _hf("Llama", impl, hidden_size=48, num_attention_heads=6, num_key_value_heads=2)
    sites, inputs = find_heads(model), {"input_ids": _ids()}
    cases = {((0, 0),): (2, 6, 1), ((0, 0), (0, 1), (0, 3)): (2, 4, 1), ((1, 0), (1, 1), (1, 2)): (1, 3, 0)}
    for removed, (kv, slots, padded) in cases.items():
        layer = removed[0][0]
        result = cut(model, sites, list(removed))
        assert result.notes[layer] == {"kv_heads": kv, "query_slots": slots, "padded": padded}
        attn = result.model.model.layers[layer].self_attn
        assert (attn.k_proj.out_features, attn.v_proj.out_features, attn.q_proj.out_features) == (kv * 8, kv * 8,
                                                                                               slots * 8)
        assert attn.num_key_value_groups * kv == slots and attn.o_proj.in_features == slots * 8
        assert _params(result.model) <= _params(model) - 2 * 48 * 8 * (6 - slots) - 2 * 48 * 8 * (2 - kv)
        assert_close(outputs(result.model, inputs), outputs(zeroed(model, sites, list(removed)), inputs), sites)
    result = diagnose.prune_heads(model, inputs, limit=4, max_loss=100.0)  # the whole path: choose, cut, save
    assert result.size.parameters_after < result.size.parameters_before
    result.save_pretrained(tmp_path / "cut")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "cut", trust_remote_code=True)
    assert_close(outputs(loaded, inputs), outputs(zeroed(model, sites, result.removed), inputs), sites)


def test_the_choice_ranks_by_the_same_estimate_as_ablate_heads_fast():
    from diagnose.ablation import ablate_heads
    from diagnose.ablation.gate import gated
    from diagnose.prune._measure import Measure

    model = bert()
    data = _data(model, classify=True)
    data["labels"] = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(5))  # a loss to move
    fast = ablate_heads(model, data, fast=True, top=0, attention=False, progress=False)
    batches = [({k: v for k, v in data.items() if k != "labels"}, data["labels"])]
    sites = find_heads(model)
    measure, est = Measure(model, sites, batches, "classification"), []
    with gated(sites) as gates:  # a round's estimate, as the choice sees it (nothing removed yet)
        measure.round(measure.sweep(gates, []), lambda per_site: est.extend(per_site) or [(0, 0)])
    ours = torch.tensor([float(x) for layer in est for x in layer])
    theirs = torch.tensor([h.second_order_delta_loss for h in fast.heads])
    assert_close_t(ours, theirs, **size(sites))  # the same estimate, other batching


def test_diagnose_reloads_a_pruned_folder_with_its_own_code(tmp_path):
    from diagnose.io import load_model

    model = bert()
    data = _data(model, classify=True)
    result = diagnose.prune_heads(model, data, max_drop=100.0, limit=3, candidates=1)
    result.save_pretrained(tmp_path / "pruned")
    (tmp_path / "pruned" / "pruned_heads.py").write_text("raise SystemExit('the folder code ran')\n")
    again = load_model(tmp_path / "pruned")  # the folder's own file is never run
    assert type(again).__name__ == "BertForSequenceClassification"
    assert [s.n_heads for s in find_heads(again)] == result.heads_left
    inputs = {k: v for k, v in data.items() if k != "labels"}
    assert_exact(outputs(again, inputs), outputs(result.model, inputs))  # a reload computes the same
