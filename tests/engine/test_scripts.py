"""The Lua scripts as loaded: the shared prelude in front, its constants from Python."""

from pathlib import Path

import pytest
from redis.exceptions import ResponseError

from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.ops.metrics import MINUTE_BUCKET_TTL_S, SECOND_BUCKET_TTL_S
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.engine.store.scripts import source
from tests.helpers import keys_matching

LUA_DIR = Path(__file__).parents[2] / "chasqui_core" / "engine" / "store" / "lua"


def test_counter_buckets_live_as_long_as_metrics_says(redis):
    Queue("ttl", redis_client=redis).add("t")
    keys = QueueKeys.for_queue("ttl")
    [second] = keys_matching(redis, f"{keys.second_counters}*")
    [minute] = keys_matching(redis, f"{keys.minute_counters}*")
    assert redis.hget(second, "enqueued") == b"1" and redis.hget(minute, "enqueued") == b"1"
    assert SECOND_BUCKET_TTL_S - 60 < redis.ttl(second) <= SECOND_BUCKET_TTL_S
    assert MINUTE_BUCKET_TTL_S - 60 < redis.ttl(minute) <= MINUTE_BUCKET_TTL_S


def test_lua_errors_name_the_line_of_the_script_file(redis):
    lines = (LUA_DIR / "settle.lua").read_text().splitlines()
    line = lines.index("if c > 0 then") + 1
    keys = QueueKeys.for_queue("lines")
    with pytest.raises(ResponseError, match=rf"user_script:{line}:"):
        # the count of completed entries is not a number: settle.lua fails comparing it
        redis.eval(source("settle"), 4, keys.stream, keys.delayed, keys.dlq, keys.events,
                   "chasqui", keys.metrics, 100, "", "not a number")
