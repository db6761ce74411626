"""An executor's tools in agent frameworks, each with one call.

``astralvessel.integrations.openai_agents`` (OpenAI Agents SDK ``FunctionTool``),
``.langchain`` (LangChain ``StructuredTool``) and ``.pydantic_ai`` (a pydantic-ai
toolset) each turn an ``Executor`` into that framework's tools. Each opens one
turn per agent run, in step with the framework's own run lifecycle, and
reports a tool's error through the framework's own mechanism. Each needs the
extra of its name: ``pip install '.[openai-agents]'``, and so on.

``.inspect_ai`` goes the other way: an inspect_ai sandbox provider named
``"astralvessel"``, one turn per sample, on which inspect runs its own
commands and tools (the ``inspect`` extra). So do the frameworks' own sandbox
interfaces: ``.openai_agents.VesselSandboxClient`` (the Agents SDK's sandbox
client, a turn per sandbox session) and ``.deepagents.VesselSandbox`` (Deep
Agents' sandbox backend on one turn; the ``deepagents`` extra).
"""
