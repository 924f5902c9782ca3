"""The model side: generation engines (transformers in-process, OpenAI-compatible client),
the dynamic batcher, the Ray actor wrapper and the OpenAI-compatible server.

Import from the defining modules: engine (the shared types and the context policy), registry
(the backends by name: their settings and what each can do), backends (`make_engine`), hf,
vllm_engine, openai, batcher, actor, server, protocol, prefix_cache."""
