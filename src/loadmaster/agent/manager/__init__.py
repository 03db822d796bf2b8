"""The host manager: starts, stops and reconciles the guests the scheduler placed here."""
