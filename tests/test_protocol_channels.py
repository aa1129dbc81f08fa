"""raftcoord.protocol.channels: the one channel cache of every component."""

from __future__ import annotations

import pytest

from raftcoord.protocol.channels import ChannelCache


class Closed(Exception):
    pass


def test_one_channel_and_one_stub_of_each_kind_per_address() -> None:
    channels = ChannelCache([("grpc.max_receive_message_length", 1024)], closed_error=Closed)
    try:
        assert channels.channel("localhost:1") is channels.channel("localhost:1")
        assert channels.channel("localhost:1") is not channels.channel("localhost:2")
        assert channels.coordinator("localhost:1") is channels.coordinator("localhost:1")
        assert channels.partition_log("localhost:1") is channels.partition_log("localhost:1")
        assert channels.coordinator("localhost:1") is not channels.partition_log("localhost:1")
    finally:
        channels.close()


def test_a_closed_cache_raises_the_callers_error() -> None:
    channels = ChannelCache(closed_error=Closed)
    channels.coordinator("localhost:1")
    channels.close()
    for ask in (channels.channel, channels.coordinator, channels.partition_log):
        with pytest.raises(Closed):
            ask("localhost:1")
