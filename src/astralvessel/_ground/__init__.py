"""The ground every layer stands on: conversions, kinds, logs and spans, the
ledger, outcomes, awaits, leftovers, network allow patterns, refusals, the web
tools' limits and words
(docs/architecture.md, layer "ground").
"""
