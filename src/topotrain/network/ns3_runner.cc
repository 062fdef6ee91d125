// topotrain's ns-3 scenario runner: the same directed-link graph, the same per-pair paths, and the
// schedules' phases as transfers over persistent TCP connections. Compiled by cppyy (ns3_driver.py).
//
// * Every undirected node pair of the topology is one point-to-point channel; each side's device sends at
//   that direction's capacity (DataRate), the channel's delay is the link latency.
// * Routes follow topotrain's router exactly: connection q from node s to node d gets its own
//   destination address (on d's loopback) and source address (on s's loopback); every node on the path
//   s -> d holds a /32 host route to the destination address via the next node, and every node on the
//   path d -> s one to the source address (the ACKs' way back). ECMP is therefore the same hash-chosen
//   path as in the fluid models: differences come from the transport, not from routing.
// * One TCP connection per (job, source, destination), opened before the jobs start (as NCCL/MPI open
//   their connections at communicator creation) and warm (a byte each in the warm-up, OnConnected);
//   a phase writes its transfer's bytes to the socket,
//   a transfer is done when the receiver has read all its bytes, a phase when all its transfers are done;
//   the next phase starts ``alpha_s`` (the per-message overhead) later, as the flow model charges it.
// * Two transports (packet_ns3.PacketConfig): mainline TCP with drop-tail ports, or the lossless,
//   RDMA-like mode (initial_cwnd_segments at the socket buffer, ports that cannot overflow, a 1 s minimum
//   RTO, host_fair_queue: senders serve their connections round robin, a packet each).
// * Drops are counted where a full port drops: the traffic-control layer's TcDrop (no queue disc in front
//   of a switch port's device, whose queue stops when full), the IP layer's Drop (no route, TTL).
#include "ns3/config.h"
#include "ns3/data-rate.h"
#include "ns3/drop-tail-queue.h"
#include "ns3/fq-codel-queue-disc.h"
#include "ns3/inet-socket-address.h"
#include "ns3/internet-stack-helper.h"
#include "ns3/ipv4-address-generator.h"
#include "ns3/ipv4-address-helper.h"
#include "ns3/ipv4-static-routing-helper.h"
#include "ns3/node-container.h"
#include "ns3/packet.h"
#include "ns3/point-to-point-helper.h"
#include "ns3/point-to-point-net-device.h"
#include "ns3/rng-seed-manager.h"
#include "ns3/simulator.h"
#include "ns3/socket.h"
#include "ns3/string.h"
#include "ns3/tcp-socket-factory.h"
#include "ns3/traffic-control-helper.h"
#include "ns3/traffic-control-layer.h"
#include "ns3/uinteger.h"

#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <vector>

