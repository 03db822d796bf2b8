"""host devices agents gave VMs; flavors' traits per class (PCI aliases)

Revision ID: 0011_vm_devices
Revises: 0010_guest_devices
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_vm_devices"
down_revision = "0010_guest_devices"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "vm_devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("vm_id", sa.Integer(), nullable=False),
        sa.Column("provider_id", sa.Integer(), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("mdev_uuid", sa.String(length=36), nullable=True),
        sa.ForeignKeyConstraint(["provider_id"], ["hosts.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["vm_id"], ["vms.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_vm_devices_provider_id", "vm_devices", ["provider_id"])
    op.create_index("ix_vm_devices_vm_id", "vm_devices", ["vm_id"])
    with op.batch_alter_table("flavors", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("class_traits", sa.JSON(), nullable=False, server_default="{}")
        )


def downgrade() -> None:
    with op.batch_alter_table("flavors", schema=None) as batch_op:
        batch_op.drop_column("class_traits")
    op.drop_index("ix_vm_devices_vm_id", table_name="vm_devices")
    op.drop_index("ix_vm_devices_provider_id", table_name="vm_devices")
    op.drop_table("vm_devices")
