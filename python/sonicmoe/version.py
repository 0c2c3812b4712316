"""The package's base version: the one place it is written. A built wheel's version adds what it
was built for (setup.py: e.g. 0.2.0+cu130torch2.14sm90a)."""

__version__ = "0.2.0"