namespace tt
{
using namespace ns3;

struct Flow
{
    uint64_t target;  // cumulative bytes the connection's receiver must have read
    int job;
};

struct Job
{
    double start_s;
    int phase_lo, phase_hi;  // its phases: [phase_lo, phase_hi)
    int cur;
    int remaining;
};

struct Run
{
    std::vector<Ptr<Socket>> tx;
    std::vector<uint64_t> pending, sent, rx;
    std::vector<std::deque<Flow>> waiting;
    std::vector<int> conn_of_flow;
    std::vector<long> phase_flow_off, flow_conn;
    std::vector<double> flow_bytes;
    std::vector<Job> jobs;
    std::vector<double> phase_end_s;
    double t0_s = 0.0, alpha_s = 0.0;
    int connected = 0, drops = 0;
};

static Run* g_run = nullptr;

static void TrySend(int c)
{
    Run& r = *g_run;
    Ptr<Socket> s = r.tx[c];
    while (r.pending[c] > 0)
    {
        uint32_t avail = s->GetTxAvailable();
        if (avail == 0)
            break;
        uint32_t n = (uint32_t)std::min<uint64_t>({r.pending[c], (uint64_t)avail, (uint64_t)(1u << 20)});
        int sent = s->Send(Create<Packet>(n));
        if (sent <= 0)
            break;
        r.pending[c] -= (uint64_t)sent;
    }
}

static void OnSendSpace(int c, Ptr<Socket>, uint32_t)
{
    TrySend(c);
}

static void StartPhase(int j);

static void EndPhase(int j, double after_s)
{
    Run& r = *g_run;
    Job& job = r.jobs[j];
    r.phase_end_s[job.cur] = Simulator::Now().GetSeconds() - r.t0_s + after_s;
    job.cur += 1;
    if (job.cur < job.phase_hi)
        Simulator::Schedule(Seconds(after_s), &StartPhase, j);
}

static void FlowDone(int j)
{
    if (--g_run->jobs[j].remaining == 0)
        EndPhase(j, g_run->alpha_s);
}

static void OnRecv(int c, Ptr<Socket> s)
{
    Run& r = *g_run;
    Ptr<Packet> p;
    while ((p = s->Recv()))
        r.rx[c] += p->GetSize();
    while (!r.waiting[c].empty() && r.rx[c] >= r.waiting[c].front().target)
    {
        int j = r.waiting[c].front().job;
        r.waiting[c].pop_front();
        FlowDone(j);
    }
}

static void OnAccept(int c, Ptr<Socket> s, const Address&)
{
    s->SetRecvCallback(MakeBoundCallback(&OnRecv, c));
}

// A connection carries one byte in the warm-up: until its peer acknowledges data, a sender knows only the
// window of the peer's SYN, which TCP sends unscaled (at most 65,535 bytes, RFC 7323 §2.2), so the first
// 64 KiB of a phase would otherwise wait a round trip for the scaled window that a warm connection has.
static void OnConnected(int c, Ptr<Socket> s)
{
    g_run->connected += 1;
    g_run->sent[c] += 1;
    s->Send(Create<Packet>(1));
}

static void OnDrop(Ptr<const Packet>)
{
    g_run->drops += 1;
}

static void OnIpDrop(const Ipv4Header&, Ptr<const Packet>, Ipv4L3Protocol::DropReason, Ptr<Ipv4>, uint32_t)
{
    g_run->drops += 1;  // no route, TTL: never expected (routes are complete), counted with the losses
}

static void StartPhase(int j)
{
    Run& r = *g_run;
    Job& job = r.jobs[j];
    int k = job.cur;
    long lo = r.phase_flow_off[k], hi = r.phase_flow_off[k + 1];
    job.remaining = (int)(hi - lo);
    if (job.remaining == 0)  // a phase of local copies only ends at once (as in the flow model)
    {
        EndPhase(j, 0.0);
        return;
    }
    for (long f = lo; f < hi; ++f)
    {
        int c = (int)r.flow_conn[f];
        uint64_t b = (uint64_t)r.flow_bytes[f];
        r.sent[c] += b;
        r.pending[c] += b;
        r.waiting[c].push_back(Flow{r.sent[c], j});
    }
    for (long f = lo; f < hi; ++f)
        TrySend((int)r.flow_conn[f]);
}

static void StartJob(int j)
{
    Run& r = *g_run;
    if (r.jobs[j].phase_lo == r.jobs[j].phase_hi)
        return;
    r.jobs[j].cur = r.jobs[j].phase_lo;
    StartPhase(j);
}

// Returns [phase end times (relative to the jobs' clock)..., connections established, drops, events].
std::vector<double> run(int n_nodes,
                        const std::vector<long>& ch_a, const std::vector<long>& ch_b,
                        const std::vector<double>& rate_ab_bps, const std::vector<double>& rate_ba_bps,
                        const std::vector<double>& delay_s,
                        // connections: endpoints and the node paths there and back (CSR)
                        const std::vector<long>& conn_src, const std::vector<long>& conn_dst,
                        const std::vector<long>& fwd_off, const std::vector<long>& fwd_nodes,
                        const std::vector<long>& rev_off, const std::vector<long>& rev_nodes,
                        // jobs: start time, their phases (CSR over phases), the phases' flows
                        const std::vector<double>& job_start_s, const std::vector<long>& job_phase_off,
                        const std::vector<long>& phase_flow_off, const std::vector<long>& flow_conn,
                        const std::vector<double>& flow_bytes,
                        double alpha_s, int mtu_bytes, int queue_packets, double min_rto_s, double warmup_s,
                        uint32_t seed, const std::string& tcp_variant, int del_ack_count,
                        int initial_cwnd_segments, int host_fair_queue)
{
    RngSeedManager::SetSeed(seed);
    RngSeedManager::SetRun(1);
    Ipv4AddressGenerator::Reset();
    uint32_t seg = (uint32_t)(mtu_bytes - 20 - 32);  // IPv4 header, TCP header with timestamps
    Config::SetDefault("ns3::TcpL4Protocol::SocketType", StringValue(tcp_variant));
    Config::SetDefault("ns3::TcpSocket::SegmentSize", UintegerValue(seg));
    Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(16u << 20));
    Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(16u << 20));
    Config::SetDefault("ns3::TcpSocketBase::MinRto", TimeValue(Seconds(min_rto_s)));
    Config::SetDefault("ns3::TcpSocket::DelAckCount", UintegerValue((uint32_t)del_ack_count));
    Config::SetDefault("ns3::TcpSocket::ConnTimeout", TimeValue(Seconds(std::max(min_rto_s, 1e-3))));
    // 0: ns-3's default initial window (10 segments, RFC 6928); the lossless mode opens with a window the
    // size of the socket buffer, so a connection sends at line rate from its first byte (as an RDMA NIC)
    if (initial_cwnd_segments > 0)
        Config::SetDefault("ns3::TcpSocket::InitialCwnd", UintegerValue((uint32_t)initial_cwnd_segments));

    Run r;
    g_run = &r;
    r.alpha_s = alpha_s;
    r.t0_s = warmup_s;
    NodeContainer nodes;
    nodes.Create(n_nodes);
    InternetStackHelper stack;
    Ipv4StaticRoutingHelper static_routing;
    stack.SetRoutingHelper(static_routing);
    stack.Install(nodes);
    for (int i = 0; i < n_nodes; ++i)
    {
        nodes.Get(i)->GetObject<Ipv4L3Protocol>()->TraceConnectWithoutContext("Drop", MakeCallback(&OnIpDrop));
        // a full port: the device queue stops (flow control) and the traffic-control layer, with no queue
        // disc in front of the device, drops the packet itself; the device queue's own Drop never fires
        bool ok = nodes.Get(i)->GetObject<TrafficControlLayer>()->TraceConnectWithoutContext(
            "TcDrop", MakeCallback(&OnDrop));
        NS_ABORT_MSG_IF(!ok, "no TcDrop trace on the traffic-control layer");
    }

    // (u, v) -> (interface of u toward v, v's address on that link, u's address on that link)
    std::map<std::pair<long, long>, std::tuple<uint32_t, Ipv4Address, Ipv4Address>> hop;
    Ipv4AddressHelper addr("10.0.0.0", "255.255.255.252");
    TrafficControlHelper tch;
    std::set<long> senders(conn_src.begin(), conn_src.end());
    TrafficControlHelper fq;
    fq.SetRootQueueDisc("ns3::FqCoDelQueueDisc", "Target", StringValue("100s"), "Interval",
                        StringValue("1000s"), "MaxSize",
                        QueueSizeValue(QueueSize(QueueSizeUnit::PACKETS, (uint32_t)queue_packets)),
                        "Flows", UintegerValue(65536u));
    PointToPointHelper p2p;
    p2p.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize",
                 QueueSizeValue(QueueSize(QueueSizeUnit::PACKETS, queue_packets)));
    for (size_t i = 0; i < ch_a.size(); ++i)
    {
        p2p.SetChannelAttribute("Delay", TimeValue(Seconds(delay_s[i])));
        p2p.SetDeviceAttribute("Mtu", UintegerValue(mtu_bytes));
        NetDeviceContainer devs = p2p.Install(nodes.Get(ch_a[i]), nodes.Get(ch_b[i]));
        devs.Get(0)->SetAttribute("DataRate", DataRateValue(DataRate((uint64_t)rate_ab_bps[i])));
        devs.Get(1)->SetAttribute("DataRate", DataRateValue(DataRate((uint64_t)rate_ba_bps[i])));
        for (uint32_t d = 0; d < 2; ++d)
        {
            Ptr<PointToPointNetDevice> pd = DynamicCast<PointToPointNetDevice>(devs.Get(d));
            pd->GetQueue()->TraceConnectWithoutContext("Drop", MakeCallback(&OnDrop));
            pd->TraceConnectWithoutContext("MacTxDrop", MakeCallback(&OnDrop));
            pd->TraceConnectWithoutContext("PhyRxDrop", MakeCallback(&OnDrop));
        }
        Ipv4InterfaceContainer ifs = addr.Assign(devs);
        tch.Uninstall(devs);  // the device's drop-tail queue is the port buffer (no qdisc in front)
        for (uint32_t d = 0; d < 2 && host_fair_queue; ++d)
        {
            // a sending host serves its connections round robin, a packet each (deficit round robin with
            // an MTU quantum, Shreedhar & Varghese, SIGCOMM 1995), as an RDMA NIC arbitrates its queue
            // pairs: FQ-CoDel with CoDel's target and interval beyond any run (it never drops) in front of
            // a one-packet device queue, so the order is the scheduler's, not the sockets' write order
            if (!senders.count(d == 0 ? ch_a[i] : ch_b[i]))
                continue;
            DynamicCast<PointToPointNetDevice>(devs.Get(d))->GetQueue()->SetMaxSize(
                QueueSize(QueueSizeUnit::PACKETS, 1));
            fq.Install(devs.Get(d));
        }
        addr.NewNetwork();
        hop[{ch_a[i], ch_b[i]}] = {ifs.Get(0).second, ifs.GetAddress(1), ifs.GetAddress(0)};
        hop[{ch_b[i], ch_a[i]}] = {ifs.Get(1).second, ifs.GetAddress(0), ifs.GetAddress(1)};
    }

    size_t n_conn = conn_src.size();
    r.tx.resize(n_conn);
    r.pending.assign(n_conn, 0);
    r.sent.assign(n_conn, 0);
    r.rx.assign(n_conn, 0);
    r.waiting.resize(n_conn);
    std::set<std::pair<long, uint32_t>> routed;  // (node, destination) pairs that have their host route
    auto route = [&](const std::vector<long>& off, const std::vector<long>& path, size_t q, Ipv4Address dest) {
        for (long h = off[q]; h + 1 < off[q + 1]; ++h)
        {
            if (!routed.insert({path[h], dest.Get()}).second)
                continue;
            auto it = hop.find({path[h], path[h + 1]});
            NS_ABORT_MSG_IF(it == hop.end(), "path uses a node pair with no link");
            Ptr<Ipv4> ip = nodes.Get(path[h])->GetObject<Ipv4>();
            static_routing.GetStaticRouting(ip)->AddHostRouteTo(dest, std::get<1>(it->second),
                                                                std::get<0>(it->second));
        }
    };
    for (size_t q = 0; q < n_conn; ++q)
    {
        // 11.x.y.z: one destination address per connection (q < 2^24); the source is the sender's address
        // on its first hop (TCP's choice), routed back along the reverse path (shortest in hops like every
        // path, so next hops from different connections towards one address never loop)
        Ipv4Address dst_ip((uint32_t)((11u << 24) | (uint32_t)(q + 1)));
        Ptr<Node> s = nodes.Get(conn_src[q]);
        Ptr<Node> d = nodes.Get(conn_dst[q]);
        d->GetObject<Ipv4>()->AddAddress(0, Ipv4InterfaceAddress(dst_ip, Ipv4Mask("255.255.255.255")));
        auto first = hop.find({fwd_nodes[fwd_off[q]], fwd_nodes[fwd_off[q] + 1]});
        NS_ABORT_MSG_IF(first == hop.end(), "path uses a node pair with no link");
        Ipv4Address src_ip = std::get<2>(first->second);
        route(fwd_off, fwd_nodes, q, dst_ip);
        route(rev_off, rev_nodes, q, src_ip);
        uint16_t port = (uint16_t)(1024 + q % 60000);
        Ptr<Socket> listen = Socket::CreateSocket(d, TcpSocketFactory::GetTypeId());
        listen->Bind(InetSocketAddress(dst_ip, port));
        listen->Listen();
        listen->SetAcceptCallback(MakeNullCallback<bool, Ptr<Socket>, const Address&>(),
                                  MakeBoundCallback(&OnAccept, (int)q));
        Ptr<Socket> t = Socket::CreateSocket(s, TcpSocketFactory::GetTypeId());
        t->Bind();
        t->SetConnectCallback(MakeBoundCallback(&OnConnected, (int)q), MakeNullCallback<void, Ptr<Socket>>());
        t->SetSendCallback(MakeBoundCallback(&OnSendSpace, (int)q));
        r.tx[q] = t;
        Simulator::Schedule(Seconds(0.0), [t, dst_ip, port]() { t->Connect(InetSocketAddress(dst_ip, port)); });
    }

    r.phase_flow_off = phase_flow_off;
    r.flow_conn = flow_conn;
    r.flow_bytes = flow_bytes;
    r.phase_end_s.assign(phase_flow_off.size() - 1, -1.0);
    for (size_t j = 0; j + 1 < job_phase_off.size(); ++j)
    {
        r.jobs.push_back(Job{job_start_s[j], (int)job_phase_off[j], (int)job_phase_off[j + 1], 0, 0});
        Simulator::Schedule(Seconds(warmup_s + job_start_s[j]), &StartJob, (int)j);
    }
    Simulator::Run();
    std::vector<double> out = r.phase_end_s;
    out.push_back((double)r.connected);
    out.push_back((double)r.drops);
    out.push_back((double)Simulator::GetEventCount());
    Simulator::Destroy();
    g_run = nullptr;
    return out;
}
}  // namespace tt
