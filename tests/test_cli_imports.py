"""The `swarmrl` command starts fast: building its parser, and the member's everyday
commands (`keygen`, `status`, `pool`), load no model library and none of the libraries
only some subcommands need.

Each case runs in a fresh interpreter, since this test process has loaded everything.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MODEL_LIBRARIES = {"torch", "transformers", "pyarrow"}
# What only the commands that serve, sign or open the ledger need.
SERVICE_LIBRARIES = {"httpx", "coincurve", "sqlalchemy", "aiohttp"}


def loaded_after(code: str) -> set[str]:
    """Top-level modules (of those above) loaded by a fresh interpreter that ran `code`."""
    watched = sorted(MODEL_LIBRARIES | SERVICE_LIBRARIES)
    script = (
        f"{code}\nimport json, sys\nprint(json.dumps(sorted(set({watched!r}) & set(sys.modules))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_building_the_parser_loads_no_model_or_service_library():
    code = "from swarmrl.cli import build_parser\nbuild_parser()"
    assert loaded_after(code) == set()


@pytest.mark.parametrize("command", [["keygen"], ["status"], ["pool"], ["pool", "check"]])
def test_a_subcommands_help_loads_no_model_or_service_library(command):
    code = (
        "import contextlib, io\n"
        "from swarmrl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n"
        f"        main({[*command, '--help']!r})\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, exit.code\n"
        "assert 'usage: swarmrl' in out.getvalue()"
    )
    assert loaded_after(code) == set()


def test_keygen_writes_a_key_without_loading_a_model_library(tmp_path):
    key = tmp_path / "member.key"
    code = f"from swarmrl.cli import main\nassert main(['keygen', '--out', {str(key)!r}]) == 0"
    loaded = loaded_after(code)
    assert key.is_file()
    assert loaded & MODEL_LIBRARIES == set()
    assert "coincurve" in loaded  # the key itself: loaded by the command, not the parser


@pytest.mark.parametrize(
    "command",
    [
        ["pool", "check", "--ledger", "sqlite:///{tmp}/ledger.db"],
        ["pool", "fund", "0x" + "0" * 40, "1", "--orchestrator", "http://127.0.0.1:9"],
    ],
    ids=["check", "fund"],
)
def test_a_pool_command_runs_without_loading_a_model_library(tmp_path, command):
    # Refused at its first step (no ledger file, no key file): the run gets as far as the
    # command's own imports, which is what is measured.
    argv = [part.format(tmp=tmp_path) for part in command]
    if argv[1] == "fund":
        argv += ["--key", str(tmp_path / "owner.key")]
    code = f"from swarmrl.cli import main\nassert main({argv!r}) in (1, 2)"
    assert loaded_after(code) & MODEL_LIBRARIES == set()
