"""The edges' private parts: the CLI's subcommands, its options, progress line
and terminal-safe text (docs/architecture.md, layer "edges").
"""
