"""seed gpu_prices: H100, A100-80GB, L4 and the CPU demo fleet's cpu-demo

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

Starting points, not quotes: on-demand cloud list prices per GPU-hour seen in 2025-2026
(rounded), and a small VM's price for the bundled CPU fleet. Edit them to your contract
(``fleetscope prices set``); the downgrade removes only rows still holding the seeded price.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SEED = [
    ("H100", 2.99, "seeded: on-demand list price, edit to your contract"),
    ("A100-80GB", 1.79, "seeded: on-demand list price, edit to your contract"),
    ("L4", 0.80, "seeded: on-demand list price, edit to your contract"),
    ("cpu-demo", 0.10, "seeded: a 2-vCPU VM per hour, for the bundled CPU fleet"),
]

prices = sa.table(
    "gpu_prices",
    sa.column("gpu_type", sa.String),
    sa.column("usd_per_gpu_hour", sa.Float),
    sa.column("note", sa.Text),
)


def upgrade() -> None:
    bind = op.get_bind()
    existing = {row[0] for row in bind.execute(sa.select(prices.c.gpu_type))}
    rows = [{"gpu_type": g, "usd_per_gpu_hour": p, "note": n} for g, p, n in SEED if g not in existing]
    if rows:
        op.bulk_insert(prices, rows)


def downgrade() -> None:
    for gpu_type, price, _note in SEED:
        op.execute(prices.delete().where(prices.c.gpu_type == gpu_type).where(prices.c.usd_per_gpu_hour == price))
