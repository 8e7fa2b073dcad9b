"""Rollout Parquet files: round trip, atomic writes, and clear errors for bad files."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swarmrl.rollouts import (
    SCHEMA,
    RolloutFileError,
    RolloutMeta,
    file_hash,
    read_meta,
    read_rollouts,
    write_rollouts,
)


def _columns(n=4):
    return {
        "problem_id": [f"p{i // 2}" for i in range(n)],
        "input_tokens": [[1, 2, 3]] * n,
        "output_tokens": [[4, 5, 2]] * n,
        "output_logprobs": [[-0.5, -0.25, -0.125]] * n,
        "rewards": [1.0, 0.0, 0.5, 0.5],
        "task_rewards": [1.0, 0.0, 1.0, 1.0],
        "length_penalties": [0.0, 0.0, 0.5, 0.5],
        "advantages": [1.0, -1.0, 0.0, 0.0],
        "target_lengths": [3, 3, -1, -1],
        "policy_step": [7] * n,
        "seed": [2**40 + i for i in range(n)],
        "proofs": [bytes(i % 256 for i in range(258))] * n,
    }


def _meta(n=4):
    return RolloutMeta(
        run_id="r", worker_address="w0", step=8, submission=0, num_samples=n, num_nonzero=2
    )


def test_round_trip_preserves_every_value(tmp_path):
    cols = _columns()
    path = write_rollouts(tmp_path / "step_000008" / "w0-00000.parquet", cols, _meta())
    table, meta = read_rollouts(path)
    assert meta == _meta()
    assert read_meta(path) == _meta()
    assert table.schema.equals(SCHEMA, check_metadata=False)
    assert table.to_pydict() == cols
    assert len(file_hash(path)) == 64
    # No temporary file is left behind.
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_truncated_file_is_rejected_with_its_name(tmp_path):
    path = write_rollouts(tmp_path / "a.parquet", _columns(), _meta())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(RolloutFileError) as err:
        read_rollouts(path)
    assert "a.parquet" in str(err.value) and "not a readable Parquet file" in str(err.value)


def test_wrong_schema_is_rejected(tmp_path):
    cols = _columns()
    table = pa.Table.from_pydict({k: v for k, v in cols.items() if k != "advantages"})
    path = write_rollouts(tmp_path / "good.parquet", cols, _meta())
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.replace_schema_metadata(pq.read_schema(path).metadata), bad)
    with pytest.raises(RolloutFileError, match=r"bad.parquet: missing columns \['advantages'\]"):
        read_rollouts(bad)

    schema = pa.schema(
        [f if f.name != "rewards" else pa.field("rewards", pa.string()) for f in SCHEMA]
    )
    wrong_type = pa.Table.from_pydict(
        {**cols, "rewards": [str(r) for r in cols["rewards"]]}, schema=schema
    )
    pq.write_table(wrong_type.replace_schema_metadata(pq.read_schema(path).metadata), bad)
    with pytest.raises(RolloutFileError, match="column 'rewards' has type string"):
        read_rollouts(bad)


def test_missing_metadata_and_inconsistent_lengths(tmp_path):
    bare = tmp_path / "bare.parquet"
    pq.write_table(pa.Table.from_pydict(_columns(), schema=SCHEMA), bare)
    with pytest.raises(RolloutFileError, match="no swarmrl metadata"):
        read_rollouts(bare)
    cols = _columns()
    cols["output_logprobs"] = [[-0.5]] * 4
    path = write_rollouts(tmp_path / "len.parquet", cols, _meta())
    with pytest.raises(RolloutFileError, match="differ in length"):
        read_rollouts(path)
    path = write_rollouts(tmp_path / "rows.parquet", _columns(), _meta(n=5))
    with pytest.raises(RolloutFileError, match="4 rows but metadata says 5"):
        read_rollouts(path)
