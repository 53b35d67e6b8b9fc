"""The gateway in front of the replicas: routing (round-robin, least-loaded, affinity, model
router), admission control, request log. ``python -m fleet.gateway --spec fleet.yaml`` runs it."""
