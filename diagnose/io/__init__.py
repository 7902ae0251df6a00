"""Reading and writing the model and data files named in DESIGN.md.

Exported: the public loaders (load_model, load_data, DataSet, save_checkpoint) and what the CLI
commands use (load_data_for, check_task, describe_model, describe_data, trial_forward). The rest
(save_tensors, the vocabulary and label checks, the tokenizer lookups) stays in its module.
"""

from ._checkpoint import save_checkpoint
from ._data import DataSet, check_task, load_data
from ._model import label2id_of, load_model, max_positions_of, tokenizer_of
from ._summary import describe_data, describe_model, trial_forward


def load_data_for(model, path, *, max_length=None) -> DataSet:
    """load_data with the model's tokenizer and label names (what the CLI commands use).

    Text is truncated to max_length tokens, by default the model's maximum positions (and the
    tokenizer's limit, when lower).
    """
    return load_data(path, tokenizer=tokenizer_of(model), max_length=max_length, label2id=label2id_of(model),
                     model_max_length=max_positions_of(model))


__all__ = [
    "DataSet", "check_task", "describe_data", "describe_model", "load_data", "load_data_for", "load_model",
    "save_checkpoint", "trial_forward",
]
