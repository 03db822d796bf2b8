"""The filters loadmaster ships, one per module; they are found through entry points."""
