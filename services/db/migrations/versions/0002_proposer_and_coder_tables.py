"""proposer and coder tables: mined API statistics, task graph hashes, candidate provenance

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 22:42:14.765098
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_corpora",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("sources", sa.JSON(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("modules", sa.Integer(), nullable=False),
        sa.Column("mined_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "api_pairs",
        sa.Column("corpus", sa.String(length=200), nullable=False),
        sa.Column("api_a", sa.String(length=200), nullable=False),
        sa.Column("api_b", sa.String(length=200), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["corpus"], ["api_corpora.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("corpus", "api_a", "api_b"),
    )
    op.create_table(
        "api_usage",
        sa.Column("corpus", sa.String(length=200), nullable=False),
        sa.Column("api", sa.String(length=200), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["corpus"], ["api_corpora.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("corpus", "api"),
    )
    with op.batch_alter_table("candidates", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model_name", sa.String(length=500), nullable=True))
        batch_op.add_column(sa.Column("details", sa.JSON(), nullable=True))

    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("graph_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("details", sa.JSON(), nullable=True))
        batch_op.create_index(batch_op.f("ix_tasks_graph_hash"), ["graph_hash"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_graph_hash"))
        batch_op.drop_column("details")
        batch_op.drop_column("graph_hash")

    with op.batch_alter_table("candidates", schema=None) as batch_op:
        batch_op.drop_column("details")
        batch_op.drop_column("model_name")

    op.drop_table("api_usage")
    op.drop_table("api_pairs")
    op.drop_table("api_corpora")
