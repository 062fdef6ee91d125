"""Chakra execution traces (traces/chakra*.py): the shipped schema against its .proto, the length-delimited
encoding, export → import of recorded jobs (same operators, durations and collectives), a trace written the
way Chakra's own tools write one (no topotrain attributes), malformed files → one error line naming the file
and the byte offset, the shipped example, and the command."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from topotrain.api import load_scenario, simulate
from topotrain.cli import app
from topotrain.traces import chakra_pb2 as pb
from topotrain.traces.chakra import _A, export_chakra, import_chakra, rank_nodes
from topotrain.traces.chakra_io import decode_varint, encode_stream, encode_varint, read_et, write_et
from topotrain.traces.cluster import fit_host_cluster
from topotrain.traces.importer import import_job
from topotrain.traces.model import RankTrace, TraceCollective, TraceJob, TraceOp, job_to_dict
from topotrain.traces.whatif import resize
from topotrain.training.chakra_export import export_iteration
from topotrain.training.replay import replay
from topotrain.util.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "traces"
PROTO = ROOT / "src" / "topotrain" / "traces" / "et_def.proto"
EXAMPLE = ROOT / "examples" / "chakra"


@cache
def _job(name: str) -> TraceJob:
    return import_job(sorted((DATA / name).glob("rank*.json.gz")))


def _plain(job: TraceJob) -> dict[str, Any]:
    d = job_to_dict(job)
    for r in d["ranks"]:
        r.pop("source")
    return d


def _one_line(e: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


# ---- the schema ----

def test_descriptor_matches_the_proto_field_by_field() -> None:
    """Every message's fields (name, number, type, repeated) and every enum value of et_def.proto are in the
    shipped descriptor, and nothing else is."""
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FileDescriptorProto.FromString(pb.SERIALIZED)
    assert fd.package == "ChakraProtoMsg"
    text = re.sub(r"//[^\n]*", "", PROTO.read_text())
    proto_msgs = {m.group(1): m.group(2) for m in re.finditer(r"message (\w+) \{(.*?)\n\}", text, re.S)}
    type_names = {1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32",
                  8: "bool", 9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32", 16: "sfixed64", 17: "sint32",
                  18: "sint64"}
    assert set(proto_msgs) == {m.name for m in fd.message_type}
    for m in fd.message_type:
        want = {(f[2], int(f[3]), f[1], bool(f[0])) for f in
                re.findall(r"(repeated )?\s*([\w.]+) (\w+) = (\d+);", proto_msgs[m.name])}
        got = {(f.name, f.number, type_names.get(f.type, f.type_name.split(".")[-1]), f.label == 3)
               for f in m.field}
        assert got == want, m.name
    enums = {m.group(1): dict(re.findall(r"(\w+) = (\d+);", m.group(2)))
             for m in re.finditer(r"enum (\w+) \{(.*?)\}", text, re.S)}
    for e in fd.enum_type:
        assert {v.name: str(v.number) for v in e.value} == enums[e.name]
    assert {v.number: v.name for v in fd.enum_type[0].value} == pb.NODE_TYPES
    assert {v.number: v.name for v in fd.enum_type[1].value} == pb.COMM_TYPES


def test_varint_codec() -> None:
    for v, b in ((0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02"),
                 (2**64 - 1, b"\xff" * 9 + b"\x01")):
        assert encode_varint(v) == b
        assert decode_varint(b"xx" + b, 2) == (v, 2 + len(b))
    assert decode_varint(b"\x80\x80", 0) is None  # cut off
    with pytest.raises(ValueError):
        encode_varint(-1)


# ---- round trip ----

@pytest.mark.parametrize("name", ["gpt-w2", "gpt-fsdp-w2", "resnet-fsdp-w2"])
def test_export_then_import_gives_the_same_job(name: str, tmp_path: Path) -> None:
    """A recorded job (DDP; FSDP: collectives launched inside operators) → Chakra → back: the same
    operators with the same durations, gaps, waits and launches, the same collectives."""
    job = _job(name)
    files = export_chakra(job, tmp_path / name)
    assert [f.name for f in files] == [f"{name}.{r}.et" for r in range(job.world_size)]
    back = import_chakra(list(reversed(files)))  # the rank is in the file, not the argument order
    assert _plain(back) == _plain(job)
    # what ASTRA-sim reads: integer microseconds, one COMM_COLL_NODE per collective of the rank, its type/size
    et = read_et(files[0])
    colls = [n for n in et.nodes if n.type == pb.COMM_COLL_NODE]
    assert len(colls) == len(job.collectives)
    for n in colls:
        a = {x.name: x for x in n.attr}
        c = job.collectives[a[_A["coll"]].int64_val]
        assert a["comm_size"].int64_val == c.size_bytes and pb.COMM_TYPES[a["comm_type"].int64_val] in (
            "ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "BROADCAST")
    comp = sum(n.duration_micros for n in et.nodes if n.type == pb.COMP_NODE)
    assert comp == pytest.approx((job.ranks[0].op_s + job.ranks[0].host_gap_s) * 1e6, abs=len(et.nodes))


def test_fsdp_shapes_ride_in_chakra_and_resize_pads_as_directly(tmp_path: Path) -> None:
    """resnet-fsdp at 2 ranks → Chakra → back → resized to 4 ranks: every collective's bytes equal the direct
    resize's and the 4-process recording's (the root unit 4,456 → 4,976 B: fc's 10 rows padded to 12); each
    FSDP collective's node carries its unit's shapes as the JSON attribute ``param_shapes``."""
    job = _job("resnet-fsdp-w2")
    files = export_chakra(job, tmp_path / "fsdp")
    back = import_chakra(files)
    assert [c.param_shapes for c in back.collectives] == [c.param_shapes for c in job.collectives]
    assert all(c.param_shapes for c in back.collectives)
    recorded = json.loads((DATA / "resnet-fsdp-w4.collectives.json").read_text())["collectives"]
    via = [[c.op, c.size_bytes] for c in resize(back, 4).collectives]
    assert via == [[c.op, c.size_bytes] for c in resize(job, 4).collectives] == recorded
    assert via[0] == ["allgather", 4976]
    node = next(n for n in read_et(files[1]).nodes if n.type == pb.COMM_COLL_NODE)
    shapes = {a.name: a.string_val for a in node.attr}[_A["shapes"]]
    assert json.loads(shapes) == [[16, 3, 3, 3], [16], [16], [10, 64], [10]]
    # without the attribute (Chakra's own tools): the bytes as recorded, no padding
    bare = import_chakra([_strip(f, tmp_path / f"bare.{i}.et") for i, f in enumerate(files)])
    assert [c.size_bytes for c in resize(bare, 4).collectives] == [c.size_bytes for c in job.collectives]


def _fsdp_with_shapes(tmp_path: Path, shapes: str, ranks: tuple[int, ...]) -> list[Path]:
    """resnet-fsdp-w2 as Chakra with its first collective's ``param_shapes`` set to ``shapes`` on ``ranks``."""
    job = _job("resnet-fsdp-w2")
    out = []
    for r in range(job.world_size):
        meta, nodes = rank_nodes(job, r)
        first = next(n for n in nodes if n.type == pb.COMM_COLL_NODE)
        for a in first.attr:
            if a.name == _A["shapes"] and r in ranks:
                a.string_val = shapes
        out.append(write_et(tmp_path / f"bad.{r}.et", meta, nodes))
    return out


@pytest.mark.parametrize(("shapes", "ranks", "message"), [
    ("[[16, 3], 7]", (0, 1), "attribute param_shapes: is not a JSON list of parameter shapes"),
    ("[[999, 3]]", (0, 1), "attribute param_shapes: gives 3000 elements padded for 2 ranks, which 4456 B"),
    ("[[999, 3]]", (1,), "has param_shapes ((999, 3),) on rank 1 and ((16, 3, 3, 3), (16,), (16,), (10, 64), "
                         "(10,)) on rank 0: one FSDP unit has one set of shapes"),
])
def test_bad_param_shapes_are_named(shapes: str, ranks: tuple[int, ...], message: str, tmp_path: Path) -> None:
    """A ``param_shapes`` that is not a list of shapes, that does not give the node's comm_size at its group
    size, or that differs between the ranks: one error line naming the file and the node's byte offset."""
    files = _fsdp_with_shapes(tmp_path, shapes, ranks)
    with pytest.raises(ConfigError) as e:
        import_chakra(files)
    text = _one_line(e)
    assert message in text and text.startswith((f"{files[0]}: byte ", f"{files[1]}: byte ")), text


def _strip(path: Path, out: Path) -> Path:
    """The file as Chakra's own tools would write it: only Chakra's attributes, no topotrain ones."""
    et = read_et(path)
    keep = {"is_cpu_op", "comm_type", "comm_size", "pg_name"}
    m = pb.messages()
    nodes = []
    for n in et.nodes:
        c = m.Node()
        c.CopyFrom(n)
        del c.attr[:]
        c.attr.extend(a for a in n.attr if a.name in keep)
        nodes.append(c)
    write_et(out, m.GlobalMetadata(version="1.0.0"), nodes)
    return out


def test_trace_without_topotrain_attributes(tmp_path: Path) -> None:
    """Read as any Chakra trace (microseconds, no operator grouping, groups inferred): the same collectives,
    each rank's compute within rounding, and a replay within 1% of the original's."""
    job = _job("gpt-w2")
    files = [_strip(f, tmp_path / f.name) for f in export_chakra(job, tmp_path / "orig")]
    back = import_chakra(files)
    assert [(c.op, c.size_bytes, c.ranks) for c in back.collectives] == \
        [(c.op, c.size_bytes, c.ranks) for c in job.collectives]
    for a, b in zip(back.ranks, job.ranks, strict=True):
        assert a.op_s + a.host_gap_s == pytest.approx(b.op_s + b.host_gap_s, abs=len(a.ops) * 0.5e-6 + 1e-6)
        assert sorted(k for o in a.ops for k in o.waits) == sorted(k for o in b.ops for k in o.waits)
    ra, rb = replay(back, fit_host_cluster(back)), replay(job, fit_host_cluster(job))
    assert ra.step_s == pytest.approx(rb.step_s, rel=0.01)


def test_hand_written_trace_like_chakras_generator(tmp_path: Path) -> None:
    """Two ranks: compute 100 µs → all-reduce 1 MiB (no pg_name: every rank) → compute that needs it."""
    m = pb.messages()
    files = []
    for r in range(2):
        a = m.Node(id=10, name="fwd", type=pb.COMP_NODE, duration_micros=100 + 50 * r)
        c = m.Node(id=11, name="ar", type=pb.COMM_COLL_NODE, duration_micros=400 + r, data_deps=[10])
        c.attr.add(name="comm_type", int64_val=0)
        c.attr.add(name="comm_size", int64_val=1 << 20)
        b = m.Node(id=12, name="bwd", type=pb.COMP_NODE, duration_micros=200, data_deps=[10, 11])
        files.append(write_et(tmp_path / f"job.{r}.et", m.GlobalMetadata(version="1.0.0"), [b, c, a]))
    job = import_chakra(files)
    assert job.world_size == 2 and len(job.collectives) == 1
    coll = job.collectives[0]
    assert (coll.op, coll.size_bytes, coll.ranks) == ("allreduce", 1 << 20, (0, 1))
    assert coll.measured_s == pytest.approx((400e-6, 401e-6)) and coll.measured_net_s == pytest.approx(400e-6)
    r1 = job.ranks[1]
    assert [o.name for o in r1.ops] == ["fwd", "bwd"]  # dependency order, not file order
    assert r1.ops[0].launches == ((0, pytest.approx(150e-6)),) and r1.ops[1].waits == (0,)
    assert r1.step_s == pytest.approx(350e-6) and job.measured_step_s == pytest.approx(350e-6)


def test_process_groups_get_astra_sim_ids_and_come_back(tmp_path: Path) -> None:
    """Two data-parallel pairs and a world group: pg_name 0 for every rank, 1 and 2 for the pairs (listed in
    ASTRA-sim's communicator-group file), and the names and members back on import — also from a file
    without topotrain's attributes, the members then inferred from which files hold the group."""
    colls = (TraceCollective("allreduce", 4096, "dp-a", (0, 2), (1e-4, 1e-4), 9e-5),
             TraceCollective("allreduce", 4096, "dp-b", (1, 3), (1e-4, 1e-4), 9e-5),
             TraceCollective("allgather", 512, "world", (0, 1, 2, 3), (2e-4,) * 4, 1.5e-4))
    ranks = tuple(RankTrace(r, 0.0, 1e-3, (TraceOp("bwd", 3e-4, 1e-5, (), ((r % 2, 1e-4), (2, 3e-4))),
                                          TraceOp("opt", 2e-4, 0.0, (r % 2, 2))), "") for r in range(4))
    job = TraceJob(4, "gloo", ranks, colls, 1e-3, "toy")
    files = export_chakra(job, tmp_path / "toy")
    assert json.loads((tmp_path / "toy.comm_groups.json").read_text()) == {"1": [0, 2], "2": [1, 3]}
    ets = [f for f in files if f.suffix == ".et"]
    pg = {a.string_val for n in read_et(ets[3]).nodes for a in n.attr if a.name == "pg_name"}
    assert pg == {"0", "2"}
    assert _plain(import_chakra(ets)) == _plain(job)
    bare = import_chakra([_strip(f, tmp_path / f"bare.{i}.et") for i, f in enumerate(ets)])
    assert [(c.group, c.ranks) for c in bare.collectives] == [("1", (0, 2)), ("2", (1, 3)), ("0", (0, 1, 2, 3))]


# ---- bad files ----

def test_truncated_file_names_file_and_byte_offset(tmp_path: Path) -> None:
    src = export_chakra(_job("resnet-w2"), tmp_path / "ok")
    et = read_et(src[1])
    data = src[1].read_bytes()
    cut = et.offsets[7] + 5  # inside the 8th node
    bad = tmp_path / "bad.1.et"
    bad.write_bytes(data[:cut])
    with pytest.raises(ConfigError) as e:
        import_chakra([src[0], bad])
    assert _one_line(e).startswith(f"{bad}: byte {et.offsets[7]}:") and "runs past the end" in str(e.value)
    garbage = tmp_path / "garbage.1.et"
    garbage.write_bytes(data[: et.offsets[3]] + b"\x05\xff\xff\xff\xff\xff" + data[et.offsets[3]:])
    with pytest.raises(ConfigError) as e:
        import_chakra([src[0], garbage])
    assert _one_line(e).startswith(f"{garbage}: byte {et.offsets[3]}:") and "not a Node message" in str(e.value)
    empty = tmp_path / "empty.1.et"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError) as e:
        import_chakra([src[0], empty])
    assert _one_line(e).startswith(f"{empty}: byte 0:")


