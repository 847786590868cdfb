"""One module per EGG role. Each node is ``(state, runtime: Runtime[Settings]) -> dict``, a
partial update of the shared state, and asks the run's policy where a decision is needed."""
from nodes.algorithm_designer import algorithm_designer  # noqa: F401
from nodes.memory_optimizer import memory_optimizer  # noqa: F401
from nodes.planner import planner  # noqa: F401
from nodes.profiler import profiler  # noqa: F401
from nodes.reporter import reporter  # noqa: F401
from nodes.review import review  # noqa: F401
from nodes.tiler import tiler  # noqa: F401
from nodes.verifier import verifier  # noqa: F401
