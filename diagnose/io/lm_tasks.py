"""Data files for the tasks people bring to a pretrained language model, made from its tokenizer.

- `ioi`: indirect-object identification (Wang et al. 2022), "When Mary and John went to the store,
  John gave a drink to" -> " Mary". Several templates, both name orders (ABBA and BABA), names,
  places and objects that are one token each after a space. Scored at the last position only
  (labels -100 elsewhere): `labels` the indirect object, `wrong_labels` the subject, so that
  `diagnose heads` reports the logit difference between them beside the loss.
- `repeated`: random tokens repeated once (Olsson et al. 2022): the second copy is predictable
  only by copying from the first, what induction heads do. Scored on the second half only.

Both are written as plain dicts of tensors (`diagnose.io.save_tensors`; they load with
weights_only=True). Run as a script:

    python -m diagnose.io.lm_tasks MODEL --ioi ioi.pt --repeated repeated.pt [--n 64] [--seed 0]

MODEL is anything `diagnose.load_model` reads that carries a tokenizer (a .gguf file, a Hugging
Face folder); only the tokenizer is used.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import DataError

IGNORE = -100
TEMPLATES = (  # {A} and {B}: the two names in either order; {S}: the subject, repeated
    "When {A} and {B} went to the {place}, {S} gave a {obj} to",
    "After {A} and {B} went to the {place}, {S} gave a {obj} to",
    "While {A} and {B} were working at the {place}, {S} gave a {obj} to",
    "Then, {A} and {B} went to the {place}. {S} gave a {obj} to",
    "When {A} and {B} arrived at the {place}, {S} handed a {obj} to",
)
NAMES = ("Mary", "John", "Tom", "James", "Anna", "David", "Sarah", "Michael", "Emma", "Robert", "Lisa", "Paul",
         "Kate", "Mark", "Laura", "Peter", "Alice", "George", "Rachel", "Daniel")
PLACES = ("store", "park", "school", "hospital", "restaurant", "office", "station", "garden", "market", "beach")
OBJECTS = ("drink", "book", "ball", "ring", "letter", "bag", "gift", "key", "phone", "snack")


def _one_token(tokenizer: Any, words: Sequence[str]) -> list[str]:
    """The words that are a single token after a space (the form they take inside a sentence)."""
    return [w for w in words if len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) == 1]


def ioi(tokenizer: Any, n: int = 64, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """n IOI prompts, right-padded: input_ids, attention_mask [N, T]; labels, wrong_labels [N, T]
    (the indirect object and the subject at each prompt's last position, -100 elsewhere)."""
    rng = random.Random(seed)
    names = _one_token(tokenizer, NAMES)
    places, objects = _one_token(tokenizer, PLACES), _one_token(tokenizer, OBJECTS)
    if len(names) < 2 or not places or not objects:
        raise DataError("the tokenizer splits the built-in names, places and objects: no IOI prompt can be made")
    rows = []
    for i in range(n):
        io, s = rng.sample(names, 2)
        first, second = (io, s) if i % 2 == 0 else (s, io)  # ABBA and BABA alternate
        text = TEMPLATES[i % len(TEMPLATES)].format(A=first, B=second, S=s, place=rng.choice(places),
                                                    obj=rng.choice(objects))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        answer = tokenizer(" " + io, add_special_tokens=False)["input_ids"][0]
        wrong = tokenizer(" " + s, add_special_tokens=False)["input_ids"][0]
        rows.append((ids, answer, wrong))
    T = max(len(ids) for ids, _, _ in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((n, T), int(pad), dtype=torch.long)
    mask = torch.zeros(n, T, dtype=torch.long)
    labels = torch.full((n, T), IGNORE, dtype=torch.long)
    wrong_labels = labels.clone()
    for b, (ids, answer, wrong) in enumerate(rows):
        input_ids[b, :len(ids)] = torch.tensor(ids)
        mask[b, :len(ids)] = 1
        labels[b, len(ids) - 1], wrong_labels[b, len(ids) - 1] = answer, wrong
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels, "wrong_labels": wrong_labels}


def repeated(tokenizer: Any, n: int = 64, *, length: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """n sequences r r of `length` random ordinary tokens r (no BOS, as the tokenizer adds none); labels
    [N, T] the next token on the second copy only (labels[:, t] predicts position t + 1)."""
    gen = torch.Generator().manual_seed(seed)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = len(tokenizer)
    low = min(1000, vocab // 4)  # skip the lowest ids (bytes, specials in most vocabularies)
    r = torch.randint(low, vocab, (n, length), generator=gen)
    for sid in special:
        r[r == sid] = low
    ids = torch.cat([r, r], dim=1)  # [N, 2 * length]
    labels = torch.full_like(ids, IGNORE)
    labels[:, length:-1] = ids[:, length + 1:]  # from the second copy's first token on, predicting its next
    return {"input_ids": ids, "labels": labels}


def main(argv: Sequence[str] | None = None) -> int:
    """Write the IOI and/or repeated-token data files from MODEL's tokenizer."""
    parser = argparse.ArgumentParser(prog="python -m diagnose.io.lm_tasks", description=main.__doc__)
    parser.add_argument("model", help="a .gguf file or model folder with a tokenizer")
    parser.add_argument("--ioi", type=Path, help="write the IOI prompts here (.pt)")
    parser.add_argument("--repeated", type=Path, help="write the repeated random tokens here (.pt)")
    parser.add_argument("--n", type=int, default=64, help="examples per file (default 64)")
    parser.add_argument("--length", type=int, default=16, help="random tokens per copy (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from . import save_tensors
    from ._gguf import tokenizer_of_path

    tokenizer = tokenizer_of_path(Path(args.model))
    if args.ioi:
        save_tensors(ioi(tokenizer, args.n, seed=args.seed), args.ioi)
    if args.repeated:
        save_tensors(repeated(tokenizer, args.n, length=args.length, seed=args.seed), args.repeated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
