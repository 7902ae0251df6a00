"""The tiny next-token LightningModule the callback tests train (one definition; tests subclass it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diagnose.zoo import ModelConfig, Transformer

CFG = ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=11)


def tiny_lm(L, optimizer=torch.optim.SGD, lr: float = 0.1):
    """A LightningModule class over the zoo Transformer (CFG): next-token loss on batches of (ids,)."""

    class TinyLM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Transformer(CFG)

        def lm_loss(self, ids: torch.Tensor) -> torch.Tensor:  # ids [B, T]
            logits = self.net(ids)[:, :-1].reshape(-1, CFG.vocab_size)
            return F.cross_entropy(logits.float(), ids[:, 1:].reshape(-1))

        def training_step(self, batch, _):
            return self.lm_loss(batch[0])

        def configure_optimizers(self):
            return optimizer(self.parameters(), lr=lr)

    return TinyLM
