"""Reliability and shared-cluster operation: topology-aware job placement (placement.py)."""
