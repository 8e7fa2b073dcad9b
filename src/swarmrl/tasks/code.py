"""The code task: the user's programming problems, scored by running a completion's
Python solution against the problem's tests in a sandboxed subprocess.

Scoring:
- The solution is the last ```python (or ```py, ```python3) fenced block of the
  completion, or the whole completion if it has none.
- A fresh `python -I` process executes the solution, then the tests (e.g. `assert`
  statements), in one namespace. `__name__` is "solution", so an
  `if __name__ == "__main__":` block (which would read the closed stdin) does not run.
- Reward 1.0 only if the process exits 0 *and*, after the last test, writes a random
  per-run token to a private pipe. So a solution that calls `sys.exit(0)` or
  `os._exit(0)` before the tests run, or prints something that looks like success,
  scores 0.0. The token, the solution and the tests reach the process in a job file that
  it deletes before any solution code runs, so the tests are not on disk to be read.

The sandbox, per run:
- a new temporary directory as working directory, removed afterwards;
- environment: only `PATH=/usr/bin:/bin`; stdin is /dev/null; stdout and stderr are
  captured together, keeping the last `MAX_OUTPUT_BYTES` (for diagnostics only);
- resource limits, set before any solution code runs, soft and hard alike so they cannot
  be raised: address space `memory_limit_mb`; CPU time ceil(`time_limit_s`) + 1 seconds
  (a backstop: the wall-clock kill below normally comes first; the kernel's SIGKILL at
  this limit also counts as a time-out);
  each written file at most `MAX_FILE_BYTES`; 64 open files; no core dumps; no new
  processes or threads (RLIMIT_NPROC = 0);
- a new session (process group); after `time_limit_s` seconds of wall-clock time the
  whole group is killed, and after every run it is killed regardless, so nothing
  outlives `score`. The process also asks the kernel to kill it if the thread that
  started it dies (Linux PR_SET_PDEATHSIG).
- Root: the kernel ignores RLIMIT_NPROC for uid 0, and root may raise its own limits.
  So when swarmrl runs as root, solutions run as user `nobody`, provided `nobody` can
  run `python_executable` (probed once per interpreter). A Python installed under
  /root usually cannot; then solutions run as root and a warning is logged: time,
  memory and file-size limits still hold, but a fork bomb is stopped only by the
  group kill at the deadline, which a process that calls setsid() escapes.

Not covered: network access (run workers in a container or network namespace for
that); the number of files written (each is capped, their count is not); a solution that
deliberately inspects the harness (its stack frames or memory) to forge the token, or
returns objects whose `__eq__` is always true. Those are reward hacks to watch for in
training logs, not something process limits can rule out.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import pwd
import re
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from swarmrl.tasks.base import Problem
from swarmrl.tasks.loading import Field, FileTask, load_problems

logger = logging.getLogger(__name__)

INSTRUCTION = (
    "Write your solution in Python in a single ```python code block. "
    "It will be run, then tested; it must not read input."
)
MAX_OUTPUT_BYTES = 64 * 1024
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_OPEN_FILES = 64

FIELDS = {
    "question": Field(names=("question", "prompt", "problem"), types=(str,)),
    "tests": Field(names=("tests",), types=(str, list)),
    "id": Field(names=("id",), types=(str, int), required=False),
}

_ENV = {"PATH": "/usr/bin:/bin"}
_FENCED_PYTHON = re.compile(r"```(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)

# Runs inside the sandbox: `python -I -c _RUNNER <job file>`. Everything up to the first
# `exec` is ours; the token is written only if both `exec`s return.
_RUNNER = r"""
import json, os, resource, sys


def run():
    job_path = sys.argv[1]
    with open(job_path) as file:
        job = json.load(file)
    os.remove(job_path)
    if sys.platform == "linux":
        import ctypes
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG = 1, SIGKILL = 9
        if os.getppid() != job["parent_pid"]:  # the parent died before prctl took effect
            os._exit(3)
    for name, limit in job["limits"].items():
        resource.setrlimit(getattr(resource, name), (limit, limit))
    status_fd, token = job["status_fd"], job["token"].encode()
    solution = compile(job["solution"], "solution.py", "exec")
    tests = compile(job["tests"], "tests.py", "exec")
    del job
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    exec(solution, namespace)
    exec(tests, namespace)
    os.write(status_fd, token)


run()
"""


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did."""

    passed: bool  # exited 0 after the last test ran
    exit_code: int  # negative: killed by that signal (e.g. -9 at the deadline)
    timed_out: bool  # still running at the wall-clock limit, or killed at the CPU-time limit
    output: str  # the tail of stdout and stderr together


class CodeTask(FileTask):
    """Programming problems from a JSONL or Parquet file, verified by running tests.

    Rows: `question` (or `prompt`, or `problem`): the problem text; `tests`: Python code
    run after the solution, failing by raising (e.g. `assert add(2, 3) == 5`), or a list
    of such lines; `id` (optional): a unique problem id, default `<file stem>-<row index>`.
    """

    name = "code"
    instruction = INSTRUCTION

    def __init__(
        self,
        path: str | Path,
        eval_path: str | Path | None = None,
        eval_size: int | None = None,
        time_limit_s: float = 10.0,
        memory_limit_mb: int = 512,
        python_executable: str = sys.executable,
    ) -> None:
        """
        path: the training problems (`.jsonl` or `.parquet`).
        eval_path: a separate file of held-out problems; all of it is the eval split.
        eval_size: without `eval_path`, hold out the last `eval_size` problems of
            `path` (None: a tenth, at least one). Must be None when `eval_path` is set.
        time_limit_s: wall-clock limit of one run (solution and tests together).
        memory_limit_mb: address-space limit of the sandboxed process.
        python_executable: the interpreter that runs solutions (its installed packages
            are importable by them).
        """
        if time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be positive, got {time_limit_s}")
        if memory_limit_mb < 64:
            raise ValueError(
                f"memory_limit_mb must be at least 64 (Python itself needs that much), got {memory_limit_mb}"
            )
        self.time_limit_s = time_limit_s
        self.memory_limit_mb = memory_limit_mb
        self.python_executable = python_executable
        self._split = load_problems(
            path,
            eval_path=eval_path,
            eval_size=eval_size,
            fields=FIELDS,
            make_problem=_make_problem,
        )

    def score(self, problem: Problem, completion: str) -> float:
        result = run_solution(
            extract_solution(completion),
            problem.answer,
            time_limit_s=self.time_limit_s,
            memory_limit_mb=self.memory_limit_mb,
            python_executable=self.python_executable,
        )
        return 1.0 if result.passed else 0.0


