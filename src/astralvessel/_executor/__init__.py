"""The executor's private parts: Turn, the settings, the closing base, the
turn's watch, warm pool, network proxy, exec and file plans, and snapshots
(docs/architecture.md, layer "executor").
"""
