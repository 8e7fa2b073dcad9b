"""Every refusal names its kind: each `Refusal` the orchestrator raises carries a code of
`api.RefusalCode`, written as a literal where it is raised, and the API docs list every
code. Clients branch on the code (`protocol/membership.py`), so a refusal without one, or
a code nobody documented, would be a seam that only its wording holds together."""

from __future__ import annotations

import ast
from pathlib import Path

from swarmrl.protocol import models as api

ROOT = Path(__file__).resolve().parent.parent
ORCHESTRATOR = ROOT / "src" / "swarmrl" / "orchestrator"


def refusals_raised() -> list[tuple[str, int, object]]:
    """(file, line, the code argument) of every `Refusal(...)` in the orchestrator."""
    found = []
    for path in sorted(ORCHESTRATOR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Refusal"
            ):
                code = node.args[1] if len(node.args) > 1 else None
                value = code.value if isinstance(code, ast.Constant) else code
                found.append((path.name, node.lineno, value))
    return found


def test_every_refusal_the_orchestrator_raises_names_a_known_code():
    raised = refusals_raised()
    assert len(raised) > 40  # the pool's rules, the signature checks, the gate and the app
    unknown = [(f, line, code) for f, line, code in raised if code not in api.REFUSAL_CODES]
    assert unknown == []
    # Each code but the replay's (raised by `Replayed`) is raised somewhere.
    assert set(api.REFUSAL_CODES) - {code for _, _, code in raised} == {"replayed"}


def test_the_api_docs_list_every_code():
    docs = (ROOT / "docs" / "orchestrator.md").read_text()
    missing = [code for code in api.REFUSAL_CODES if f"| `{code}` |" not in docs]
    assert missing == []
