"""Recorded training steps in: Kineto / Execution Trace import → a job topotrain can replay (docs/traces.md)."""
