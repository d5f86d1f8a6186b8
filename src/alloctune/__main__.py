"""`python -m alloctune` is the same as the `alloctune` console script."""

from alloctune.cli import main

if __name__ == "__main__":
    main()
