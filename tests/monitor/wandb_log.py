"""Read back what wandb wrote offline: the records of a run's `.wandb` file (its LevelDB-style log:
a 7-byte header, then 32 KiB blocks of records each with a 7-byte header, split across blocks
as FIRST/MIDDLE/LAST pieces), parsed with wandb's own protobuf classes. Newer wandb releases
dropped the Python reader, so the tests carry this one (about the format of wandb's datastore)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes):
    assert data[:4] == b":W&B", "not a wandb log file"
    pos, part = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the rest of a block too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:  # zero padding
            pos += left
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            part = chunk
        elif kind == MIDDLE:
            part += chunk
        elif kind == LAST:
            yield part + chunk
            part = b""


def _records(path: str | Path, kind: str):
    """The run's records of one kind ("history", "summary"), in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    for payload in _payloads(Path(path).read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == kind:
            yield getattr(record, kind)


def _items(items) -> dict:
    return {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}


def history(path: str | Path) -> list[dict]:
    """The run's history rows (run.log calls) as {key: value}, in order."""
    return [_items(h.item) for h in _records(path, "history")]


def summary(path: str | Path) -> dict:
    """The run's summary updates, the last value of each key."""
    out = {}
    for update in _records(path, "summary"):
        out.update(_items(update.update))
    return out
