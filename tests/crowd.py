"""Strangers holding connections to a node's ports without saying anything:
the places a listener keeps for connections in their handshake, taken."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class Crowd:
    """Silent connections to ``ports`` on 127.0.0.1, ``per_source`` from each
    of ``sources`` addresses (127.0.0.2 on), each dialled again as soon as
    the node closes it (at its handshake deadline, or at once when it has
    no place for it)."""

    def __init__(self, ports: list[int], sources: int, per_source: int) -> None:
        self.places = [(f"127.0.0.{2 + s}", port) for port in ports for s in range(sources)]
        self.places *= per_source
        self.connections: list[socket.socket | None] = [None] * len(self.places)
        self.dialled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def __enter__(self) -> Crowd:
        """Once every place has been dialled once."""
        self._thread.start()
        deadline = time.monotonic() + 30
        while self.dialled < len(self.places):
            if time.monotonic() > deadline:
                self.__exit__()
                raise AssertionError("the crowd did not gather within 30 s")
            time.sleep(0.05)
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for connection in self.connections:
            if connection is not None:
                connection.close()

    def _hold(self) -> None:
        while not self._stop.is_set():
            for i, (source, port) in enumerate(self.places):
                connection = self.connections[i]
                if connection is not None and not _closed(connection):
                    continue
                if connection is not None:
                    connection.close()
                fresh = socket.socket()
                fresh.setblocking(False)
                fresh.bind((source, 0))
                with contextlib.suppress(BlockingIOError):
                    fresh.connect(("127.0.0.1", port))
                self.connections[i] = fresh
                self.dialled += 1
            self._stop.wait(0.01)  # the attacker's pace


def _closed(connection: socket.socket) -> bool:
    try:
        return connection.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
