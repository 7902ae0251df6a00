"""The per-head attention statistics, named once, in the order they are computed and written.

Torch-free so that the report (which reads only files) can import it: attention_stats.py
computes them, the heads JSON carries them per head, the report draws them.
"""

ATTENTION_STATS = ("entropy", "max_weight", "first_token", "self", "prev_token", "padding", "mean_distance",
                   "next_token", "last_token", "local")
