"""guests' devices: the image catalogue, each VM's image and NICs (network, MAC)

Revision ID: 0010_guest_devices
Revises: 0009_fence_failures
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_guest_devices"
down_revision = "0009_fence_failures"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "images",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.add_column(sa.Column("image", sa.String(length=100), nullable=True))
        # VMs created before have no NIC.
        batch_op.add_column(sa.Column("nics", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.drop_column("nics")
        batch_op.drop_column("image")
    op.drop_table("images")
