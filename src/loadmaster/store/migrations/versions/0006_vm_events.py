"""vm events: every change of a VM's state, host or migration target, as it commits

Revision ID: 0006_vm_events
Revises: 0005_consumers
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_vm_events"
down_revision = "0005_consumers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "vm_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("vm_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("old_state", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("old_host", sa.String(length=255), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("old_target", sa.String(length=255), nullable=True),
        sa.Column("target", sa.String(length=255), nullable=True),
        sa.Column("fault", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["vm_id"], ["vms.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_vm_events_vm_id", "vm_events", ["vm_id"])


def downgrade() -> None:
    op.drop_index("ix_vm_events_vm_id", table_name="vm_events")
    op.drop_table("vm_events")
