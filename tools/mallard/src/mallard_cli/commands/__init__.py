"""The subcommands of `mallard`, one module each; each module has NAME, NEEDS_COMMAND, register(sub) and run(args)."""
from __future__ import annotations

# In the order `mallard --help` lists them.
ORDER = ["list", "run", "env", "which", "stats", "top", "heap", "profile", "bench", "demo", "vmem", "advise"]
