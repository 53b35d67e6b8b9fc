"""alerts: alert_states, alert_groups, alert_outbox, silences, alert_evaluations

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "alert_states",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(256), nullable=False),
        sa.Column("fingerprint", sa.String(32), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("annotations", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("active_at", TS, nullable=False),
        sa.Column("fired_at", TS, nullable=True),
        sa.Column("last_true_at", TS, nullable=True),
        sa.Column("resolved_at", TS, nullable=True),
        sa.Column("evaluated_at", TS, nullable=False),
        sa.CheckConstraint("state IN ('pending', 'firing', 'resolved')", name=op.f("ck_alert_states_state_known")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_states")),
        sa.UniqueConstraint("rule", "fingerprint", name="uq_alert_states_rule_fingerprint"),
    )
    op.create_table(
        "alert_groups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("receiver", sa.String(128), nullable=False),
        sa.Column("group_key", sa.String(512), nullable=False),
        sa.Column("first_seen_at", TS, nullable=True),
        sa.Column("sent_at", TS, nullable=True),
        sa.Column("digest", sa.String(64), nullable=True),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("sent", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_groups")),
        sa.UniqueConstraint("receiver", "group_key", name="uq_alert_groups_receiver_group_key"),
    )
    op.create_table(
        "alert_outbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("receiver", sa.String(128), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("next_attempt_at", TS, nullable=False),
        sa.Column("delivered_at", TS, nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'delivered', 'failed')", name=op.f("ck_alert_outbox_status_known")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_outbox")),
        sa.UniqueConstraint("key", name=op.f("uq_alert_outbox_key")),
    )
    op.create_index(op.f("ix_alert_outbox_status"), "alert_outbox", ["status"])
    op.create_table(
        "silences",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("matchers", sa.JSON(), nullable=False),
        sa.Column("starts_at", TS, nullable=False),
        sa.Column("ends_at", TS, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", TS, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_silences")),
    )
    op.create_index(op.f("ix_silences_ends_at"), "silences", ["ends_at"])
    op.create_table(
        "alert_evaluations",
        sa.Column("group_name", sa.String(200), nullable=False),
        sa.Column("evaluated_at", TS, nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("rules", sa.Integer(), nullable=False),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("group_name", name=op.f("pk_alert_evaluations")),
    )


def downgrade() -> None:
    op.drop_table("alert_evaluations")
    op.drop_index(op.f("ix_silences_ends_at"), table_name="silences")
    op.drop_table("silences")
    op.drop_index(op.f("ix_alert_outbox_status"), table_name="alert_outbox")
    op.drop_table("alert_outbox")
    op.drop_table("alert_groups")
    op.drop_table("alert_states")
