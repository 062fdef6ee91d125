"""One training iteration: the plan, the task graph, the engine that owns time, memory, error bands."""
