"""What each SHARDCAST server says it has served, with its heartbeats (the dashboard's
broadcast figures).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.add_column(sa.Column("bytes_served", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.drop_column("bytes_served")
