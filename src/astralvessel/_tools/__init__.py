"""The tools' private parts: arguments, Python tools' schemas and the model
APIs' dialects (docs/architecture.md, layer "tools").
"""