def test_bad_graphs_are_named(tmp_path: Path) -> None:
    job = _job("resnet-w2")
    m = pb.messages()

    def write(r: int, nodes: list[Any]) -> Path:
        return write_et(tmp_path / f"t.{r}.et", m.GlobalMetadata(version="1.0.0"), nodes)

    meta, nodes = rank_nodes(job, 1)
    good0 = export_chakra(job, tmp_path / "g")[0]
    nodes[5].data_deps.append(99999)
    with pytest.raises(ConfigError) as e:
        import_chakra([good0, write(1, nodes)])
    assert "depends on node 99999" in _one_line(e) and "t.1.et: byte " in str(e.value)
    _, nodes = rank_nodes(job, 1)
    last_coll = max(i for i, n in enumerate(nodes) if n.type == pb.COMM_COLL_NODE)
    for n in nodes:
        n.data_deps[:] = [d for d in n.data_deps if d != nodes[last_coll].id]
    dropped = nodes[:last_coll] + nodes[last_coll + 1:]
    with pytest.raises(ConfigError) as e:
        import_chakra([good0, write(1, dropped)])
    assert "has no peer on rank 1" in _one_line(e) and str(good0) in str(e.value)
    send = m.Node(id=1, name="send", type=pb.COMM_SEND_NODE)
    with pytest.raises(ConfigError) as e:
        import_chakra([good0, write(1, [send])])
    assert "COMM_SEND_NODE" in _one_line(e)
    four = export_chakra(_job("gpt-w4"), tmp_path / "four")
    with pytest.raises(ConfigError) as e:
        import_chakra([four[0], four[1], four[3]])
    assert _one_line(e).startswith("files: rank 2 of 4 is missing (have ranks [0, 1, 3])")
    a = m.Node(id=1, name="a", type=pb.COMP_NODE, data_deps=[2])
    b = m.Node(id=2, name="b", type=pb.COMP_NODE, data_deps=[1])
    with pytest.raises(ConfigError) as e:
        import_chakra([write(0, [a, b])])
    assert "cycle" in _one_line(e)


