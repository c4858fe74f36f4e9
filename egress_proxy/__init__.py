"""The egress proxy: the only process with network, and the single writer of the record.

Modules: ``config`` and ``tool_config`` (the one config file), ``sessions`` (streams and
tokens), ``pipeline`` (the stages every model call goes through), ``pins``, ``clock`` and
``tool_ids`` (the determinism stages), ``providers`` (OpenAI vs Anthropic), ``sse`` (event
boundaries in raw bytes), ``tools``, ``mcp_gateway`` and ``fetch`` (tool calls and web reads),
``transports`` (``network`` alone dials out), ``app`` (the FastAPI data plane), ``server`` (a
loopback runner), ``recovery`` (UNKNOWN after a crash). See ``docs/proxy.md``. Importing this
package imports none of them.
"""
