"""Sandbox backends: one ``Policy``, compiled by each backend into its own mechanism."""
