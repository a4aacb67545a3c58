"""``python -m scripts`` runs the ``farm`` command."""

from scripts.cli import main

main()
