"""The schema's limits on sizes and counts, in a module of their own (no pydantic): the cluster builders and the
plain cluster reader (:mod:`topotrain.scenario.cluster_plain`) check them without building the schema;
:mod:`topotrain.util.fields` types its fields with them."""

from __future__ import annotations

#: Most servers / GPUs a scenario may ask for (checked before anything is built; a bigger cluster would
#: take minutes and gigabytes to build before any answer — split the study, or raise the limit here).
MAX_SERVERS = 65_536
MAX_GPUS = 65_536
#: Largest whole number any count may hold (2^53: exact as a float; 2^64 would overflow numpy's int64).
MAX_INT = 2**53
#: Largest batch, model dimension (hidden, heads, seq_len, vocab) or degree a scenario may give: 2^24 is
#: above any real one, and a batch of 10^9 would take minutes to refuse later.
MAX_COUNT = 2**24
#: Largest numeric builder parameter (``dims``, ``radix``, ``k``, ``switches``: checked by the builder).
MAX_BUILDER_PARAM = 2**20
