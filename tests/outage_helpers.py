"""Real outages for tests: a private redis-server that can be restarted or paused, and a TCP proxy in front
of the shared RabbitMQ whose "restart" drops every connection through it (the shared broker stays up for
everyone else, and its queues keep their messages, as a restarted durable broker would)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import redis

from tests.conftest import free_port


def _wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class RedisServer:
    """`redis-server --port P --save '' --appendonly no` on a free port, in its own directory.

    `restart()` stops it with `SHUTDOWN SAVE` (every client's connection drops, the server exits, its
    data survives in a snapshot the way a managed Redis or a failover keeps it) and starts it again on
    the same port. Without the snapshot a restart would erase every turn, which no durability can survive.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="stepq-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=30)

    def start(self) -> None:
        cmd = ["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no", "--dir", self.dir]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(self._answers, 30, f"redis-server on port {self.port}")

    def _answers(self) -> bool:
        try:
            with self.client() as c:
                return bool(c.ping())
        except redis.ConnectionError:
            return False

    def stop(self, save: bool = True) -> None:
        if self.proc is None:
            return
        if save:
            with contextlib.suppress(redis.ConnectionError), self.client() as c:
                c.shutdown(save=True)
        else:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc = None

    def restart(self) -> None:
        self.stop(save=True)
        self.start()

    def pause(self, ms: int) -> None:
        """`CLIENT PAUSE ms ALL`: every client's commands (writes and reads) wait that long."""
        with self.client() as c:
            c.execute_command("CLIENT", "PAUSE", ms, "ALL")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; `restart()` drops every connection and refuses new ones
    until it listens again (what clients see when their broker restarts)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.listen()

    def listen(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by drop()
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def drop(self) -> None:
        """Stop listening and cut every connection."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it, freeing the port
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restart(self) -> None:
        self.drop()
        self.listen()

    def close(self) -> None:
        self.drop()


class SentinelSetup:
    """A master, one replica and one Sentinel watching them as `name`, each on a free port; `failover()`
    promotes the replica the way a managed Redis fails over (clients must follow the Sentinel)."""

    def __init__(self, name: str = "stepq-test") -> None:
        self.name = name
        self.master = RedisServer()
        self.replica_port = free_port()
        self.sentinel_port = free_port()
        self.dir = tempfile.mkdtemp(prefix="stepq-sentinel-")
        replica = ["redis-server", "--port", str(self.replica_port), "--save", "", "--appendonly", "no"]
        replica += ["--dir", self.dir, "--replicaof", "127.0.0.1", str(self.master.port)]
        self.replica = subprocess.Popen(replica, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        conf = f"{self.dir}/sentinel.conf"
        with open(conf, "w") as f:
            f.write(
                f"port {self.sentinel_port}\ndir {self.dir}\n"
                f"sentinel monitor {name} 127.0.0.1 {self.master.port} 1\n"
                f"sentinel down-after-milliseconds {name} 2000\nsentinel failover-timeout {name} 10000\n"
            )
        self.sentinel = subprocess.Popen(
            ["redis-server", conf, "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_for(self._ready, 60, "the replica to sync and the Sentinel to see it")

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.name}"

    def _sentinel(self) -> redis.Redis:
        return redis.Redis(port=self.sentinel_port, socket_timeout=10, decode_responses=True)

    def master_port(self) -> int:
        with self._sentinel() as s:
            host_port = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
            return int(host_port[1])

    def _ready(self) -> bool:
        try:
            with redis.Redis(port=self.replica_port, socket_timeout=10, decode_responses=True) as r:
                if r.info("replication").get("master_link_status") != "up":
                    return False
            with self._sentinel() as s:
                return bool(s.execute_command("SENTINEL", "REPLICAS", self.name))
        except redis.ConnectionError:
            return False

    def failover(self) -> None:
        old = self.master_port()
        with self._sentinel() as s:
            s.execute_command("SENTINEL", "FAILOVER", self.name)
        _wait_for(lambda: self.master_port() != old, 60, "the Sentinel to promote the replica")

    def close(self) -> None:
        for proc in (self.sentinel, self.replica):
            proc.kill()
            proc.wait(timeout=30)
        self.master.close()
        shutil.rmtree(self.dir, ignore_errors=True)
