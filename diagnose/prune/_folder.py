"""Reading a pruned Hugging Face folder back: the folder kind prune registers with io.

A folder `save_pretrained` wrote holds `diagnose_pruned` in its config.json (the pruned shapes).
io knows nothing of prune: this module registers the kind (io.register_folder_kind), and
diagnose/__init__.py imports it, so the kind is known before any io code runs. Importing it costs
no torch: what builds the model is imported when a pruned folder is met.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputFileError
from ..io import FolderKind, register_folder_kind

FIELD = "diagnose_pruned"


def pruned_class(folder: Path, config: Any, cls: Any, transformers: Any) -> Any:
    """The family's class with the pruned shapes, once config.diagnose_pruned has passed its checks."""
    from ..io import weight_shapes
    from ._remote_model import pruned
    from ._spec import check_pruned

    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        arch = str((config.architectures or [None])[0])[:80]
        raise InputFileError(f"{folder / 'config.json'}: a pruned folder's `architectures` must name its family's "
                             f"model class (e.g. BertForSequenceClassification), not {arch!r}; "
                             "prune the original model again (diagnose prune ... --out DIR)")
    check_pruned(folder, getattr(config, FIELD), config, weight_shapes(folder))
    return pruned(cls)


KIND = register_folder_kind(FolderKind(FIELD, pruned_class))
