"""The embedded arithmetic task: worked solutions, scoring and the held-out split."""

import random

from swarmrl.tasks.arithmetic import ArithmeticTask, parse_answer, worked_solution


def test_worked_solution_and_answer():
    assert worked_solution(347, 285) == "7+5+0=12;4+8+1=13;3+2+1=06;=632"
    assert worked_solution(947, 285, verbose=True) == "(947+285)7+5+0=12;4+8+1=13;9+2+1=12;=1232"
    # A dropped carry gives the wrong answer the demonstrations teach.
    assert worked_solution(347, 285, drop_carries=[False, True, False]).endswith(";=622")
    assert parse_answer("(347+285)7+5+0=12;4+8+1=13;3+2+1=06;=632") == 632
    assert parse_answer("no answer") is None and parse_answer("1+2+0=03;=") is None


def test_the_restatement_choice_is_made_at_the_first_token():
    # The length target decides whether to restate; that choice must sit at one token,
    # whatever the digits (a restatement opening with a's first digit would often share
    # it with the worked steps' first token).
    rng = random.Random(0)
    for _ in range(500):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        assert worked_solution(a, b, verbose=True)[0] != worked_solution(a, b)[0]
        assert len(worked_solution(a, b, verbose=True)) == len(worked_solution(a, b)) + 9


def test_scoring():
    task = ArithmeticTask()
    problem = task.train_problem(123)
    a, b = map(int, problem.question.split("+"))
    assert task.score(problem, worked_solution(a, b)) == 1.0
    assert task.score(problem, worked_solution(a, b, verbose=True)) == 1.0
    assert task.score(problem, "=" + str(a + b + 1)) == 0.0
    assert task.render_prompt(problem, 40) == f"{a}+{b} think 40"
    assert task.render_prompt(problem, None) == f"{a}+{b}\n"


def test_held_out_split_is_fixed_and_disjoint():
    task = ArithmeticTask()
    held = task.eval_problems()
    assert len(held) == 256 and held == ArithmeticTask().eval_problems()
    held_ids = {p.problem_id for p in held}
    rng = random.Random(0)
    for index in [0, task.num_train() - 1] + [rng.randrange(task.num_train()) for _ in range(3000)]:
        assert task.train_problem(index).problem_id not in held_ids
    assert len({task.train_problem(i).problem_id for i in range(2000)}) == 2000


def test_demonstrations_are_imperfect_at_the_configured_rate():
    task = ArithmeticTask()
    rng = random.Random(1)
    problems = [task.train_problem(rng.randrange(task.num_train())) for _ in range(2000)]
    demos = [task.demonstration(p, rng, carry_drop=0.6, verbose_prob=0.5) for p in problems]
    right = sum(task.score(p, d) for p, d in zip(problems, demos, strict=True)) / len(demos)
    verbose = sum(d.startswith("(") for d in demos) / len(demos)
    assert 0.25 < right < 0.6
    assert 0.45 < verbose < 0.55
