"""The runners: one per tool kind (a table), Python tools and callables bound to
services, service posts (docs/architecture.md, layer "runners"; builtins.py, public,
sits below them, since a built-in's row is its runner).
"""
