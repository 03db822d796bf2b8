"""host agents: the run of the host manager last heard, and the run that last read the
host's work list

Revision ID: 0012_agent_runs
Revises: 0011_vm_devices
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_agent_runs"
down_revision = "0011_vm_devices"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("host_agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("agent_run", sa.String(64), nullable=True))
        batch_op.add_column(sa.Column("listed_run", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("host_agents", schema=None) as batch_op:
        batch_op.drop_column("listed_run")
        batch_op.drop_column("agent_run")
