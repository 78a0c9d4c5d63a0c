"""``python -m attnrank.cli``: the same as the ``attnrank`` console script."""

from . import main

main()
