"""The learner: DeepSpeed ranks in a Ray actor group that train on packed token batches (it sees tokens only)."""
