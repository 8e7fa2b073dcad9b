"""`python -m swarmrl.orchestrator ...`: the same as `swarmrl orchestrator ...`, without
loading the other roles' modules (it starts in a fraction of the time)."""

import argparse
import logging
import sys

from swarmrl.orchestrator.cli import register

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
parser = argparse.ArgumentParser(prog="python -m swarmrl.orchestrator")
register(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(["orchestrator", *sys.argv[1:]])
sys.exit(args.func(args))
