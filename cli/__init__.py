"""The `diagnose` command line: thin click commands over the library."""
