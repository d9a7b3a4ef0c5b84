"""``python -m runtime.cli``: the same as the ``corral`` console script."""

from runtime.cli import main

main()
