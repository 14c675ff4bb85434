"""The Redis-backed distributed data manager and its subscriber client."""
