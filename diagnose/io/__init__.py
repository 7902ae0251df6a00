"""Reading and writing the model and data files named in DESIGN.md."""
