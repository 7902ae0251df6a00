"""One batch-size rule for every analysis: the attention summary and the ablation count alike,
and inputs whose size cannot be told are refused rather than counted as one example."""

import pytest
import torch

from diagnose.ablation.batches import as_batches
from diagnose.attention_stats import split_batch
from diagnose.errors import DataError
from diagnose.objectives import batch_size_of


def test_tensor_and_mapping_inputs():
    assert batch_size_of(torch.zeros(3, 5, dtype=torch.long)) == 3
    assert batch_size_of({"input_ids": torch.zeros(4, 2), "attention_mask": torch.ones(4, 2)}) == 4
    assert batch_size_of({"scale": torch.tensor(2.0), "x": torch.zeros(6, 2)}) == 6  # 0-d tensors carry no batch


@pytest.mark.parametrize("inputs", [object(), (torch.zeros(2, 3),), {"n": 3}, torch.tensor(1.0)])
def test_unknown_inputs_are_refused_everywhere(inputs):
    with pytest.raises(DataError, match="batch size"):
        batch_size_of(inputs)
    with pytest.raises(DataError, match="batch size"):
        split_batch(inputs, 2)


def test_the_ablation_drops_empty_batches_by_the_same_rule():
    pairs = as_batches([(torch.zeros(0, 4, dtype=torch.long), None), (torch.zeros(2, 4, dtype=torch.long), None)], 8)
    assert [batch_size_of(x) for x, _ in pairs] == [2]


def test_batches_move_to_the_device_one_at_a_time():
    """The data set stays where it is; a batch moves to the model's device when it is read."""
    data = {"input_ids": torch.ones(10, 4, dtype=torch.long), "labels": torch.zeros(10, dtype=torch.long)}
    batches = as_batches(data, 4, torch.device("meta"))
    assert [batch_size_of(x) for x, _ in batches.pairs] == [4, 4, 2]
    assert all(x["input_ids"].device.type == "cpu" and y.device.type == "cpu" for x, y in batches.pairs)
    x, y = batches[1]
    assert x["input_ids"].device.type == "meta" and y.device.type == "meta"
    assert [b[0]["input_ids"].device.type for b in batches] == ["meta"] * 3
    assert batches[1:].pairs == batches.pairs[1:] and as_batches(batches, None, None).pairs == batches.pairs
