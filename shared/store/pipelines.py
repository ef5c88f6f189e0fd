"""Queueing a Lua script on a pipeline, on a single Redis and on a Redis Cluster alike.

redis-py's cluster pipeline refuses EVALSHA (it cannot load a missing script on the right node mid-pipeline),
so there the script goes as EVAL with its body; the server caches it the same way.
"""

from __future__ import annotations

from typing import Any, cast

import redis
from hiredis import pack_command
from redis.cluster import ClusterPipeline
from redis.commands.core import Script


def queue_script(
    pipe: redis.client.Pipeline | ClusterPipeline, script: Script, keys: list[str], args: list[Any]
) -> None:
    """Add one call of `script` to `pipe` (its reply lands in the pipeline's results like any command's)."""
    if isinstance(pipe, ClusterPipeline):
        pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)
    else:
        script(keys=keys, args=args, client=pipe)


def queue_evalsha(
    pipe: redis.client.Pipeline | ClusterPipeline, script: Script, keys: list[str], args: list[Any]
) -> None:
    """Like `queue_script`, without the pipeline's own script loading (the caller retries a NoScriptError)."""
    if isinstance(pipe, ClusterPipeline):
        pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)
    else:
        pipe.evalsha(script.sha, len(keys), *keys, *args)


def run_scripts(
    pipe: redis.client.Pipeline | ClusterPipeline, writes: list[tuple[Script, list[str], list[Any]]]
) -> list[Any]:
    """Send script calls in one round trip (in a MULTI when `pipe` is transactional) and return their replies.
    A call the server's script cache missed (it was flushed) did not run: it runs again alone, in order, so
    each call still runs exactly once and after the ones before it."""
    for script, keys, args in writes:
        queue_evalsha(pipe, script, keys, args)
    replies = pipe.execute(raise_on_error=False)
    for index, reply in enumerate(replies):
        if isinstance(reply, redis.exceptions.NoScriptError):
            script, keys, args = writes[index]
            replies[index] = script(keys=keys, args=args)
        elif isinstance(reply, Exception):
            raise reply
    return list(replies)


def run_with_rider(
    pipe: redis.client.Pipeline | ClusterPipeline,
    write: tuple[Script, list[str], list[Any]],
    rider: tuple[Script, list[str], list[Any]],
) -> Any:
    """`write`, then `rider` (a script that applies only if `write` took: a version-checked listing), in one round
    trip; `write`'s reply. If the server's script cache had lost `write` (a restart), `rider` ran ahead of it, found
    nothing and did nothing: it runs again once `write` has run alone."""
    for script, keys, args in (write, rider):
        queue_evalsha(pipe, script, keys, args)
    reply, ridden = pipe.execute(raise_on_error=False)
    rerun = isinstance(reply, redis.exceptions.NoScriptError)
    if rerun:
        reply = write[0](keys=write[1], args=write[2])
    elif isinstance(reply, Exception):
        raise reply
    if rerun or isinstance(ridden, redis.exceptions.NoScriptError):
        rider[0](keys=rider[1], args=rider[2])
    elif isinstance(ridden, Exception):
        raise ridden
    return reply


def evalsha_batch(client: redis.Redis, calls: list[tuple[Script, list[str], list[Any]]]) -> list[Any]:
    """EVALSHA calls in one round trip on a single Redis; each call's reply, or its error as the exception.

    The event log's group commit sends hundreds of these a second per worker (every streamed delta's event, every
    commit): redis-py's pipeline spends ~8 µs of bookkeeping per queued command, hiredis packs one in ~1 µs. The
    round trip is retried as a pipeline's is (the connection's `retry`, dropping the connection in between), so an
    outage is ridden out the same way. A cluster client goes through `queue_evalsha` on its pipeline instead."""
    try:
        packed = b"".join(
            pack_command(("EVALSHA", script.sha, len(keys), *keys, *args)) for script, keys, args in calls
        )
    except TypeError as exc:  # as redis-py reports an argument it cannot send
        raise redis.DataError(str(exc)) from exc
    pool = client.connection_pool
    conn = pool.get_connection()

    def send() -> list[Any]:
        conn.send_packed_command([packed])
        replies: list[Any] = []
        for _ in calls:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:  # that call's error: the next replies are still read
                replies.append(exc)
        return replies

    try:
        return cast(list[Any], conn.retry.call_with_retry(send, lambda error: conn.disconnect()))
    finally:
        pool.release(conn)
