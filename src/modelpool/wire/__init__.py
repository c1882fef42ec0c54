"""The protocols modelpool speaks, one sub-package per family: `wire.openai` (chat,
completions, responses, embeddings, audio, rerank and scoring, tokenize, the models list,
the realtime events, the error envelope, and the upstream side: our requests in OpenAI's
wire format and the upstream's answers back) and `wire.anthropic` (messages, its stream
events and error shape). Each holds the pydantic request schemas, request → pool request
(`inference.ChatRequest` & co.) and pool result → response body or stream events.

Used alike by the HTTP routes, the MCP tools and the remote-upstream backend, so a request
means the same whichever door it came in by. Framework-free except pydantic: imports only
the shared modules (inference, tasks, capabilities, errors, config, logs, offload), never
runtime, backends, api or mcp_server.
"""
