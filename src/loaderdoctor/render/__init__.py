"""Renderers: turn a Report (plain data) into text for people (console) or programs (json)."""