def extract_solution(completion: str) -> str:
    """The last ```python fenced block of a completion, or the whole completion."""
    blocks = _FENCED_PYTHON.findall(completion)
    return blocks[-1] if blocks else completion


def run_solution(
    solution: str,
    tests: str,
    *,
    time_limit_s: float,
    memory_limit_mb: int,
    python_executable: str = sys.executable,
) -> SandboxResult:
    """Run `solution` then `tests` in the sandbox described in the module docstring."""
    token = secrets.token_hex(16)
    user = _sandbox_user(python_executable)
    limits = {
        "RLIMIT_AS": memory_limit_mb * 1024 * 1024,
        "RLIMIT_CPU": math.ceil(time_limit_s) + 1,
        "RLIMIT_FSIZE": MAX_FILE_BYTES,
        "RLIMIT_NOFILE": MAX_OPEN_FILES,
        "RLIMIT_CORE": 0,
        "RLIMIT_NPROC": 0,
    }
    # Solution code could delete or lock its files; leftovers must not fail scoring.
    with tempfile.TemporaryDirectory(prefix="swarmrl-code-", ignore_cleanup_errors=True) as workdir:
        status_read, status_write = os.pipe()
        job_path = os.path.join(workdir, "job.json")
        with open(job_path, "w", encoding="utf-8") as job_file:
            json.dump(
                {
                    "solution": solution,
                    "tests": tests,
                    "token": token,
                    "status_fd": status_write,
                    "parent_pid": os.getpid(),
                    "limits": limits,
                },
                job_file,
            )
        if user is not None:
            os.chown(workdir, *user)
            os.chown(job_path, *user)
        try:
            process = subprocess.Popen(
                [python_executable, "-I", "-c", _RUNNER, job_path],
                cwd=workdir,
                env=_ENV,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(status_write,),
                start_new_session=True,
                user=None if user is None else user[0],
                group=None if user is None else user[1],
                extra_groups=None if user is None else [],
            )
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        deadline = time.monotonic() + time_limit_s
        try:
            output, status = _collect(process, status_read, deadline)
            exited = _exited_by(process.pid, deadline)
        finally:
            os.close(status_read)
            # The process is not reaped yet, so its group id cannot have been reused.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            assert process.stdout is not None
            process.stdout.close()
    # A SIGKILL we did not send comes from the kernel at the CPU-time limit (the address
    # space limit makes allocations fail instead), so it is a time-out too.
    cpu_killed = exited and process.returncode == -signal.SIGKILL
    return SandboxResult(
        passed=exited and process.returncode == 0 and status == token.encode(),
        exit_code=process.returncode,
        timed_out=not exited or cpu_killed,
        output=output.decode("utf-8", errors="replace"),
    )


def _collect(
    process: subprocess.Popen[bytes], status_fd: int, deadline: float
) -> tuple[bytes, bytes]:
    """Read the output pipe (keeping its tail) and the status pipe until both close or
    the deadline passes."""
    assert process.stdout is not None
    output_fd = process.stdout.fileno()
    output, status = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(output_fd, selectors.EVENT_READ)
        selector.register(status_fd, selectors.EVENT_READ)
        while selector.get_map() and (remaining := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                elif key.fd == output_fd:
                    output += chunk
                    del output[:-MAX_OUTPUT_BYTES]
                elif len(status) < 1024:
                    status += chunk
    return bytes(output), bytes(status)


def _exited_by(pid: int, deadline: float) -> bool:
    """Whether the child exits by the deadline, leaving it unreaped (a zombie keeps its
    pid and group id reserved until `wait`)."""
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


@functools.cache
def _sandbox_user(python_executable: str) -> tuple[int, int] | None:
    """(uid, gid) to run solutions as: `nobody` when we are root and it can run the
    interpreter, else None (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid = gid = 65534
    try:
        probe = subprocess.run(
            [python_executable, "-I", "-c", "import collections, decimal, fractions, json, re"],
            check=False,
            user=uid,
            group=gid,
            extra_groups=[],
            cwd="/",
            env=_ENV,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        problem = (
            None if probe.returncode == 0 else probe.stderr.decode(errors="replace").strip()[-300:]
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        problem = str(error)
    if problem is None:
        return uid, gid
    logger.warning(
        "running as root, and user 'nobody' (uid %d) cannot run %s (%s). Sandboxed "
        "solutions will run as root, where the kernel does not enforce the no-new-"
        "processes limit. Run swarmrl as a non-root user, or use a Python that every "
        "user can read (e.g. not under /root).",
        uid,
        python_executable,
        problem,
    )
    return None


def _make_problem(row: dict[str, object], default_id: str) -> Problem:
    problem_id = default_id if row["id"] is None else str(row["id"])
    tests = row["tests"]
    test_code = "\n".join(tests) if isinstance(tests, list) else str(tests)
    return Problem(problem_id=problem_id, question=str(row["question"]).strip(), answer=test_code)
