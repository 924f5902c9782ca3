"""DeepSpeed learner: batching, losses, the rank actor group, offline SFT."""
