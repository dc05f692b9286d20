"""``python -m pyrouq`` runs the ``pyrouq`` command."""

from pyrouq.cli import console

console()
