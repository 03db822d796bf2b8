"""host agents: when a server process took on fencing the host

Revision ID: 0007_fence_claims
Revises: 0006_vm_events
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_fence_claims"
down_revision = "0006_vm_events"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("host_agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("fence_claimed_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("host_agents", schema=None) as batch_op:
        batch_op.drop_column("fence_claimed_at")
