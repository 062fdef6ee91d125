"""An emulated cluster on one Linux machine: a network namespace per node, a veth pair per link.

:class:`Emulation` turns a small :class:`~topotrain.topology.graph.Topology` into real networking:

* every GPU node is a *host* namespace (one rank each); every other node (switch, NIC, PCIe switch, ...)
  is a *router* namespace with ``net.ipv4.ip_forward = 1`` (BiGraph and leaf-spine have loops, so no
  bridges);
* every full-duplex link is one veth pair with an end in each namespace, on its own ``/30`` of
  ``10.128.0.0/9`` (``a`` end ``.1``, ``b`` end ``.2``); a host's address is that of its first link;
* each *direction* of a link is shaped on the egress of the veth end it leaves from: an HTB class with
  ``rate = ceil = bandwidth · bandwidth_scale`` and, below it, netem with ``delay = latency ·
  latency_scale`` (Linux ``tc-htb(8)``, ``tc-netem(8)``); the HTB bucket is two frames (a link does not
  bank idle time), and tiny TCP segments — the ACKs of the flow going the other way — have strict
  priority inside the class, so they do not queue behind data. The two directions of a link have their
  own qdiscs (on the two veth ends), so a link is full duplex: one TCP connection carrying data both ways
  at once moves 23.8–23.9 MB/s each way at 25 MB/s shaped (23.6 without ACK priority; one way 23.9). The
  12 MB/s per direction once seen on a gloo pair was gloo's rendezvous serializing a swap whose sends were
  posted before its receives (:mod:`topotrain.comm.gossip`), not the links;
* the routes are topotrain's own: for every ordered host pair (s, d) the node path
  ``topo.router.node_path(s, d)`` is installed hop by hop — a host gets ``d/32 via next-hop``, a router a
  policy rule ``from s/32 lookup <table of s>`` whose table holds ``d/32 via next-hop``. Deterministic ECMP
  picks its path per (source, destination) pair, so a per-destination table would not do: source
  routing reproduces exactly the modelled paths (``ip-rule(8)``). ``rp_filter`` is off (routes are
  asymmetric). ``tcp_slow_start_after_idle`` is off: an algorithm that changes peer every step (halving-
  doubling) would otherwise restart every connection from a small window (RFC 2861 behaviour), a TCP
  artefact the models — and RDMA fabrics — do not have.

What a link delivers to TCP payload (``0.956`` of the shaped rate:
:data:`~topotrain.testbed.shaping.TCP_PAYLOAD_EFFICIENCY`) is worked out in :mod:`~topotrain.testbed.shaping`,
which also writes the ``tc`` commands; :meth:`Emulation.scaled_topology` gives the models that payload bandwidth.

Names and ownership come from :mod:`~topotrain.testbed.runs`: the run's namespaces and veths are named after its
tag, and it holds that tag's lock file while it runs. Given a tag, :func:`leftovers` and :func:`clean` see only
that run's names, so concurrent runs on one machine never count or remove each other's; :func:`clean` tells a live
run (lock held: left alone unless ``force``) from an orphan (its namespaces, veths, processes and temporary
directories are removed), and :func:`live_runs` lists the live ones.
Teardown (kill this run's processes, delete its namespaces and veths) runs in ``__exit__``, on
SIGINT/SIGTERM and at interpreter exit. Needs root and iproute2 (``ip``, ``tc``). Setup, the preflight probe and
teardown run with SIGINT/SIGTERM deferred (:func:`_signals_deferred`): a Ctrl-C there takes effect right
after, once what exists is recorded, so nothing leaks; a signal inherited as ignored stays ignored.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType, TracebackType
from typing import Any

from topotrain.collectives.costmodel import DEFAULT_MESSAGE_OVERHEAD_S
from topotrain.network.params import NetworkParams
from topotrain.testbed.runs import (
    MAX_LINKS,
    PREFIX,
    RunLock,
    check_tag,
    made_by_topotrain,
    of_run,
    owner_pid,
    remove_run_files,
    run_alive,
    run_dir,
    tag_of,
)
from topotrain.testbed.shaping import MTU_BYTES, TCP_PAYLOAD_EFFICIENCY, LinkShape, shaping_commands
from topotrain.topology.elements import NodeKind
from topotrain.topology.graph import Topology
from topotrain.util.errors import ConfigError

__all__ = ["Emulation", "clean", "leftovers", "live_runs", "netns_available"]

_NET_BASE = (10 << 24) | (128 << 16)  # 10.128.0.0/9: one /30 per physical link
_CMD_TIMEOUT_S = 60.0

_ACTIVE: list[Emulation] = []
_SEQ = [0]
_HANDLERS_INSTALLED = [False]
_LOCK = threading.Lock()


_DEFERRED = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Within the block SIGINT/SIGTERM are held back (recorded by a handler and blocked for the ``ip``/``tc``
    children, so a terminal's Ctrl-C does not kill one halfway); on leaving, one that arrived is acted on
    by the handler that was in place. Ignored signals stay ignored; outside the main thread, a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    prev: dict[int, Any] = {}

    def hold(signum: int, frame: FrameType | None) -> None:
        got.append(signum)

    for sig in _DEFERRED:
        h = signal.getsignal(sig)
        if h is not signal.SIG_IGN:
            prev[sig] = h
            signal.signal(sig, hold)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, list(prev))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for held, h in prev.items():
            signal.signal(held, h)
        if got:
            os.kill(os.getpid(), got[0])  # delivered now, to the handler that was in place


def _ip4(x: int) -> str:
    return f"{(x >> 24) & 255}.{(x >> 16) & 255}.{(x >> 8) & 255}.{x & 255}"


def _run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True,
         timeout_s: float = _CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout_s)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()[:500]}")
    return p


def netns_available() -> tuple[bool, str]:
    """(True, "") when this process may create network namespaces, else (False, why)."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces need Linux"
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    name = f"{PREFIX}probe{os.getpid():x}"
    try:
        with _signals_deferred():
            p = _run(["ip", "netns", "add", name], check=False, timeout_s=10)
            if p.returncode != 0:
                return False, f"ip netns add failed: {p.stderr.strip()[:200]}"
            _run(["ip", "netns", "del", name], check=False, timeout_s=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"cannot run ip: {e}"
    return True, ""


class Emulation:
    """Context manager: the namespaces, veths, shaping and routes of ``topo`` (see module docstring).

    ``bandwidth_scale`` multiplies every link bandwidth (1/500: 100 Gb/s → 200 Mb/s); ``latency_scale``
    every latency. :meth:`scaled_topology` is the Topology the emulation really is, for predictions.

    ``burst_bytes``: HTB bucket (at least two frames). Small by default: a bucket holds the link time left
    unused while the link idled, and a large one (32 KiB is 5 ms at 6 MB/s) lets a sender that paused catch
    up above the link's rate — a real link cannot bank idle time. ``ack_priority`` (default on): tiny TCP
    segments (ACKs) get strict priority within each link's rate (:func:`shaping_commands`).
    ``tag``: the prefix of this run's namespace and veth names (module docstring); default: from the pid.
    ``quickack``: the hosts' routes carry ``quickack 1`` (``ip-route(8)``), which
    turns off TCP delayed ACKs — otherwise two small messages to one peer in a row (gloo, Nagle) can wait
    the 40 ms delayed-ACK timer, an artefact of TCP that RDMA fabrics do not have.
    """

    def __init__(self, topo: Topology, *, bandwidth_scale: float = 1 / 500, latency_scale: float = 1.0,
                 queue_packets: int = 1000, burst_bytes: int = 2 * (MTU_BYTES + 14), quickack: bool = True,
                 slow_start_after_idle: bool = False, ack_priority: bool = True, tag: str | None = None) -> None:
        topo.validate()
        if not (bandwidth_scale > 0):
            raise ConfigError("bandwidth_scale", f"must be > 0, got {bandwidth_scale}", "give e.g. 0.002")
        if not (latency_scale >= 0):
            raise ConfigError("latency_scale", f"must be >= 0, got {latency_scale}", "give e.g. 1.0")
        self.topo = topo
        self.bandwidth_scale = float(bandwidth_scale)
        self.latency_scale = float(latency_scale)
        self.queue_packets = int(queue_packets)
        self.burst_bytes = int(burst_bytes)
        self.quickack = bool(quickack)
        self.ack_priority = bool(ack_priority)
        self.slow_start_after_idle = bool(slow_start_after_idle)
        self.hosts: list[str] = topo.gpus
        self.routers: list[str] = [n for n in topo.nodes if topo.nodes[n].kind is not NodeKind.GPU]
        if tag is None:
            with _LOCK:
                _SEQ[0] += 1
                seq = _SEQ[0]
            tag = f"{PREFIX}{os.getpid() & 0xFFFF:04x}{seq & 0xF:x}"
        self.tag = check_tag(tag)
        self.namespace: dict[str, str] = {}
        for i, h in enumerate(self.hosts):
            self.namespace[h] = f"{self.tag}-h{i}"
        for j, r in enumerate(self.routers):
            self.namespace[r] = f"{self.tag}-s{j}"
        # physical links: (a, b, k); directed ids a->b and b->a
        self._phys: list[tuple[str, str]] = []
        seen: set[tuple[str, str]] = set()
        for lk in topo.links:
            if lk.id in topo.failed_links or (lk.dst, lk.src) in seen:
                continue
            seen.add((lk.src, lk.dst))
            self._phys.append((lk.src, lk.dst))
        if len(self._phys) > MAX_LINKS:
            raise ConfigError("topology", f"{len(self._phys)} links are too many to emulate",
                              f"use at most {MAX_LINKS} links")
        self._end: dict[tuple[str, str], tuple[str, str]] = {}  # (u, v) -> (device at u, address at u)
        for k, (a, b) in enumerate(self._phys):
            base = _NET_BASE + 4 * k
            self._end[(a, b)] = (f"{self.tag}e{k}a", _ip4(base + 1))
            self._end[(b, a)] = (f"{self.tag}e{k}b", _ip4(base + 2))
        self.host_ip: dict[str, str] = {}
        self.host_iface: dict[str, str] = {}
        for h in self.hosts:
            first = next(((u, v) for (u, v) in self._end if u == h), None)
            if first is None:
                raise ConfigError("topology", f"host {h!r} has no link", "link every GPU to the network")
            self.host_iface[h], self.host_ip[h] = self._end[first]
        self.shapes: list[LinkShape] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self._created: list[str] = []
        self._tempdirs: list[str] = []
        self._lock = RunLock(self.tag)
        self._up = False
        self.netem = False

    # ---- naming ---------------------------------------------------------------------------------
    def rank_namespace(self, rank: int) -> str:
        return self.namespace[self.hosts[rank]]

    def rank_ip(self, rank: int) -> str:
        return self.host_ip[self.hosts[rank]]

    def rank_iface(self, rank: int) -> str:
        return self.host_iface[self.hosts[rank]]

    @property
    def effective_latency_scale(self) -> float:
        """``latency_scale``, or 0 once set up on a kernel without netem (the links then add no delay)."""
        return self.latency_scale if (self.netem or not self._up) else 0.0

    def scaled_topology(self) -> Topology:
        """A copy of ``topo`` with the emulated (scaled) bandwidths and latencies; same link ids and meta.
        Bandwidths are what the shaped links deliver to TCP payload: ``bandwidth · scale ·``
        :data:`TCP_PAYLOAD_EFFICIENCY` (module docstring). The models' parameters for it come from
        :meth:`network_params`."""
        t = Topology(self.topo.name + "-emulated")
        for n, node in self.topo.nodes.items():
            t.add_node(n, node.kind, node.server, node.transit, **node.attrs)
        links = self.topo.links
        for lk in links:
            rid = self.topo.link_id(lk.dst, lk.src)
            if rid < lk.id:
                continue
            payload = self.bandwidth_scale * TCP_PAYLOAD_EFFICIENCY
            t.add_link(lk.src, lk.dst, lk.bandwidth_bytes_per_s * payload,
                       lk.latency_s * self.effective_latency_scale, lk.kind,
                       bandwidth_b_to_a=links[rid].bandwidth_bytes_per_s * payload)
        t.meta = dict(self.topo.meta)
        failed = [(links[lid].src, links[lid].dst, 0.0) for lid in sorted(self.topo.failed_links)
                  if lid < self.topo.link_id(links[lid].dst, links[lid].src)]
        return t.with_degraded_links(failed)

    def network_params(self, message_overhead_s: float = DEFAULT_MESSAGE_OVERHEAD_S) -> NetworkParams:
        """The network models' parameters for this emulation: ``message_overhead_s`` as alpha, and every rank
        on this machine's cores (``shared_cpu_cores``: the cores this process may run on; used by
        ``flow-eager``)."""
        return NetworkParams(message_overhead_s, shared_cpu_cores=float(_cores()))

    # ---- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> Emulation:
        ok, why = netns_available()
        if not ok:
            raise ConfigError("testbed", why, "run as root on Linux with iproute2")
        _install_handlers()
        with _signals_deferred():
            self._lock.acquire()  # before anything is created: a held tag is refused here
            with _LOCK:
                _ACTIVE.append(self)
            try:
                if leftovers(self.tag):  # an orphan of an earlier run with this tag: ours to remove now
                    clean(self.tag, force=True, _held=True)
                self._setup()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _setup(self) -> None:
        for node in self.hosts + self.routers:
            ns = self.namespace[node]
            self._created.append(ns)  # recorded first: if `ip` is interrupted, close() still tries it
            _run(["ip", "netns", "add", ns])
        root = []
        for a, b in self._phys:
            da, db = self._end[(a, b)][0], self._end[(b, a)][0]
            root.append(f"link add {da} netns {self.namespace[a]} type veth peer name {db} "
                        f"netns {self.namespace[b]}")
        _run(["ip", "-batch", "-"], stdin="\n".join(root) + "\n")
        netem = self.netem = _has_netem(self._created[0])
        ipcmd: dict[str, list[str]] = {ns: ["link set lo up"] for ns in self._created}
        tccmd: dict[str, list[str]] = {ns: [] for ns in self._created}
        for (u, v), (dev, addr) in self._end.items():
            ns = self.namespace[u]
            ipcmd[ns].append(f"addr add {addr}/30 dev {dev}")
            ipcmd[ns].append(f"link set {dev} up")
            lk = self.topo.links[self.topo.link_id(u, v)]
            rate = lk.bandwidth_bytes_per_s * self.bandwidth_scale * 8.0
            delay = lk.latency_s * self.latency_scale
            burst = max(self.burst_bytes, 2 * (MTU_BYTES + 14))
            leaf = (f"netem delay {delay * 1e6:.3f}us limit {self.queue_packets}" if netem
                    else f"pfifo limit {self.queue_packets}")
            if not netem:
                delay = 0.0
            tccmd[ns] += shaping_commands(dev, int(rate), burst, leaf, self.ack_priority)
            self.shapes.append(LinkShape(u, v, dev, ns, lk.bandwidth_bytes_per_s, rate, lk.latency_s, delay,
                                         netem))
        # routes along topotrain's paths
        table = {h: 100 + i for i, h in enumerate(self.hosts)}
        quick = " quickack 1" if self.quickack else ""
        rules: dict[str, set[str]] = {}
        for s in self.hosts:
            for d in self.hosts:
                if s == d:
                    continue
                path = self.topo.router.node_path(s, d)
                for u, v in zip(path[:-1], path[1:], strict=True):
                    dev = self._end[(u, v)][0]
                    gw = self._end[(v, u)][1]
                    ns = self.namespace[u]
                    if u == s:
                        ipcmd[ns].append(f"route replace {self.host_ip[d]}/32 via {gw} dev {dev} onlink "
                                         f"src {self.host_ip[s]}{quick}")
                    else:
                        ipcmd[ns].append(f"route replace {self.host_ip[d]}/32 via {gw} dev {dev} onlink "
                                         f"table {table[s]}")
                        rules.setdefault(ns, set()).add(s)
        for ns, srcs in rules.items():
            for s in sorted(srcs, key=table.__getitem__):
                ipcmd[ns].append(f"rule add from {self.host_ip[s]}/32 lookup {table[s]} pref {table[s]}")
        sysctl = ("echo 1 > /proc/sys/net/ipv4/ip_forward; "
                  f"echo {int(self.slow_start_after_idle)} > /proc/sys/net/ipv4/tcp_slow_start_after_idle; "
                  "for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done")
        for ns in self._created:
            _run(["ip", "netns", "exec", ns, "sh", "-c", sysctl])
            # links first (addresses, up), then routes: batch order is file order
            _run(["ip", "-n", ns, "-batch", "-"], stdin="\n".join(ipcmd[ns]) + "\n")
            if tccmd[ns]:
                _run(["tc", "-n", ns, "-batch", "-"], stdin="\n".join(tccmd[ns]) + "\n")
        self._up = True

    def close(self) -> None:
        """Kill this run's processes, delete its namespaces, veths and temporary directories, then give up
        its tag (idempotent; SIGINT/SIGTERM wait until it is done)."""
        with _signals_deferred():
            for p in self._procs:
                _kill(p)
            self._procs.clear()
            for ns in reversed(self._created):
                _kill_ns_pids(ns)
                _run(["ip", "netns", "del", ns], check=False, timeout_s=30)
            self._created.clear()
            shown = _run(["ip", "-o", "link", "show"], check=False)
            for name in _link_names(shown.stdout):
                if of_run(name, self.tag):
                    _run(["ip", "link", "del", name], check=False)
            for d in self._tempdirs:
                shutil.rmtree(d, ignore_errors=True)
            self._tempdirs.clear()
            self._up = False
            self._lock.release()
            with _LOCK:
                if self in _ACTIVE:
                    _ACTIVE.remove(self)

    @contextlib.contextmanager
    def tempdir(self) -> Iterator[str]:
        """A temporary directory of this run (``<tag>-XXXX`` under the temporary directory), recorded in its
        lock file so that :func:`clean` removes it if the run dies; removed on leaving the block or at
        :meth:`close`."""
        d = tempfile.mkdtemp(prefix=f"{self.tag}-")
        self._tempdirs.append(d)
        self._lock.note_tempdir(d)
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
            if d in self._tempdirs:
                self._tempdirs.remove(d)

    # ---- processes ------------------------------------------------------------------------------
    def popen(self, rank: int, argv: Sequence[str], env: dict[str, str] | None = None,
              **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in rank's host namespace (own process group; killed at teardown)."""
        if not self._up:
            raise RuntimeError("the emulation is not running")
        full = ["ip", "netns", "exec", self.rank_namespace(rank), *argv]
        p = subprocess.Popen(full, env=env, start_new_session=True, **kw)
        self._procs.append(p)
        return p

    def describe(self) -> list[str]:
        """One line per shaped link direction: model bandwidth/latency and the emulated rate/delay."""
        return [s.describe() for s in self.shapes]

    def measure_rate(self, src_rank: int, dst_rank: int, size_bytes: int = 2_000_000,
                     timeout_s: float = 20.0) -> float:
        """Bytes/s of one TCP transfer of ``size_bytes`` from one host to another (a rate sanity check).

        The receiver times from its first to its last byte, so connection setup is not counted.
        """
        port = 29000 + (os.getpid() % 1000)
        server = (
            "import socket,time,sys\n"
            f"s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            f"s.bind(('{self.rank_ip(dst_rank)}',{port}));s.listen(1);s.settimeout({timeout_s})\n"
            "c,_=s.accept();c.settimeout(%f);n=0;t0=None\n"
            "while True:\n"
            "    b=c.recv(1<<20)\n"
            "    if not b: break\n"
            "    if t0 is None: t0=time.perf_counter(); first=len(b)\n"
            "    n+=len(b)\n"
            "print((n-first)/(time.perf_counter()-t0))\n") % timeout_s
        client = (
            "import socket,time\n"
            f"data=b'x'*{int(size_bytes)}\n"
            "for _ in range(100):\n"
            "    try:\n"
            f"        c=socket.create_connection(('{self.rank_ip(dst_rank)}',{port}),"
            f"timeout={timeout_s});break\n"
            "    except OSError: time.sleep(0.05)\n"
            "c.sendall(data);c.close()\n")
        srv = self.popen(dst_rank, [sys.executable, "-c", server], stdout=subprocess.PIPE, text=True)
        cli = self.popen(src_rank, [sys.executable, "-c", client])
        try:
            out, _ = srv.communicate(timeout=timeout_s)
            cli.wait(timeout=timeout_s)
        finally:
            _kill(srv)
            _kill(cli)
        try:
            return float(out.strip())
        except ValueError:
            raise RuntimeError(f"rate check {src_rank}->{dst_rank} printed {out!r}") from None


def _cores() -> int:
    """CPU cores this process (and the ranks it starts) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _has_netem(ns: str) -> bool:
    """Whether the kernel has sch_netem (some VM kernels ship without it; then links get no delay)."""
    p = _run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "netem", "delay", "1us"],
             check=False)
    if p.returncode == 0:
        _run(["tc", "-n", ns, "qdisc", "del", "dev", "lo", "root"], check=False)
        return True
    return False


def _kill(p: subprocess.Popen[Any]) -> None:
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=5)


def _kill_ns_pids(ns: str) -> None:
    p = _run(["ip", "netns", "pids", ns], check=False)
    for tok in p.stdout.split():
        if tok.isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(tok), signal.SIGKILL)


def _link_names(ip_o_link: str) -> list[str]:
    out = []
    for line in ip_o_link.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            out.append(parts[1].strip().split("@", 1)[0])
    return out


def live_runs() -> dict[str, int | None]:
    """The run tags held by live processes now, with each holder's pid."""
    out: dict[str, int | None] = {}
    for f in sorted(run_dir().glob(f"{PREFIX}*.lock")):
        tag = f.name[: -len(".lock")]
        if run_alive(tag):
            out[tag] = owner_pid(f)
    return out


def clean(tag: str | None = None, *, force: bool = False, _held: bool = False) -> list[str]:
    """Delete the namespaces (killing what runs in them), root-namespace veths and temporary directories
    of orphaned runs: the run ``tag``, or with no tag every ``tt-`` run on the machine. A run whose owner
    process is alive (:func:`live_runs`) is left alone unless ``force``.

    Returns the names removed (namespaces first, then links, then temporary directories).
    """
    live = set() if force or _held else set(live_runs())

    def ours(name: str) -> bool:
        t = tag_of(name)
        return made_by_topotrain(name, tag) and t is not None and t not in live

    removed: list[str] = []
    tags: set[str] = set()
    with _signals_deferred():
        p = _run(["ip", "netns", "list"], check=False)
        for line in p.stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if ours(name):
                _kill_ns_pids(name)
                if _run(["ip", "netns", "del", name], check=False).returncode == 0:
                    removed.append(name)
                tags.add(str(tag_of(name)))
        p = _run(["ip", "-o", "link", "show"], check=False)
        for name in _link_names(p.stdout):
            if ours(name) and _run(["ip", "link", "del", name], check=False).returncode == 0:
                removed.append(name)
                tags.add(str(tag_of(name)))
        if not _held:
            for f in run_dir().glob(f"{PREFIX}*.lock"):
                t = f.name[: -len(".lock")]
                if (tag is None or t == tag) and t not in live and (force or not run_alive(t)):
                    tags.add(t)
            for t in sorted(tags):
                removed += remove_run_files(t)
    return removed


def leftovers(tag: str | None = None) -> list[str]:
    """Names of the namespaces and root-namespace links of the run ``tag`` that exist now (with no tag:
    every ``tt-`` one, whichever run made it)."""
    listed = _run(["ip", "netns", "list"], check=False).stdout.splitlines()
    names = [ln.split()[0] for ln in listed if ln.split()]
    links = _link_names(_run(["ip", "-o", "link", "show"], check=False).stdout)
    return [n for n in names + links if made_by_topotrain(n, tag)]


def _close_all() -> None:
    with _LOCK:
        active = list(_ACTIVE)
    for emu in active:
        with contextlib.suppress(Exception):
            emu.close()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _close_all()
    prev = _PREV.get(signum)
    if callable(prev):
        prev(signum, frame)
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    sys.exit(128 + signum)


_PREV: dict[int, Any] = {}


def _install_handlers() -> None:
    if _HANDLERS_INSTALLED[0]:
        return
    _HANDLERS_INSTALLED[0] = True
    atexit.register(_close_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        prev = signal.getsignal(sig)
        if prev is signal.SIG_IGN:  # inherited as ignored (e.g. `nohup`, a background job): stays ignored
            continue
        keep = prev not in (signal.SIG_DFL, signal.default_int_handler)
        _PREV[sig] = prev if keep else None
        signal.signal(sig, _on_signal)


def wait_all(procs: Sequence[subprocess.Popen[Any]], timeout_s: float) -> list[int | None]:
    """Wait for all ``procs`` up to ``timeout_s`` in total; kill those still running. Return codes."""
    deadline = time.monotonic() + timeout_s
    codes: list[int | None] = []
    for p in procs:
        left = max(0.0, deadline - time.monotonic())
        try:
            codes.append(p.wait(timeout=left))
        except subprocess.TimeoutExpired:
            _kill(p)
            codes.append(None)
    return codes
