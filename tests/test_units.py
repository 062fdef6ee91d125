import pytest

from topotrain.util.errors import ConfigError
from topotrain.util.units import format_size, parse_bandwidth, parse_size, parse_time


def test_sizes() -> None:
    assert parse_size("256MiB") == 256 * 2**20
    assert parse_size("1.5GB") == 1.5e9  # capital B after a decimal prefix: decimal bytes
    assert parse_size("8Gb") == 1e9  # lowercase b: bits
    assert parse_size(4096) == 4096  # a plain number is bytes (as nccl-tests)
    assert format_size(256 * 2**20) == "256 MiB"


@pytest.mark.parametrize(("text", "expected"), [
    ("256M", 256 * 2**20), ("1G", 2**30), ("8K", 8 * 2**10), ("256m", 256 * 2**20), ("1g", 2**30),
    ("1mib", 2**20), ("1MIB", 2**20), ("2 GiB", 2 * 2**30), ("1kB", 1000.0),
])
def test_sizes_follow_nccl_tests(text: str, expected: float) -> None:
    assert parse_size(text) == expected


def test_bare_size_refused_where_a_unit_is_needed() -> None:
    with pytest.raises(ConfigError, match="25MiB") as e:
        parse_size(25, "plan.bucket", bare_bytes=False)
    assert "bytes" in e.value.message
    assert parse_size(1024, "plan.bucket_bytes", bare_bytes=False) == 1024  # the name states the unit


def test_bandwidth_and_time() -> None:
    assert parse_bandwidth("100Gbps") == 12.5e9
    assert parse_bandwidth("25GB/s") == 25e9
    assert parse_bandwidth("200Gb/s") == 25e9
    assert parse_time("1.5us") == pytest.approx(1.5e-6)
    assert parse_time("2ms") == pytest.approx(2e-3)
    assert parse_time(0) == 0.0 and parse_time("0") == 0.0  # zero needs no unit


@pytest.mark.parametrize("bad", [1, 1.5, "1", "2.5"])
def test_bare_time_refused(bad: str | float) -> None:
    with pytest.raises(ConfigError, match="us") as e:
        parse_time(bad, "cluster.network.latency")
    assert e.value.field == "cluster.network.latency" and "seconds" in e.value.message


def test_bare_bandwidth_refused_with_bits_and_bytes() -> None:
    with pytest.raises(ConfigError) as e:
        parse_bandwidth(100, "cluster.network.bandwidth")
    assert "bits or bytes" in e.value.message and "Gbps" in e.value.fix and "GB/s" in e.value.fix
    with pytest.raises(ConfigError, match="bits per second"):
        parse_bandwidth("100G", "x")


def test_si_numbers_where_the_name_or_the_caller_says_so() -> None:
    assert parse_time(1e-6, "link_latency_s") == 1e-6
    assert parse_bandwidth(12.5e9, "network.link_bandwidth_bytes_per_s") == 12.5e9
    assert parse_time(2e-6, "message_overhead", si_number=True) == 2e-6
    assert parse_bandwidth(1e9, "bandwidth", si_number=True) == 1e9


@pytest.mark.parametrize("bad", ["-1MiB", "0", "abc", "1 parsec", "1e400MiB"])
def test_bad_sizes(bad: str) -> None:
    with pytest.raises(ConfigError, match="size|bytes|finite"):
        parse_size(bad)
