"""api_keys.admin: routes that change what the platform serves need an admin key

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 02:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("admin", sa.Boolean(), server_default=sa.false(), nullable=False))
    # Keys made before scopes existed could call every route: they keep that access.
    op.execute(sa.text("UPDATE api_keys SET admin = true"))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("admin")
