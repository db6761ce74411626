"""A call and its plan: TurnContext, Call, Plan and the sandbox's and files' steps,
and the web built-ins' steps (docs/architecture.md, layer "plans"; below
builtins.py, whose rows return these plans).
"""
