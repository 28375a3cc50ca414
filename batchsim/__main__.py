"""``python -m batchsim``: the CLI."""

from batchsim.app.cli import main

main()
