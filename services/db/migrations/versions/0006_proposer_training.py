"""Proposer RL in the loop: the Proposer version a run last published, and the role of each record

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 23:10:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("proposer_version_id", sa.String(length=32), nullable=True))
        batch_op.create_foreign_key("fk_training_runs_proposer_version", "model_versions", ["proposer_version_id"], ["id"])
    with op.batch_alter_table("training_records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("role", sa.String(length=10), server_default="coder", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("training_records", schema=None) as batch_op:
        batch_op.drop_column("role")
    with op.batch_alter_table("training_runs", schema=None) as batch_op:
        batch_op.drop_constraint("fk_training_runs_proposer_version", type_="foreignkey")
        batch_op.drop_column("proposer_version_id")
