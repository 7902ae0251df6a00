"""The reference Transformer, the synthetic tasks and the trainer used by tests and the demo."""

from .config import ModelConfig
from .model import Transformer
from .tasks import TASKS, TaskData, induction, order, padded_majority
from .train import TrainConfig, TrainResult, evaluate, make_optimizer, train

__all__ = [
    "ModelConfig", "Transformer", "TASKS", "TaskData", "induction", "order", "padded_majority",
    "TrainConfig", "TrainResult", "evaluate", "make_optimizer", "train",
]
