"""`python -m diagnose` is the `diagnose` command.

`python -m` puts the current folder first on the import path; started inside a model folder,
its `rich.py` or `numpy.py` would be imported in place of the real package. diagnose never runs
code from a model folder, so that entry is dropped before anything else is imported (a
--factory module is looked up in the current folder explicitly). `python -P -m diagnose`, or the
installed `diagnose` command (`torchrun --no-python diagnose ...`), never add it at all.
"""

import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from diagnose.cli.main import main  # noqa: E402

if __name__ == "__main__":
    main()
