"""host agents: registrations, per-host sequence stamps and launch faults on VMs

Revision ID: 0003_host_agents
Revises: 0002_reliab
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_host_agents"
down_revision = "0002_reliab"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.add_column(sa.Column("host_seq", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("fault", sa.Text(), nullable=True))
        batch_op.add_column(
            sa.Column("tried_hosts", sa.JSON(), nullable=False, server_default="[]")
        )
    op.create_table(
        "host_agents",
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("hypervisor_uri", sa.String(length=1024), nullable=False),
        sa.Column("registered_at", sa.DateTime(), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(), nullable=False),
        sa.Column("seen_generation", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("host_id"),
    )


def downgrade() -> None:
    op.drop_table("host_agents")
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.drop_column("tried_hosts")
        batch_op.drop_column("fault")
        batch_op.drop_column("host_seq")
