"""topotrain: predict, explain and optimize distributed DNN training on a GPU cluster before it exists."""

__version__ = "0.1.0"
