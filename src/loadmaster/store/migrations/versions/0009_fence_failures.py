"""host agents: fences that failed in a row, and why the last one did

Revision ID: 0009_fence_failures
Revises: 0008_drop_consumer_index
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_fence_failures"
down_revision = "0008_drop_consumer_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("host_agents", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("fence_failures", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("fence_error", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("host_agents", schema=None) as batch_op:
        batch_op.drop_column("fence_error")
        batch_op.drop_column("fence_failures")
