"""The model side: generation engines (hf, vllm, openai; registry.py names them, backends.py
builds them), the dynamic batcher, the Ray actor and the OpenAI-compatible server. Import from
the defining modules."""
