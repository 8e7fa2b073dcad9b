"""The swarm simulator behind `benchmarks/simulate_swarm.py`: a discrete-event model of
workers, relays, the trainer and the validator around the real orchestrator `Pool`.

`events` (the clock and the event queue), `network` (links shared by their flows, the
relay tree), `pooldriver` (the real `Pool` over a real SQLite ledger, driven in process
on the simulated clock), `swarm` (the roles' loops), `params` (the scenarios and where
their numbers come from).
"""
