"""``python -m fastcalc``: the command line."""

from .cli import main

main()
