"""Weight publication: learner rank 0's weights to the student engines while they serve.

route.py: the `publish:` settings, what each engine reports (ReceiverInfo), the route chosen;
publisher.py: rank 0's side (WeightPublisher), with its fallback to the object store; flat.py:
a state dict as flat byte buffers; group.py: the weight group, its deadlines, NCCL settings.
The engine's side is rose_ray/inference/actor.py.
"""
