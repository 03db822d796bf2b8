"""a VM outlives its flavor once deleted

Revision ID: 0002_reliab
Revises: 0001

Deleting a flavor used to purge its deleted VMs (their flavor_id could not be NULL), so a
retried DELETE /vms/{uuid} answered 404. A deleted VM now merely lets go of its flavor,
as it lets go of its server group.
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_reliab"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.alter_column("flavor_id", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    # VMs that let go of their flavor cannot get it back: they go, as they did before.
    op.execute("DELETE FROM vms WHERE flavor_id IS NULL")
    with op.batch_alter_table("vms", schema=None) as batch_op:
        batch_op.alter_column("flavor_id", existing_type=sa.Integer(), nullable=False)
