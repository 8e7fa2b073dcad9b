"""The trainer's own count of each step: usable and read samples, the files it counted,
and whether it calls the step full.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("steps", sa.Column("trainer_usable", sa.Integer(), nullable=True))
    op.add_column("steps", sa.Column("trainer_read", sa.Integer(), nullable=True))
    op.add_column(
        "steps",
        sa.Column("trainer_full", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column("steps", sa.Column("reported_at", sa.Float(), nullable=True))
    op.add_column(
        "submissions",
        sa.Column("counted", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    with op.batch_alter_table("submissions") as batch:
        batch.drop_column("counted")
    with op.batch_alter_table("steps") as batch:
        for column in ("reported_at", "trainer_full", "trainer_read", "trainer_usable"):
            batch.drop_column(column)
