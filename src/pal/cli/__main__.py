"""`python -m pal.cli`: the `pal` command."""

from pal.cli.app import main

main()
