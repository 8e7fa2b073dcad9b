"""Accountability: accounts and their journal, stake, ejection, soft verdicts, paid
contributions, slashings and the files they taint.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain column additions: SQLite needs no table rebuild (members is referenced by
    # most tables, and rebuilding it under foreign keys would fail).
    op.add_column("members", sa.Column("ejected_at", sa.Float(), nullable=True))
    op.add_column("members", sa.Column("soft_invalidated_at", sa.Float(), nullable=True))
    op.add_column(
        "verdicts", sa.Column("soft", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("contributions", sa.Column("paid_at", sa.Float(), nullable=True))
    op.add_column("contributions", sa.Column("amount", sa.BigInteger(), nullable=True))
    op.add_column("contributions", sa.Column("forfeited_at", sa.Float(), nullable=True))
    op.create_table(
        "accounts",
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("balance", sa.BigInteger(), nullable=False),
        sa.Column("stake", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "journal",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("address", sa.String(42), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("file_hash", sa.String(64), nullable=True),
        sa.Column("by", sa.String(42), nullable=True),
        sa.CheckConstraint(
            "kind IN ('fund', 'stake', 'release', 'slash', 'payout')", name="ck_journal_kind"
        ),
        sa.CheckConstraint("amount >= 0", name="ck_journal_amount"),
        sa.UniqueConstraint("kind", "file_hash", name="uq_journal_kind_file"),
    )
    op.create_index("ix_journal_address", "journal", ["address"])
    op.create_table(
        "slashings",
        sa.Column(
            "file_hash", sa.String(64), sa.ForeignKey("submissions.file_hash"), primary_key=True
        ),
        sa.Column("address", sa.String(42), sa.ForeignKey("members.address"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("voided_files", sa.Integer(), nullable=False),
        sa.Column("tainted_files", sa.Integer(), nullable=False),
    )
    op.create_index("ix_slashings_address", "slashings", ["address"])
    op.create_table(
        "taints",
        sa.Column(
            "file_hash", sa.String(64), sa.ForeignKey("submissions.file_hash"), primary_key=True
        ),
        sa.Column("cause", sa.String(64), sa.ForeignKey("slashings.file_hash"), nullable=False),
        sa.Column("worker", sa.String(42), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("trained_step", sa.Integer(), nullable=False),
    )
    op.create_index("ix_taints_cause", "taints", ["cause"])


def downgrade() -> None:
    for table in ("taints", "slashings", "journal", "accounts"):
        op.drop_table(table)
    with op.batch_alter_table("contributions") as batch:
        for column in ("forfeited_at", "amount", "paid_at"):
            batch.drop_column(column)
    with op.batch_alter_table("verdicts") as batch:
        batch.drop_column("soft")
    with op.batch_alter_table("members") as batch:
        for column in ("soft_invalidated_at", "ejected_at"):
            batch.drop_column(column)
