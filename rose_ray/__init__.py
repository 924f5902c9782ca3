"""rose_ray: online ROSE (student-then-teacher distillation) for ScienceWorld agents on Ray."""

__version__ = "0.1.0"
