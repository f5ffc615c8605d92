"""The package's version (importable from anywhere without loading anything else)."""

__version__ = "0.1.0"
