"""Trainbox: turns a rented GPU into a finished LibreYOLO model, then stops the bill."""

__version__ = "0.2.0"
