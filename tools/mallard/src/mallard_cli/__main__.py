"""`python -m mallard_cli`: the same as the `mallard` command."""
import sys

from .cli import main

sys.exit(main())
