"""Heap profiles of `mallard heap`: pprof's profile.proto reader, ELF/DWARF symboliser, site tables and flame graphs."""
