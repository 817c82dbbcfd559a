"""Exactly-once effects and recovery: one verdict per (scoring job, candidate index), the job that proposed
each task, checkpoints an attempt leaves for the next, and when a job was last sent and last heard from

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 03:10:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_checkpoints",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("step", sa.String(length=100), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "step"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("scores", schema=None) as batch_op:
        batch_op.add_column(sa.Column("item", sa.Integer(), nullable=True))
        batch_op.create_unique_constraint("uq_scores_job_item", ["job_id", "item"])
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("job_id", sa.String(length=36), nullable=True))
        batch_op.create_index(batch_op.f("ix_tasks_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_job_id"))
        batch_op.drop_column("job_id")
    with op.batch_alter_table("scores", schema=None) as batch_op:
        batch_op.drop_constraint("uq_scores_job_item", type_="unique")
        batch_op.drop_column("item")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("heartbeat_at")
        batch_op.drop_column("enqueued_at")
    op.drop_table("job_checkpoints")
