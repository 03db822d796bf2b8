"""One module per REST resource; each exposes ``router``."""
