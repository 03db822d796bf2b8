"""cluster clock: a change sequence for schedulers' snapshots, apart from generations

Revision ID: 0004_cluster_clock
Revises: 0003_host_agents
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_cluster_clock"
down_revision = "0003_host_agents"
branch_labels = None
depends_on = None


def upgrade() -> None:
    clock = op.create_table(
        "cluster_clock",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("layout_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.bulk_insert(clock, [{"id": 1, "seq": 0, "layout_seq": 0}])
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("changed_seq", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch_op.create_index("ix_hosts_changed_seq", ["changed_seq"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("hosts", schema=None) as batch_op:
        batch_op.drop_index("ix_hosts_changed_seq")
        batch_op.drop_column("changed_seq")
    op.drop_table("cluster_clock")
