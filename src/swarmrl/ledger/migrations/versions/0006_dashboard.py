"""The dashboard's tables: the trainer's step metrics, and when each member first held
each checkpoint.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "training_metrics",
        sa.Column("step", sa.Integer(), primary_key=True),
        sa.Column("reported_at", sa.Float(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("task_reward", sa.Float(), nullable=True),
        sa.Column("length_error", sa.Float(), nullable=True),
        sa.Column("grad_norm", sa.Float(), nullable=True),
        sa.Column("clip_ratio", sa.Float(), nullable=True),
        sa.Column("entropy", sa.Float(), nullable=True),
        sa.Column("staleness_mean", sa.Float(), nullable=False),
        sa.Column("staleness_max", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("step_seconds", sa.Float(), nullable=False),
        sa.Column("heldout_accuracy", sa.Float(), nullable=True),
    )
    op.create_table(
        "checkpoint_arrivals",
        sa.Column("address", sa.String(42), sa.ForeignKey("members.address"), primary_key=True),
        sa.Column("step", sa.Integer(), primary_key=True),
        sa.Column("at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("checkpoint_arrivals")
    op.drop_table("training_metrics")
