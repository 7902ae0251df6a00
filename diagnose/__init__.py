"""diagnose: see what is really happening inside PyTorch Transformers."""

from .errors import DiagnoseError

__version__ = "0.1.0"

__all__ = ["DiagnoseError", "__version__"]