# ---- the shipped example and the command ----

def test_shipped_example_is_the_exporter_output_of_the_fixture(tmp_path: Path) -> None:
    fresh = export_chakra(_job("gpt-w2"), tmp_path / "gpt-w2")
    shipped = sorted(EXAMPLE.glob("gpt-w2.*.et"))
    assert [f.name for f in shipped] == [f.name for f in fresh]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(shipped, fresh, strict=True))
    meta, nodes = rank_nodes(_job("gpt-w2"), 0)
    assert encode_stream(meta, nodes) == shipped[0].read_bytes()  # deterministic, bit for bit


def test_cli_import_export(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "job.workload.json"
    res = runner.invoke(app, ["trace", "import", *map(str, sorted(EXAMPLE.glob("gpt-w2.*.et"))), "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["trace", "export", str(out), "-o", str(tmp_path / "again")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "again.1.et").read_bytes() == (EXAMPLE / "gpt-w2.1.et").read_bytes()
    res = runner.invoke(app, ["trace", "replay", *map(str, sorted(EXAMPLE.glob("gpt-w2.*.et"))), "--json"])
    assert res.exit_code == 0, res.output
    bad = tmp_path / "bad.1.et"
    bad.write_bytes((EXAMPLE / "gpt-w2.1.et").read_bytes()[:1000])
    res = runner.invoke(app, ["trace", "import", str(EXAMPLE / "gpt-w2.0.et"), str(bad), "-o", str(out)])
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "byte " in res.output


# ---- a simulated iteration out ----

def _scenario(tmp_path: Path, plan: dict[str, int]) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps({"cluster": {"server": "eflops", "servers": 1, "network": {
        "topology": "fat-tree", "link": "eth-100g", "latency": "1us"}}, "model": "gpt2-small",
        "batch": {"global": 16, "micro": 2}, "plan": plan, "network": "analytical"}))
    return path


def test_iteration_export_tp_dp_reads_back(tmp_path: Path) -> None:
    """TP 2 × DP 4 on 8 GPUs: every GPU's compute is its stage's compute tasks, every collective of the task
    graph that includes the GPU is one COMM_COLL_NODE on its group, the groups are ASTRA-sim's file."""
    sc = load_scenario(_scenario(tmp_path, {"tp": 2}))
    res = simulate(sc)
    gpus = sc.cluster.topology.gpus
    files = export_iteration(res.plan, res.tasks, gpus, tmp_path / "it")
    assert json.loads((tmp_path / "it.comm_groups.json").read_text()) == {
        "1": [0, 1], "2": [2, 3], "3": [4, 5], "4": [6, 7], "5": [0, 2, 4, 6], "6": [1, 3, 5, 7]}
    job = import_chakra([f for f in files if f.suffix == ".et"])
    compute = sum(t.duration_s for t in res.tasks if t.comm is None)
    for rt in job.ranks:
        assert rt.op_s == pytest.approx(compute, rel=1e-12)
        mine = [s for t in res.tasks for spec in ([t.comm] if t.comm else []) + [b.comm for b in t.blocking]
                for s in spec.schedules if gpus[rt.rank] in s.ranks]
        launched = [k for o in rt.ops for k, _ in o.launches]
        assert len(launched) == len(mine) == len(set(launched))
        assert sorted((job.collectives[k].size_bytes, tuple(gpus[x] for x in job.collectives[k].ranks))
                      for k in launched) == sorted((s.size_bytes, tuple(sorted(s.ranks, key=gpus.index)))
                                                   for s in mine)
        assert {k for o in rt.ops for k in o.waits} <= set(launched)


def test_iteration_export_pipeline_pairs_sends_and_receives(tmp_path: Path) -> None:
    sc = load_scenario(_scenario(tmp_path, {"tp": 2, "pp": 2}))
    res = simulate(sc)
    files = export_iteration(res.plan, res.tasks, sc.cluster.topology.gpus, tmp_path / "pp")
    sends, recvs = set(), set()
    for r, f in enumerate(f for f in files if f.suffix == ".et"):
        for n in read_et(f).nodes:
            a = {x.name: x for x in n.attr}
            if n.type == pb.COMM_SEND_NODE:
                sends.add((r, a["comm_dst"].int32_val, a["comm_tag"].int32_val, a["comm_size"].int64_val))
            elif n.type == pb.COMM_RECV_NODE:
                recvs.add((a["comm_src"].int32_val, r, a["comm_tag"].int32_val, a["comm_size"].int64_val))
    assert sends and sends == recvs
    with pytest.raises(ConfigError) as e:  # topotrain's trace workload has no point-to-point
        import_chakra([f for f in files if f.suffix == ".et"])
    assert "COMM_SEND_NODE" in _one_line(e) and "pp.0.et: byte " in str(e.value)


def test_cli_exports_a_scenario(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["trace", "export", str(_scenario(tmp_path, {"tp": 2})), "-o",
                                   str(tmp_path / "out" / "s")])
    assert res.exit_code == 0, res.output
    assert len(list((tmp_path / "out").glob("s.*.et"))) == 8 and "comm_groups.json" in res.output
