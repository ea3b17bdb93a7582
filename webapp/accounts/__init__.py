"""Logging in: the login view and form, with failed attempts throttled (throttle.py)."""
