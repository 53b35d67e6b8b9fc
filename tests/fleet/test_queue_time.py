"""Admission by queue time on hand-made queues: the budget from the SLO, the tenant's share,
priorities, and the bounds (no estimate without a pace; a pool with no SLO is not shed)."""

from __future__ import annotations

from fleet.gateway.queue_time import QueueTime


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def paced(qt: QueueTime, clock: Clock, pool: str, per_s: float, seconds: float, tenant: str = "warm") -> None:
    """The pool gave first tokens at ``per_s`` for ``seconds`` (requests sent and answered)."""
    for _ in range(round(per_s * seconds)):
        qt.sent(pool, tenant)
        clock.now += 1 / per_s
        qt.first_token(pool, tenant)


def queue(qt: QueueTime, pool: str, tenant: str, n: int) -> None:
    for _ in range(n):
        qt.sent(pool, tenant)


def test_a_request_that_would_wait_past_the_budget_is_shed_with_the_time_to_retry() -> None:
    clock = Clock()
    qt = QueueTime({"small": 4.0}, clock=clock)
    paced(qt, clock, "small", per_s=1.0, seconds=20)  # one first token a second
    queue(qt, "small", "acme", 2)  # two waiting: a third waits ~3 s, inside 4 s
    verdict = qt.decide("small", "acme")
    assert verdict.admitted and verdict.estimated_wait_s is not None and 2.5 < verdict.estimated_wait_s < 3.5
    queue(qt, "small", "acme", 4)  # six waiting: ~7 s
    verdict = qt.decide("small", "globex")
    assert not verdict.admitted and verdict.reason == "queue_time"
    assert "past its 4.0s budget" in verdict.message
    assert verdict.retry_after_s == 3  # the ~3 s over the budget, rounded up
    # the budget is the SLO times the factor
    assert QueueTime({"small": 4.0}, budget_factor=2.0, clock=clock).budget("small", "acme") == 8.0


def test_no_estimate_no_shedding_quiet_pools_and_pools_without_an_slo() -> None:
    clock = Clock()
    qt = QueueTime({"small": 1.0}, min_events=5, clock=clock)
    queue(qt, "small", "acme", 50)  # a long queue, but no first token seen yet: no pace to judge by
    assert qt.decide("small", "acme").admitted
    assert qt.estimated_wait("small") is None
    paced(qt, clock, "large", per_s=0.2, seconds=60)  # slow and long, but the large pool has no SLO
    queue(qt, "large", "acme", 30)
    assert qt.decide("large", "acme").admitted
    # a pace is forgotten once out of the window: a pool that went quiet is judged afresh
    paced(qt, clock, "small", per_s=1.0, seconds=10)
    assert not qt.decide("small", "acme").admitted
    clock.now += 31
    assert qt.decide("small", "acme").admitted


def test_the_tenant_over_its_share_is_shed_first() -> None:
    clock = Clock()
    qt = QueueTime({"small": 10.0}, fair_share_at=0.5, clock=clock)
    paced(qt, clock, "small", per_s=1.0, seconds=20)
    queue(qt, "small", "acme", 6)
    queue(qt, "small", "globex", 1)  # ~8 s to wait: past half the budget, inside it
    hog, fair = qt.decide("small", "acme"), qt.decide("small", "globex")
    assert not hog.admitted and hog.reason == "tenant_share" and "tenant acme holds 6 of its 7" in hog.message
    assert fair.admitted
    # a newcomer holds nothing: admitted
    assert qt.decide("small", "initech").admitted
    # weights set the share: with weight 7 against globex's 1, acme may hold 7 of the 8 waiting
    weighted = QueueTime({"small": 10.0}, weights={"acme": 7.0}, clock=clock)
    paced(weighted, clock, "small", per_s=1.0, seconds=20)
    queue(weighted, "small", "acme", 6)
    queue(weighted, "small", "globex", 1)
    assert weighted.decide("small", "acme").admitted
    # below half the budget nobody is shed for a share
    calm = QueueTime({"small": 10.0}, clock=clock)
    paced(calm, clock, "small", per_s=1.0, seconds=20)
    queue(calm, "small", "acme", 3)
    assert calm.decide("small", "acme").admitted


def test_priority_widens_the_budget_and_spares_the_share_rule_a_negative_one_narrows_it() -> None:
    clock = Clock()
    qt = QueueTime({"small": 4.0}, priorities={"vip": 2, "batch": -2}, clock=clock)
    paced(qt, clock, "small", per_s=1.0, seconds=20)
    queue(qt, "small", "vip", 5)  # ~6 s
    assert not qt.decide("small", "acme").admitted  # 4 s budget
    assert qt.decide("small", "vip").admitted  # 8 s budget, and over its share but with priority
    assert qt.budget("small", "batch") == 2.0
    clock2 = Clock()
    light = QueueTime({"small": 4.0}, priorities={"batch": -2}, clock=clock2)
    paced(light, clock2, "small", per_s=1.0, seconds=20)
    queue(light, "small", "acme", 2)  # ~3 s: inside 4 s, past batch's 2 s
    assert light.decide("small", "acme").admitted
    verdict = light.decide("small", "batch")
    assert not verdict.admitted and verdict.reason == "queue_time"


def test_the_waiting_count_follows_requests_as_they_go() -> None:
    clock = Clock()
    qt = QueueTime({"small": 4.0}, clock=clock)
    qt.sent("small", "acme")
    qt.sent("small", "acme")
    qt.sent("small", "globex")
    assert qt.pool("small").ahead == 3 and qt.pool("small").ahead_by_tenant == {"acme": 2, "globex": 1}
    qt.first_token("small", "acme")  # one answered: it no longer waits
    qt.done("small", "acme", waited=False)  # its end changes nothing more
    qt.done("small", "globex", waited=True)  # one failed before its first token: it left the queue
    assert qt.pool("small").ahead == 1 and qt.pool("small").ahead_by_tenant == {"acme": 1}
    qt.done("small", "acme", waited=True)
    qt.done("small", "acme", waited=True)  # more ends than starts never make a negative queue
    assert qt.pool("small").ahead == 0 and qt.pool("small").ahead_by_tenant == {}


def test_a_quiet_pool_is_judged_by_its_service_rate_not_by_its_demand() -> None:
    """One request every 5 s, each answered in 0.25 s: the pace is 4 a second (the seconds with
    requests waiting), not 0.2, so a burst of three (~1 s) fits a 2 s budget."""
    clock = Clock()
    qt = QueueTime({"small": 2.0}, clock=clock)
    for _ in range(6):
        qt.sent("small", "acme")
        clock.now += 0.25
        qt.first_token("small", "acme")
        clock.now += 4.75
    assert abs(qt.estimated_wait("small") - 0.25) < 1e-6
    queue(qt, "small", "acme", 3)
    verdict = qt.decide("small", "globex")
    assert verdict.admitted and abs(verdict.estimated_wait_s - 1.0) < 1e-6
