"""The scenario, validated once at the edge: pydantic models of the whole scenario file (:mod:`.spec`), its
loader (:mod:`.load`), and the conversion of its cluster and catalog sections into the domain's values
(:mod:`.cluster`, :mod:`.catalog`).

A scenario file (YAML) has these sections (``topotrain schema`` prints the full JSON Schema; point an
editor's YAML language server at it to complete and check scenario files)::

    name: my-study                      # optional (default: the file's stem)
    cluster:                            # servers from a template on a network, or a graph file
      server: eflops                    # template name (built-in or from catalog:), or an inline definition
      servers: 16                       # ≤ 65,536 (refused before anything is built)
      gpu: v100                         # optional: override the template's GPU
      nic: eth-100g                     # optional: override every NIC's link type
      message_overhead: 2us             # optional: per-message software cost (the network models' alpha)
      fabric: {switching: store-and-forward, payload: 8948B, header: 54B}  # optional (default cut-through):
                                        # framing + store-and-forward, carried by network: flow | analytical
      arbitration: port                 # optional: flow (default, max-min per flow) | port (PCIe links share
                                        # per input port, round robin; the flow models)
      catalog: my-hardware.yaml         # optional: extra GPUs / links / servers (a file, or inline)
      network: {topology: bigraph, link: eth-100g, latency: 1us, switches: 8, radix: 16}
      # or: graph: my-graph.yaml        (its own message_overhead applies unless the cluster sets one)
    model: resnet50                     # a zoo name, {name: gpt3-175b, seq_len: 4096} or {type: transformer, ...}
    batch: 256                          # global batch (samples), or {global: 1024, micro: 4}
    plan: {tp: 1, pp: 1, micro_batch: 32, zero_stage: 0, bucket: 25MiB, ...}   # dp defaults to GPUs/(tp·pp)
    network: flow                       # analytical | flow | flow-async | flow-eager
    compute: {profile: table.json}      # optional measured per-layer times, or roofline params
    stragglers: {gpus: {s0/gpu3: 1.5}, lognormal_sigma: 0.05, seed: 1}
    degraded_links: [{a: s0/nic0, b: sw/upper0, factor: 0.5}]          # factor 0: failed, rerouted

Rules: unknown keys are errors (with "did you mean"); sizes, times and bandwidths carry their units
(``25MiB``, ``1us``, ``100Gbps`` — a bare ``plan.bucket: 25`` or ``latency: 1`` is refused, see
:mod:`topotrain.util.units`); every problem is reported at once, one line each, as a
:class:`~topotrain.util.errors.ConfigErrors`. ``--set`` overrides and the Python API (:func:`scenario_from_dict`)
go through the same models.
"""
