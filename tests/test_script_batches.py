"""`evalsha_batch`: many script calls in one round trip, packed by hiredis, with each call's own reply or error
in order (the event log's group commit sends every streamed delta's event and every commit through it)."""

from __future__ import annotations

import pytest
import redis

from stepq.store.pipelines import evalsha_batch
from tests.conftest import REDIS_URL


@pytest.fixture
def client():
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def test_each_call_gets_its_own_reply_or_error_in_order(client, prefix):
    incr = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    fail = client.register_script("return redis.error_reply('ERR refused ' .. ARGV[1])")
    unknown = client.register_script(f"return '{prefix} never loaded'")  # its sha is not in the server's cache
    incr(keys=[f"{prefix}:n"], args=[1])  # loaded
    client.script_load(fail.script)
    replies = evalsha_batch(
        client,
        [
            (incr, [f"{prefix}:n"], [2]),
            (fail, [f"{prefix}:n"], ["this one"]),
            (unknown, [f"{prefix}:n"], []),
            (incr, [f"{prefix}:n"], [10]),
        ],
    )
    assert replies[0] == 3 and replies[3] == 13  # the calls after an error still ran, in order
    assert isinstance(replies[1], redis.ResponseError) and "refused this one" in str(replies[1])
    assert isinstance(replies[2], redis.exceptions.NoScriptError)  # the caller loads it and runs it again
    assert client.get(f"{prefix}:n") == b"13"


def test_an_argument_redis_cannot_take_is_a_data_error_before_anything_is_sent(client, prefix):
    incr = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    with pytest.raises(redis.DataError):
        evalsha_batch(client, [(incr, [f"{prefix}:n"], [1]), (incr, [f"{prefix}:n"], [None])])
    assert client.get(f"{prefix}:n") is None
