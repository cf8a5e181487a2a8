"""A loopback TCP proxy whose connections a test can cut, to drop a gRPC stream mid-way."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """Forwards every connection made to `address` (127.0.0.1, a free port) to `target`.

    `drop()` cuts every open connection and keeps listening, as a network blip does: the client
    sees its stream fail and can connect again. `accepted` counts the connections made.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
                upstream = socket.create_connection(self._target)
            except OSError:
                return  # closed
            with self._lock:
                self._open += [downstream, upstream]
                self.accepted += 1
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                _cut(s)

    def drop(self) -> None:
        """Cuts every connection open now."""
        with self._lock:
            cut, self._open = self._open, []
        for s in cut:
            _cut(s)

    def close(self) -> None:
        self._listener.close()
        self.drop()


def _cut(s: socket.socket) -> None:
    # shutdown wakes a thread blocked in recv on it; close alone would not.
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
