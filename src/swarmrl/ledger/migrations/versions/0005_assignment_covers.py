"""Speculative assignments: an assignment may re-issue the share of another open one
(`covers`), so one silent worker does not stall its step.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain column addition: SQLite needs no rebuild of a table others refer to.
    op.add_column("assignments", sa.Column("covers", sa.Integer(), nullable=True))
    op.create_index("ix_assignments_covers", "assignments", ["covers"])


def downgrade() -> None:
    op.drop_index("ix_assignments_covers", table_name="assignments")
    op.drop_column("assignments", "covers")
