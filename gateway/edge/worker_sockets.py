"""`gateway serve --workers N`: a listening socket of its own for each worker (Linux's SO_REUSEPORT).

uvicorn's workers share one listening socket, and the worker whose event loop wakes first accepts every
connection queued by then. Agents' clients keep their connections open, so clients that connect at
about the same moment (a fleet of agents started together, a load test) stay on that one worker while
the other idles: 20 keep-alive clients opened at once all landed on one of two workers, which then did
every request's work (bench/proxy_compare.py `--workers 2` served 1.04x one worker's requests/s).

Here each worker listens on a socket of its own, bound to the same address with SO_REUSEPORT, and the
kernel gives each new connection to one of them by a hash of the connection's addresses, whichever is
awake (as nginx's `reuseport` and gunicorn's `--reuse-port`). Measured, alternating runs of
`bench/proxy_compare.py --no-burst --workers N --transcripts synthetic-100 --targets
gateway-coding-agent-sqlite` (bench/results/proxy_compare_socket_per_worker_run*.json): one worker
107.7 and 140.6 requests/s at 20 clients, two 176.7 and 172.5. The supervisor keeps no copy of any
worker's socket: a worker that dies takes its socket, and the connections queued on it, with it, and
new connections go to the others until its replacement listens on a new one.

Elsewhere (SO_REUSEPORT does not spread connections on macOS or BSD) the workers share one socket,
as uvicorn does.

A worker whose supervisor dies (SIGKILL, the OOM killer) is sent SIGTERM by the kernel (Linux's
PR_SET_PDEATHSIG) and shuts down as on any SIGTERM, its requests in flight finished and recorded: left
running, orphans would keep the port, and a gateway started again would find it in use.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

log = logging.getLogger("uvicorn.error")
# How long SIGHUP waits for a replacement worker to serve before it keeps the old one. uvicorn waits its
# health check's 5 s, less than a worker takes to import LiteLLM and open its stores (one of two
# replacements started on 2 busy CPUs took more than that, and every SIGHUP kept the old workers).
READY_SECONDS = 180.0


def spreads_connections() -> bool:
    """Whether this kernel spreads connections over sockets bound with SO_REUSEPORT (Linux does)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def check_address_free(host: str, port: int) -> None:
    """OSError when anything is bound to (host, port), with SO_REUSEPORT or not: a second gateway started
    on a port that one already serves fails, as with one socket, instead of taking half its connections."""
    listening_socket(host, port, reuse_port=False).close()


def listening_socket(host: str, port: int, reuse_port: bool = True) -> socket.socket:
    """A TCP socket bound to (host, port), with SO_REUSEPORT, not yet listening (the worker listens)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


_PR_SET_PDEATHSIG = 1  # prctl's option (linux/prctl.h)


def die_with(supervisor: int) -> None:
    """SIGTERM for this process when the thread that started it ends (its supervisor's main thread),
    where the kernel offers it (Linux); and at once if `supervisor` is gone already."""
    if not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    if prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return
    if os.getppid() != supervisor:  # it died before the request was made: no signal would come
        os.kill(os.getpid(), signal.SIGTERM)


class Worker(Process):
    """uvicorn's worker process, which ends when its supervisor does."""

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        self.supervisor = os.getpid()
        super().__init__(config, sockets)

    def target(self, sockets: list[socket.socket] | None = None) -> None:  # pragma: no cover (in the child)
        die_with(self.supervisor)
        super().target(sockets)


class SocketPerWorker(Multiprocess):
    """uvicorn's worker supervisor (signals, health checks, restarts), each worker on its own socket.

    The supervisor's methods that start a worker are uvicorn's, with the worker started by `spawn`."""

    def __init__(self, config: Config) -> None:
        super().__init__(config, sockets=[])
        self.failed = False  # a worker's socket could not be bound at the start: `gateway serve` exits 1

    def spawn(self) -> Process:
        """A started worker that listens on a new socket; this process keeps no copy of it."""
        sock = listening_socket(self.config.host, self.config.port)
        try:
            process = Worker(self.config, [sock])
            process.start()  # the worker is handed the descriptor as it starts
        finally:
            sock.close()  # a copy kept here would hold a queue of connections that nobody accepts
        return process

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    def _spawn_or_log(self, failing: str) -> Process | None:
        """`spawn`, or None with `failing` logged beside the address and the error."""
        try:
            return self.spawn()
        except OSError as error:
            log.error("%s: %s: %s", failing, self.address, error)
            return None

    def init_processes(self) -> None:
        """The workers; none if the address is in use (checked with a plain bind first: SO_REUSEPORT would
        let a second gateway join one that serves it) or a worker's socket cannot be bound, and then
        `failed`, the workers started stopped by `run`."""
        try:
            check_address_free(self.config.host, self.config.port)
        except OSError as error:
            log.error("gateway: cannot start: %s: %s", self.address, error)
            self.failed = True
            self.should_exit.set()
            return
        log.info("Gateway workers listening on http://%s, a socket each (SO_REUSEPORT)", self.address)
        for _ in range(self.processes_num):
            process = self._spawn_or_log("gateway: cannot start")  # taken since the check
            if process is None:
                self.failed = True
                self.should_exit.set()
                return
            self.processes.append(process)

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        for index, process in enumerate(self.processes):
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung: killed; dead: reaped
            process.join()
            if process.exitcode == STARTUP_FAILURE:  # it would fail the same way on every restart
                log.error("Child process [%s] failed to start, stopping the parent process.", process.pid)
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            log.info("Child process [%s] died", process.pid)
            # None: the dead worker stays in its place, and the next check tries again
            self.processes[index] = self._spawn_or_log(f"could not replace worker [{process.pid}]") or process

    def restart_all(self) -> None:
        """Each worker replaced, its replacement serving before it is retired (SIGHUP)."""
        for index, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self._spawn_or_log(f"could not replace worker [{old.pid}], the restart is aborted")
            if new is None:
                return
            if not new.wait_until_ready(READY_SECONDS, self.should_exit):
                new.kill()
                new.join()
                if not self.should_exit.is_set():
                    log.error("New child process [%s] was not ready in time; keeping worker [%s] and aborting "
                              "the restart.", new.pid, old.pid)
                return
            old.terminate()
            old.join()
            self.processes[index] = new

    def handle_ttin(self) -> None:
        log.info("Received SIGTTIN, increasing the number of processes.")
        process = self._spawn_or_log("could not add a worker")
        if process is not None:
            self.processes.append(process)
            self.processes_num += 1
