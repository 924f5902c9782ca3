"""The model side: generation engines (registry.py names the backends), the dynamic batcher, the
Ray actor and the OpenAI-compatible server. Import from the defining modules."""
