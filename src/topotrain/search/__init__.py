"""Co-design search over clusters, collectives and plans: the space, the points' evaluation, the executors
(local pool or Dask), the resumable store, the Pareto front and cost (docs/search.md)."""
