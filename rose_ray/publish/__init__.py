"""Weight publication: learner rank 0's weights to the student engines, while they serve.

Read in this order:

- route.py: the `publish:` settings (PublishConfig), what each engine tells the publisher about
  itself (ReceiverInfo) and the route chosen from them (`choose_route`: the object store, or a
  collective over gloo or NCCL).
- publisher.py: rank 0's side (WeightPublisher): pack, send, wait for the loads; a collective
  that stalls or fails falls back to the object store for good.
- flat.py: a state dict as flat byte buffers and a typed header (no tensor pickled).
- group.py: the weight group (rank 0 and the engines in a torch.distributed group of their
  own), the deadline every collective call runs under (`within`), the NCCL settings.

The engine's side is rose_ray/inference/actor.py (`weight_receiver`, `load_weights`,
`join_weight_group`, `receive_weights`).
"""
