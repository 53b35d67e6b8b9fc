"""initial metadata tables: gpu_prices, replicas, slos, annotations

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamps() -> list[sa.Column[datetime]]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "gpu_prices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("usd_per_gpu_hour", sa.Float(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        *_timestamps(),
        sa.CheckConstraint("usd_per_gpu_hour >= 0", name=op.f("ck_gpu_prices_price_non_negative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_prices")),
        sa.UniqueConstraint("gpu_type", name=op.f("uq_gpu_prices_gpu_type")),
    )
    op.create_table(
        "replicas",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("endpoint", sa.String(512), nullable=False),
        *_timestamps(),
        sa.CheckConstraint("gpu_count >= 0", name=op.f("ck_replicas_gpu_count_non_negative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replicas")),
        sa.UniqueConstraint("name", name=op.f("uq_replicas_name")),
    )
    op.create_table(
        "slos",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("metric", sa.String(16), nullable=False),
        sa.Column("threshold_seconds", sa.Float(), nullable=False),
        sa.Column("percentile", sa.Float(), nullable=True),
        sa.Column("objective", sa.Float(), nullable=False),
        sa.Column("window_days", sa.Integer(), nullable=False),
        *_timestamps(),
        sa.CheckConstraint("metric IN ('ttft', 'itl', 'tpot', 'e2e')", name=op.f("ck_slos_metric_known")),
        sa.CheckConstraint("threshold_seconds > 0", name=op.f("ck_slos_threshold_positive")),
        sa.CheckConstraint("objective > 0 AND objective < 1", name=op.f("ck_slos_objective_ratio")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slos")),
        sa.UniqueConstraint("model", "metric", name="uq_slos_model_metric"),
    )
    op.create_table(
        "annotations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("title", sa.String(256), nullable=False),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_annotations")),
    )
    op.create_index(op.f("ix_annotations_starts_at"), "annotations", ["starts_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_annotations_starts_at"), table_name="annotations")
    op.drop_table("annotations")
    op.drop_table("slos")
    op.drop_table("replicas")
    op.drop_table("gpu_prices")
