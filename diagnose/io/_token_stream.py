"""Raw token streams: nanoGPT's train.bin / val.bin, the token ids of a whole corpus one after
another as raw np.uint16 (prepare.py's `ids.tofile(path)`; no header, no shape, no pickle).

diagnose reads such a file as consecutive windows of `seq_len` tokens, [N, seq_len] with N =
len // seq_len (the tail shorter than a window is left out). seq_len is --max-length, else the
model's maximum positions (nanoGPT's block_size). A `.bin` that starts as a torch.save file does
(a zip, or a pickle) is read as one instead.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError

MAGIC = (b"PK", b"\x80")  # torch.save's zip; a legacy pickle's PROTO opcode
MAX_STREAM_BYTES = 4 << 30  # as for .npz: a corpus this large is not read whole


def is_token_stream(path: Path) -> bool:
    """A .bin file that is not a torch.save file (nanoGPT's raw uint16 ids)."""
    if path.suffix.lower() != ".bin":
        return False
    with open(path, "rb") as f:
        head = f.read(2)
    return not any(head.startswith(m) for m in MAGIC)


def read_token_stream(path: Path, seq_len: int | None) -> dict[str, torch.Tensor]:
    """{"input_ids": [N, seq_len] uint16} from a raw stream of uint16 token ids."""
    import numpy as np

    size = path.stat().st_size
    if size % 2:
        raise DataError(f"{path}: {size} bytes is not a whole number of uint16 token ids; a raw .bin holds "
                        "np.uint16 ids as nanoGPT's prepare.py writes them (ids.astype(np.uint16).tofile(path))")
    if size > MAX_STREAM_BYTES:
        raise DataError(f"{path}: {size:,} bytes of token ids, over {MAX_STREAM_BYTES:,}; cut a smaller "
                        "evaluation file from it (e.g. the first 1M tokens)")
    if not seq_len:
        raise DataError(f"{path}: a raw stream of token ids has no rows, and the model states no maximum length; "
                        "pass --max-length T (e.g. the block_size it was trained with) to cut it into examples")
    n = size // 2 // seq_len
    if n == 0:
        raise DataError(f"{path}: holds {size // 2} token ids, fewer than one example of {seq_len}; pass a "
                        "smaller --max-length")
    ids = np.fromfile(path, dtype=np.uint16, count=n * seq_len).reshape(n, seq_len)
    return {"input_ids": torch.from_numpy(ids)}
