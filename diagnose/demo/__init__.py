"""`diagnose demo` and the measured Transformer lessons, on reference models trained by diagnose.

Modules: _run (the demo: load the shipped models, ablate, check, report), _shipped (the three
main models, trained once by make_models and shipped with their hashes), _lessons (pairs of models
that differ in one switch, trained here and measured; `lessons.json`, `diagnose.lessons/1`),
_head_lesson (the attention-map vs ablation lesson). The names below are what the CLI, the benchmarks and the tests use.
"""

from ._lessons import (SCHEMA, Lesson, Trained, Variant, markdown_table, run_lessons, shipped_variant, task_data,
                       train_variant, variants)
from ._run import DemoModel, DemoResult, demo_variants, run_demo

__all__ = [
    "SCHEMA", "DemoModel", "DemoResult", "Lesson", "Trained", "Variant", "demo_variants", "markdown_table", "run_demo",
    "run_lessons", "shipped_variant", "task_data", "train_variant", "variants",
]
