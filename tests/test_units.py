import pytest

from topotrain.errors import ConfigError
from topotrain.units import format_size, parse_bandwidth, parse_size, parse_time


def test_sizes() -> None:
    assert parse_size("256MiB") == 256 * 2**20
    assert parse_size("1.5GB") == 1.5e9
    assert parse_size("8Gb") == 1e9
    assert parse_size(4096) == 4096
    assert format_size(256 * 2**20) == "256 MiB"


def test_bandwidth_and_time() -> None:
    assert parse_bandwidth("100Gbps") == 12.5e9
    assert parse_bandwidth("25GB/s") == 25e9
    assert parse_bandwidth("200Gb/s") == 25e9
    assert parse_time("1.5us") == pytest.approx(1.5e-6)
    assert parse_time("2ms") == pytest.approx(2e-3)


@pytest.mark.parametrize("bad", ["-1MiB", "0", "abc", "1 parsec"])
def test_bad_sizes(bad: str) -> None:
    with pytest.raises(ConfigError, match="size"):
        parse_size(bad)
