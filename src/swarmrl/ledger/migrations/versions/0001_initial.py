"""The first ledger: members, heartbeats, nonces, checkpoints, steps, assignments,
submissions, verdicts and contributions.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "members",
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("url", sa.String(512), nullable=True),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.Column("lapses", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "role IN ('worker', 'trainer', 'validator', 'relay')", name="ck_members_role"
        ),
        sa.CheckConstraint("status IN ('healthy', 'unhealthy', 'dead')", name="ck_members_status"),
    )
    op.create_table(
        "heartbeats",
        sa.Column("address", sa.String(42), sa.ForeignKey("members.address"), primary_key=True),
        sa.Column("last_at", sa.Float(), nullable=False),
        sa.Column("beats", sa.Integer(), nullable=False),
        sa.Column("policy_step", sa.Integer(), nullable=True),
    )
    op.create_table(
        "nonces",
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("nonce", sa.String(128), primary_key=True),
        sa.Column("timestamp", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_nonces_timestamp", "nonces", ["timestamp"])
    op.create_table(
        "checkpoints",
        sa.Column("step", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("blake3", sa.String(64), nullable=False),
        sa.Column("announced_at", sa.Float(), nullable=False),
        sa.Column("final", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "steps",
        sa.Column("step", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("target_samples", sa.Integer(), nullable=False),
        sa.Column("opened_at", sa.Float(), nullable=False),
        sa.Column("full_at", sa.Float(), nullable=True),
    )
    op.create_table(
        "assignments",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("worker", sa.String(42), sa.ForeignKey("members.address"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("prompts", sa.Integer(), nullable=False),
        sa.Column("group_size", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("issued_at", sa.Float(), nullable=False),
        sa.Column("deadline", sa.Float(), nullable=False),
        sa.Column("closed_at", sa.Float(), nullable=True),
        sa.CheckConstraint(
            "state IN ('issued', 'returned', 'lapsed')", name="ck_assignments_state"
        ),
    )
    op.create_index("ix_assignments_worker", "assignments", ["worker"])
    op.create_index("ix_assignments_step", "assignments", ["step"])
    op.create_index("ix_assignments_state", "assignments", ["state"])
    op.create_table(
        "submissions",
        sa.Column("file_hash", sa.String(64), primary_key=True),
        sa.Column("assignment_id", sa.Integer(), sa.ForeignKey("assignments.id"), nullable=False),
        sa.Column("worker", sa.String(42), sa.ForeignKey("members.address"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("stored_name", sa.String(256), nullable=False, unique=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("num_nonzero", sa.Integer(), nullable=False),
        sa.Column("num_tokens", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("to_validate", sa.Boolean(), nullable=False),
        sa.Column("validation_claimed_at", sa.Float(), nullable=True),
        sa.Column("uploaded_at", sa.Float(), nullable=False),
        sa.Column("trained_step", sa.Integer(), nullable=True),
        sa.Column("trained_at", sa.Float(), nullable=True),
        sa.CheckConstraint(
            "state IN ('pending', 'accepted', 'rejected', 'voided')", name="ck_submissions_state"
        ),
        sa.UniqueConstraint("assignment_id", name="uq_submissions_assignment"),
    )
    op.create_index("ix_submissions_worker", "submissions", ["worker"])
    op.create_index("ix_submissions_step", "submissions", ["step"])
    op.create_index("ix_submissions_state", "submissions", ["state"])
    op.create_table(
        "verdicts",
        sa.Column(
            "file_hash", sa.String(64), sa.ForeignKey("submissions.file_hash"), primary_key=True
        ),
        sa.Column("validator", sa.String(42), sa.ForeignKey("members.address"), nullable=False),
        sa.Column("accepted", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("signed_text", sa.Text(), nullable=False),
        sa.Column("signature", sa.String(132), nullable=False),
        sa.Column("decided_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "contributions",
        sa.Column(
            "file_hash", sa.String(64), sa.ForeignKey("submissions.file_hash"), primary_key=True
        ),
        sa.Column("worker", sa.String(42), sa.ForeignKey("members.address"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("credited_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_contributions_worker", "contributions", ["worker"])


def downgrade() -> None:
    for table in (
        "contributions",
        "verdicts",
        "submissions",
        "assignments",
        "steps",
        "checkpoints",
        "nonces",
        "heartbeats",
        "members",
    ):
        op.drop_table(table)
