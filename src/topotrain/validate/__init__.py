"""Independent references for the network models: ns-3 (packet level) and SimGrid (flow level), and the
validation matrix that ``topotrain validate`` runs through every model."""
