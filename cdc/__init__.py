"""cdc-sync: mirrors database tables into Redis, change by change."""

__version__ = "0.5.0"
