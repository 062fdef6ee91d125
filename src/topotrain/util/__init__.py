"""The bottom layer: helpers every other package may use and that import nothing else of topotrain.

``units`` (parsing and printing values with units), ``errors`` (:class:`~topotrain.util.errors.ConfigError`),
``problems`` (pydantic's errors as one-line problems; self-validating frozen dataclasses), ``fields``
(unit-typed and counted field types), ``atomic`` (files written whole or not at all), ``jsonsafe``,
``yamlio`` and ``gc_pause``.
"""
