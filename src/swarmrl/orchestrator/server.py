"""Run the orchestrator under uvicorn: in the foreground (the CLI) or in a thread (tests,
benchmarks, `swarmrl run`)."""

from __future__ import annotations

import gc
import sys
import threading
import time

import uvicorn

from swarmrl.orchestrator.app import create_app
from swarmrl.orchestrator.config import OrchestratorConfig

KEEP_ALIVE_SECONDS = 30
# Python hands the GIL to a waiting thread every 5 ms by default: a heartbeat (well under a
# millisecond of work) then queues behind each upload being parsed and each assignment being
# issued, slice by slice. A shorter interval costs a little throughput and cuts that tail
# (benchmarks/bench_orchestrator.py; docs/benchmarks.md).
GIL_SWITCH_SECONDS = 0.0005


def _server(config: OrchestratorConfig, host: str, port: int) -> uvicorn.Server:
    app = create_app(config)
    return uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            # Members call every few seconds (heartbeats every 10 s by default): keep their
            # connections open across calls instead of a new TCP handshake each time.
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
        )
    )


def _bound_url(server: uvicorn.Server, host: str) -> str:
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://{host}:{port}"


class OrchestratorThread:
    """An orchestrator serving from a background thread; `url` once started (port 0 = any free one)."""

    def __init__(self, config: OrchestratorConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.server = _server(config, host, port)
        self.thread = threading.Thread(target=self.server.run, name="orchestrator", daemon=True)
        self.url = ""

    def start(self, timeout: float = 30.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the orchestrator did not start (see the log above)")
            time.sleep(0.02)
        self.url = _bound_url(self.server, self.host)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> OrchestratorThread:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(config: OrchestratorConfig, host: str, port: int) -> None:
    """Serve in the foreground until interrupted; prints the URL once listening."""
    sys.setswitchinterval(GIL_SWITCH_SECONDS)  # the whole process is the orchestrator
    server = _server(config, host, port)
    # Everything built so far (modules, the app, the ledger's schema) lives as long as the
    # process: kept out of the collector's full passes, each of which stopped every request
    # for 50-130 ms under load.
    gc.freeze()

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            print(f"orchestrator listening on {_bound_url(server, host)}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    server.run()
