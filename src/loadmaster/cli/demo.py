"""``loadmaster demo``: placeholder replaced below."""
