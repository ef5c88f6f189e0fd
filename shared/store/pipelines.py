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


_RIDERS: set[str] = set()  # the SHA1s of scripts marked by `rider`


def rider(script: Script) -> Script:
    """Mark `script` as a rider: it applies only if a write ahead of it in its round trip took (a version-checked
    listing) and running it twice does no harm. When a write ahead of it missed the server's script cache (a
    restart) and runs again alone, the rider ran too early, found nothing and did nothing: it runs again after it."""
    _RIDERS.add(script.sha)
    return script


def runs_again(script: Script, reply: Any, missed_ahead: bool) -> bool:
    """Whether a call of a round trip runs again alone, in order: it missed the script cache itself, or it is a
    rider behind one that did."""
    return isinstance(reply, redis.exceptions.NoScriptError) or (missed_ahead and script.sha in _RIDERS)


def run_scripts(
    pipe: redis.client.Pipeline | ClusterPipeline, writes: list[tuple[Script, list[str], list[Any]]]
) -> list[Any]:
    """Send script calls in one round trip (in a MULTI when `pipe` is transactional) and return their replies.
    A call the server's script cache missed (it was flushed) did not run: it runs again alone, in order, so
    each call still runs exactly once and after the ones before it (and so do the riders behind it)."""
    for script, keys, args in writes:
        queue_evalsha(pipe, script, keys, args)
    replies = pipe.execute(raise_on_error=False)
    missed = False
    for index, reply in enumerate(replies):
        script, keys, args = writes[index]
        if runs_again(script, reply, missed):
            missed = True
            replies[index] = script(keys=keys, args=args)
        elif isinstance(reply, Exception):
            raise reply
    return list(replies)


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
