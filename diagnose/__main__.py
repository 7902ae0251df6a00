"""`python -m diagnose` is the `diagnose` command."""

from diagnose.cli.main import main

if __name__ == "__main__":
    main()
