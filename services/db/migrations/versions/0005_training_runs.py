"""training runs of the alternating loop and their per-step and per-round records

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 11:10:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "training_runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("run_dir", sa.String(length=1000), nullable=False),
        sa.Column("rounds_done", sa.Integer(), nullable=False),
        sa.Column("coder_version_id", sa.String(length=32), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["coder_version_id"], ["model_versions.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("training_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_training_runs_status"), ["status"], unique=False)
        batch_op.create_index(batch_op.f("ix_training_runs_job_id"), ["job_id"], unique=False)
    op.create_table(
        "training_records",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=10), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["training_runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("training_records", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_training_records_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("training_records", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_training_records_run_id"))
    op.drop_table("training_records")
    with op.batch_alter_table("training_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_training_runs_job_id"))
        batch_op.drop_index(batch_op.f("ix_training_runs_status"))
    op.drop_table("training_runs")
