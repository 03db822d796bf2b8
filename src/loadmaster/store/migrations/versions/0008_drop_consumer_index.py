"""allocations: no index of its own on consumer_id

The unique constraint (consumer_id, host_id, resource_class_id) already begins with it,
so a search by consumer uses that; the second index was only written to, slowing every
insert of a record (docs/architecture.md has the figures).

Revision ID: 0008_drop_consumer_index
Revises: 0007_fence_claims
"""

from alembic import op

revision = "0008_drop_consumer_index"
down_revision = "0007_fence_claims"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_allocations_consumer_id", table_name="allocations")


def downgrade() -> None:
    op.create_index("ix_allocations_consumer_id", "allocations", ["consumer_id"])
