"""consumers: Placement's generic consumers; a VM is one, allocations belong to consumers

Every VM becomes the consumer of its uuid (its project, its user, type INSTANCE, its
generation), and its records move onto that consumer. The allocations table is rebuilt
rather than altered: its foreign key to ``vms`` was created without a name.

Revision ID: 0005_consumers
Revises: 0004_cluster_clock
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_consumers"
down_revision = "0004_cluster_clock"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "consumers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=36), nullable=False),
        sa.Column("project_id", sa.String(length=255), nullable=False),
        sa.Column("user_id", sa.String(length=255), nullable=False),
        sa.Column("consumer_type", sa.String(length=255), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("uuid"),
    )
    op.create_index("ix_consumers_project_id", "consumers", ["project_id"])
    op.create_index("ix_consumers_user_id", "consumers", ["user_id"])
    op.execute(
        "INSERT INTO consumers (uuid, project_id, user_id, consumer_type, generation, "
        "created_at, updated_at) SELECT uuid, project_id, user_id, 'INSTANCE', generation, "
        "created_at, updated_at FROM vms ORDER BY id"
    )
    op.create_table(
        "allocations_new",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("consumer_id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("resource_class_id", sa.Integer(), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("state IN ('pending', 'active')", name="allocation_state"),
        sa.CheckConstraint("amount > 0", name="allocation_amount_positive"),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name="fk_allocations_host_id"),
        sa.ForeignKeyConstraint(
            ["resource_class_id"], ["resource_classes.id"], name="fk_allocations_class_id"
        ),
        sa.ForeignKeyConstraint(
            ["consumer_id"], ["consumers.id"], ondelete="CASCADE", name="fk_allocations_consumer"
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "consumer_id", "host_id", "resource_class_id", name="uq_allocation_consumer_host_class"
        ),
    )
    op.execute(
        "INSERT INTO allocations_new (consumer_id, host_id, resource_class_id, amount, state, "
        "created_at) SELECT c.id, a.host_id, a.resource_class_id, a.amount, a.state, "
        "a.created_at FROM allocations a JOIN vms ON vms.id = a.vm_id "
        "JOIN consumers c ON c.uuid = vms.uuid ORDER BY a.id"
    )
    op.drop_index("ix_allocations_host_class", table_name="allocations")
    op.drop_table("allocations")
    op.rename_table("allocations_new", "allocations")
    op.create_index(
        "ix_allocations_host_class",
        "allocations",
        ["host_id", "resource_class_id", "state", "amount"],
    )
    op.create_index("ix_allocations_consumer_id", "allocations", ["consumer_id"])
    # Only now: SQLite rebuilds ``vms`` to alter it, and dropping the old copy would have
    # cascaded to records still pointing at it.
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.add_column(sa.Column("consumer_id", sa.Integer(), nullable=True))
    op.execute(
        "UPDATE vms SET consumer_id = (SELECT consumers.id FROM consumers "
        "WHERE consumers.uuid = vms.uuid)"
    )
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.alter_column("consumer_id", existing_type=sa.Integer(), nullable=False)
        batch_op.create_unique_constraint("uq_vms_consumer_id", ["consumer_id"])
        batch_op.create_foreign_key(
            "fk_vms_consumer_id", "consumers", ["consumer_id"], ["id"], ondelete="CASCADE"
        )


def downgrade() -> None:
    raise NotImplementedError("0005_consumers is not reversible: restore a backup instead")
