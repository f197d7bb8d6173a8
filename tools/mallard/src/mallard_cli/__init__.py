"""The `mallard` command: run, profile, compare and explain allocators for any program."""
__version__ = "0.1.0"
