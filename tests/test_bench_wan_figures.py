"""benchmarks/wan_figures.py: the WAN bench's log parsing and summaries, on hand-built
log lines and metrics with hand-computed figures (the bench itself needs root and
network namespaces and is not part of the suite)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "wan_figures.py"
_spec = importlib.util.spec_from_file_location("wan_figures", _PATH)
assert _spec is not None and _spec.loader is not None
wf = importlib.util.module_from_spec(_spec)
sys.modules["wan_figures"] = wf
_spec.loader.exec_module(wf)

T0 = "2026-12-03 17:00:00,000"
WORKER_LOG = "\n".join(
    [
        "2026-12-03 17:00:01,000 swarmrl.inference.worker INFO fetched policy 0 by full: "
        "4270080 bytes in 0.50 s",
        "2026-12-03 17:00:01,100 swarmrl.inference.worker INFO loaded policy step 0, generating with 0",
        "2026-12-03 17:00:03,000 swarmrl.inference.worker WARNING heartbeat failed (x)",
        "2026-12-03 17:00:04,000 swarmrl.inference.worker INFO fetched policy 2 by delta: "
        "2600000 bytes in 1.25 s",
        "2026-12-03 17:00:04,250 swarmrl.inference.worker INFO loaded policy step 2, generating with 2",
        "2026-12-03 17:00:09,000 swarmrl.inference.worker INFO fetched policy 3 by delta: "
        "2600000 bytes in 1.00 s",
        "2026-12-03 17:00:09,500 swarmrl.inference.worker INFO loaded policy step 3, generating with 3",
    ]
)
RELAY_LOG = (
    "2026-12-03 17:00:02,000 swarmrl.shardcast.relay INFO relay now holds v2 (3 shards)\n"
    "2026-12-03 17:00:07,500 swarmrl.shardcast.relay INFO relay now holds v3 (3 shards)\n"
)


def at(seconds: float) -> float:
    return wf.stamp_time(T0) + seconds


def test_parses_fetches_loads_and_relay_mirrors():
    log = wf.parse_worker_log(WORKER_LOG)
    assert sorted(log.loaded) == [0, 2, 3]
    assert abs(log.loaded[2] - at(4.25)) < 1e-6
    assert log.fetches[2] == wf.Fetch(2, at(4.0), "delta", 2_600_000, 1.25)
    held = wf.parse_relay_log(RELAY_LOG)
    assert abs(held[3] - at(7.5)) < 1e-6


def step(n: int, wait: float, total: float) -> dict:
    return {"step": n, "wait_seconds": wait, "step_seconds": total}


def test_run_figures_leave_out_the_first_step_and_checkpoint():
    steps = [step(0, 30.0, 31.0), step(1, 1.0, 4.0), step(2, 2.0, 4.0)]
    announced = {1: at(0.5), 2: at(1.5), 3: at(7.0)}
    log = wf.parse_worker_log(WORKER_LOG)
    fig = wf.run_figures(
        steps, announced, [log], wf.parse_relay_log(RELAY_LOG), {"origin": 10, "relay": 20}
    )
    assert fig["trainer_idle"] == 3.0 / 8.0  # step 0's 30 s wait is startup
    assert fig["seconds_per_step"] == 4.0
    w = fig["workers"][0]
    # checkpoints 2 and 3: loaded 2.75 s and 2.5 s after their announcements
    assert w["loaded"] == 2
    assert abs(w["announce_to_loaded_s"][0] - 2.625) < 1e-3
    assert abs(w["announce_to_loaded_s"][1] - 2.75) < 1e-3
    # fetch of 2 started at 4.0 - 1.25 = 2.75 s, 1.25 s after its announcement; of 3 at 8.0
    assert abs(w["announce_to_fetch_start_s"][1] - 1.25) < 1e-3
    assert abs(fig["relay_mirror_s"][0] - 0.5) < 1e-3  # 0.5 s and 0.5 s
    assert w["routes"] == {"full": 1, "delta": 2}
    assert fig["origin_bytes"] == 10


def test_summary_median_and_spread_and_table():
    def run(idle: float, worst: float) -> dict:
        return {
            "trainer_idle": idle,
            "seconds_per_step": 2.0,
            "relay_mirror_s": (0.1, 0.2),
            "origin_bytes": 4_000_000,
            "relay_bytes": None,
            "workers": [
                dict.fromkeys(wf.WORKER_TIMES, (1.0, worst)) | {"loaded": 3},
                dict.fromkeys(wf.WORKER_TIMES, (3.0, 1.0)) | {"loaded": 3},
            ],
        }

    s = wf.config_summary([run(0.5, 4.0), run(0.7, 6.0), run(0.6, 5.0)])
    assert s["trainer_idle"] == {"median": 0.6, "min": 0.5, "max": 0.7, "runs": 3}
    assert s["loaded_median_s"]["median"] == 2.0  # each run: median of 1.0 and 3.0
    assert s["loaded_worst_s"] == {"median": 5.0, "min": 4.0, "max": 6.0, "runs": 3}
    assert s["relay_mb"]["runs"] == 0
    text = wf.table({"20-delta": s})
    assert "| trainer idle | 0.60 [0.50–0.70] |" in text
    assert "| relay MB served | – |" in text


@settings(max_examples=30, deadline=None)
@given(cut=st.integers(0, len(WORKER_LOG)), junk=st.text(max_size=40), at_=st.integers(0, 200))
def test_damaged_logs_never_raise(cut, junk, at_):
    text = WORKER_LOG[:cut] + junk + WORKER_LOG[cut:]
    text = text[:at_] + junk + text[at_:]
    log = wf.parse_worker_log(text)
    assert all(isinstance(t, float) for t in log.loaded.values())
    assert all(f.seconds >= 0 and f.nbytes >= 0 for f in log.fetches.values())
    # an insertion damages at most two lines, so most of the five records survive
    assert len(log.loaded) + len(log.fetches) >= 2
    assert all(isinstance(t, float) for t in wf.parse_relay_log(text).values())
