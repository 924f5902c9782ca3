"""The model side: generation engines (transformers in-process, OpenAI-compatible client),
the dynamic batcher, the Ray actor wrapper and the OpenAI-compatible server.

Import from the defining modules: engine (the shared types and the context policy), backends
(`make_engine`), hf, openai, batcher, actor, server, protocol, prefix_cache."""
