"""Reading and writing the model and data files named in DESIGN.md."""

from .checkpoint import save_checkpoint
from .data import DataSet, check_labels, check_task, check_vocab, load_data, save_tensors
from .model import label2id_of, load_model, max_positions_of, tokenizer_of
from .summary import describe_data, describe_model, trial_forward


def load_data_for(model, path, *, max_length=None) -> DataSet:
    """load_data with the model's tokenizer and label names (what the CLI commands use).

    Text is truncated to max_length tokens, by default the model's maximum positions (and the
    tokenizer's limit, when lower).
    """
    return load_data(path, tokenizer=tokenizer_of(model), max_length=max_length, label2id=label2id_of(model),
                     model_max_length=max_positions_of(model))


__all__ = [
    "DataSet", "check_labels", "check_task", "check_vocab", "describe_data", "describe_model", "label2id_of", "load_data",
    "load_data_for", "load_model", "max_positions_of", "save_checkpoint", "save_tensors", "tokenizer_of", "trial_forward",
]
