"""Indexes for the orchestrator's per-request queries: the newest submissions (observed
yield, before the trainer reports) without sorting them all, and a step's live claims
from the index alone.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_submissions_uploaded_at", "submissions", ["uploaded_at"])
    op.create_index(
        "ix_submissions_step_claims",
        "submissions",
        ["step", "state", "counted", "num_nonzero"],
    )


def downgrade() -> None:
    op.drop_index("ix_submissions_step_claims", table_name="submissions")
    op.drop_index("ix_submissions_uploaded_at", table_name="submissions")
