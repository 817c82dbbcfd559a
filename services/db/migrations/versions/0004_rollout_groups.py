"""rollout groups: the unit the trainer claims; rollouts with token ids, the sampler log-probs and the verdict status

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 03:56:27.353567
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollout_groups",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=True),
        sa.Column("job_id", sa.String(length=36), nullable=True),
        sa.Column("model_version_id", sa.String(length=32), nullable=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dropped", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_version_id"],
            ["model_versions.id"],
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("rollout_groups", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rollout_groups_claimed_by"), ["claimed_by"], unique=False)
        batch_op.create_index(batch_op.f("ix_rollout_groups_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_rollout_groups_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_rollout_groups_task_id"), ["task_id"], unique=False)

    with op.batch_alter_table("rollouts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("completion_ids", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("behaviour_logps", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("status", sa.String(length=20), server_default="unscored", nullable=False))
        batch_op.alter_column("candidate_id", existing_type=sa.VARCHAR(length=32), nullable=True)
        batch_op.alter_column("task_id", existing_type=sa.VARCHAR(length=32), nullable=True)
        batch_op.alter_column("group_id", existing_type=sa.VARCHAR(length=64), nullable=False)
        batch_op.alter_column("reward", existing_type=sa.FLOAT(), nullable=True)
        batch_op.create_foreign_key("fk_rollouts_group_id_rollout_groups", "rollout_groups", ["group_id"], ["id"])
        batch_op.drop_column("consumed")


def downgrade() -> None:
    with op.batch_alter_table("rollouts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("consumed", sa.BOOLEAN(), server_default=sa.false(), nullable=False))
        batch_op.drop_constraint("fk_rollouts_group_id_rollout_groups", type_="foreignkey")
        batch_op.alter_column("reward", existing_type=sa.FLOAT(), nullable=False)
        batch_op.alter_column("group_id", existing_type=sa.VARCHAR(length=64), nullable=True)
        batch_op.alter_column("task_id", existing_type=sa.VARCHAR(length=32), nullable=False)
        batch_op.alter_column("candidate_id", existing_type=sa.VARCHAR(length=32), nullable=False)
        batch_op.drop_column("status")
        batch_op.drop_column("behaviour_logps")
        batch_op.drop_column("completion_ids")

    with op.batch_alter_table("rollout_groups", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_rollout_groups_task_id"))
        batch_op.drop_index(batch_op.f("ix_rollout_groups_job_id"))
        batch_op.drop_index(batch_op.f("ix_rollout_groups_created_at"))
        batch_op.drop_index(batch_op.f("ix_rollout_groups_claimed_by"))

    op.drop_table("rollout_groups")
