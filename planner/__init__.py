"""What if: the fleet's recorded traffic replayed against other fleets (see planner.plan)."""
