"""Weight publication: learner rank 0's weights to the student engines while they serve
(route.py: settings and route; publisher.py: rank 0's side; flat.py: flat byte buffers;
group.py: the weight group). The engine's side is rose_ray/inference/actor.py.
"""
