"""Checks whose premises the scale runs showed wrong (issue 21): each still
fires on what it is there for, and no longer on what the broker
or the schedule makes legitimate."""

from __future__ import annotations

from datetime import timedelta

from sim.bus import Msg
from sim.system import CHANGED_TOTAL, Options, Simulation, simulate
from sim.world import FaultConfig


def _run(seed: int, orders: int) -> Simulation:
    sim = simulate(Simulation(seed, orders, options=Options(orders=orders, faults=FaultConfig())))
    sim.violations.clear()
    return sim


def _checks(sim: Simulation) -> list[str]:
    sim.violations.clear()
    sim.check()
    return [c for c, _ in sim.violations]


def test_a_reply_dead_lettered_by_the_broker_after_its_copy_went_on_is_no_loss():
    """Seed 209 (50 orders): a back-off copy of a real reply (`retry/seq-72/1`)
    scheduled the next copy, its complete failed, and its redeliveries met
    faults or a refused schedule until the broker dead-lettered it
    MaxDeliveryCountExceeded; the reply went on in `retry/seq-72/2`. Without
    that next copy, the same dead letter is still a lost reply."""
    sim = _run(1, 1)
    responses = sim.bus.queue("agent-responses")
    now = sim.world.clock.now
    dead = Msg("retry/seq-72/1", b"{}", {}, 900, now, delivery_count=5)
    dead.dead_letter_reason = "MaxDeliveryCountExceeded"
    dead.dead_letter_description = "delivered 5 times"
    responses.dead.append(dead)
    assert "a real reply is never dead-lettered" in _checks(sim)
    responses.sent.append(Msg("retry/seq-72/2", b"{}", {}, 901, now + timedelta(seconds=15)))
    assert "a real reply is never dead-lettered" not in _checks(sim)
    # An earlier copy, or one of another message, carries nothing on.
    responses.sent[-1] = Msg("retry/seq-73/2", b"{}", {}, 901, now)
    assert "a real reply is never dead-lettered" in _checks(sim)
    dead.dead_letter_reason = "ProcessingFailed"  # the handler's own verdict: still a loss
    responses.sent[-1] = Msg("retry/seq-72/2", b"{}", {}, 901, now)
    assert "a real reply is never dead-lettered" in _checks(sim)


def test_a_changed_resend_is_judged_against_the_order_first_rejected():
    """Seeds 58 and 71 (50 orders): the order's conflicting copy (Total 40.00)
    came first and was the order Rejected; the client's "changed" resend
    carried 40.00 too, so it was the Rejected order sent again, rightly
    admitted. The changed resend now carries a total of its own, and the
    orders DB may hold the conflicting copy's content only when that copy
    was sent."""
    from sim.system import INGRESS_OF

    sim = _run(1, 1)
    key = sim.order_ids[0]
    mid = f"{key.split(':')[-1]}/resend-changed"
    sim.changed_resends.append((key, mid))
    body = sim._order_body(key, CHANGED_TOTAL)
    conflict = Msg(mid, body, {}, 900, sim.world.clock.now)
    conflict.dead_letter_reason = "OrderConflict"
    sim.bus.queue(INGRESS_OF[sim.orders[key][0]]).dead.append(conflict)  # as Submit does
    stored = sim.orders_c.docs[(key, key)]
    assert float(stored["Total"]) == 20.0
    stored["Total"] = "40.00"
    assert "a changed resend of a Rejected order is a conflict" in _checks(sim)
    sim.bad[f"{key}/conflict"] = "conflict"
    assert "a changed resend of a Rejected order is a conflict" not in _checks(sim)
    stored["Total"] = CHANGED_TOTAL
    assert "a changed resend of a Rejected order is a conflict" in _checks(sim)
    assert float(CHANGED_TOTAL) not in (20.0, 40.0)


def test_a_changed_resend_is_judged_by_its_lineages_verdict():
    """Seed 5000218 (50 orders): the changed resend's first copy was
    dead-lettered RetriesExhausted on its last delivery, whose schedule of
    the next copy was accepted with its answer lost; two copies later the
    lineage was dead-lettered OrderConflict. The lineage's verdict counts;
    without the later copy, that dead letter is still no conflict."""
    from adapters.settlement import ORIGINAL_ID_PROPERTY
    from sim.system import INGRESS_OF

    sim = _run(1, 1)
    key = sim.order_ids[0]
    mid = f"{key.split(':')[-1]}/resend-changed"
    sim.changed_resends.append((key, mid))
    ingress = sim.bus.queue(INGRESS_OF[sim.orders[key][0]])
    now = sim.world.clock.now
    props = {ORIGINAL_ID_PROPERTY: mid}
    body = sim._order_body(key, CHANGED_TOTAL)
    spent = Msg("retry/seq-512/1/seq-512.1", body, props, 513, now, delivery_count=5)
    spent.dead_letter_reason = "RetriesExhausted"
    ingress.dead.append(spent)
    check = "a changed resend of a Rejected order is a conflict"
    assert check in _checks(sim)
    ingress.sent.append(Msg("retry/seq-512/2/seq-513.5", body, props, 600, now))
    assert check in _checks(sim)  # carried on, but completed as if valid
    conflict = Msg("retry/seq-512/3/seq-600.1", body, props, 700, now)
    conflict.dead_letter_reason = "OrderConflict"
    ingress.dead.append(conflict)
    assert check not in _checks(sim)


def test_what_outlived_its_queues_time_to_live_is_told_apart():
    """Seeds 100271 and 263: the bus keeps a message through an 8-day
    whole-app outage, which Service Bus expires after its queue's
    DefaultMessageTimeToLive (PT1H on the agents' queues): an alert raised by
    such a message could not be raised in Azure, and the forged-message check
    does not count it."""
    from sim.bus import rules_for

    sim = _run(1, 1)
    assert rules_for("agent-responses").ttl == timedelta(hours=1)
    sent_at = sim.world.clock.now
    sim.bus.send("agent-responses", b"{}", "retry/seq-9/1", fault_free=True)
    assert not sim.bus.outlived_ttl(
        "agent-responses", "retry/seq-9/1", sent_at + timedelta(minutes=59)
    )
    assert sim.bus.outlived_ttl("agent-responses", "retry/seq-9/1", sent_at + timedelta(days=8))
    assert not sim.bus.outlived_ttl("agent-responses", "never-sent", sent_at + timedelta(days=8))


def test_a_copy_made_by_a_message_past_its_time_to_live_outlived_it_too():
    """Seed 4000374 (two orders): a forgery's first delivery alerted, then a
    whole-app outage held it 8 days; its redelivery made a back-off copy,
    which alerted again six seconds later. Service Bus would have expired the
    forgery before that redelivery, so the copy could not exist either; a
    copy made by a message within its time to live is judged on its own."""
    sim = _run(1, 1)
    start = sim.world.clock.now
    sim.bus.send("agent-requests", b"{}", "forged/13", fault_free=True)
    (original,) = [m for m in sim.bus.queue("agent-requests").sent if m.message_id == "forged/13"]
    maker = f"seq-{original.seq}.2"
    copy_id = f"retry/seq-{original.seq}/1/{maker}"
    sim.world.clock.now = start + timedelta(days=8)
    sim.bus.send("agent-requests", b"{}", copy_id, fault_free=True)
    handled = sim.world.clock.now + timedelta(seconds=6)
    assert sim.bus.outlived_ttl("agent-requests", copy_id, handled)
    # Made within the original's time to live: the copy's own clock counts.
    sim.bus.queue("agent-requests").sent[-1].sent_at = start + timedelta(minutes=5)
    assert not sim.bus.outlived_ttl("agent-requests", copy_id, handled)


def test_a_forgery_dead_lettered_by_the_broker_is_refused_when_its_copy_was():
    """Seed 54: a forged reply's delivery scheduled its back-off copy (the
    schedule applied, its answer lost, so the gate abandoned the delivery), the
    other deliveries met faults, and the broker dead-lettered the original
    MaxDeliveryCountExceeded; the copy was then dead-lettered ForgedReply. The
    lineage was refused. Without the copy's refusal the broker's verdict is
    still not one."""
    import json

    from adapters.settlement import ORIGINAL_ID_PROPERTY
    from sim.hostile import Hostile

    sim = _run(1, 1)
    hostile = Hostile(sim, 1)
    responses = sim.bus.queue("agent-responses")
    alerts = sim.bus.queue("alerts")
    now = sim.world.clock.now
    mid = "forged/19"
    hostile.forged[mid] = ("agent-responses", "other-application")
    original = Msg(mid, b"{}", {}, 20, now, delivery_count=5)
    original.dead_letter_reason = "MaxDeliveryCountExceeded"
    responses.sent.append(original)
    responses.dead.append(original)
    alerts.sent.append(Msg("alert/forged-19", json.dumps({"MessageId": mid}).encode(), {}, 1, now))

    def failures() -> list[str]:
        sim.violations.clear()
        hostile.check()
        return [c for c, _ in sim.violations]

    assert "forged message refused" in failures()
    copy = Msg("retry/seq-20/1", b"{}", {ORIGINAL_ID_PROPERTY: mid}, 21, now)
    responses.sent.append(copy)
    assert "forged message refused" in failures()  # carried on, but not refused yet
    copy.dead_letter_reason = "ForgedReply"
    responses.dead.append(copy)
    assert failures() == []
    original.dead_letter_reason = "ProcessingFailed"  # a handler's verdict is never a refusal
    assert "forged message refused" in failures()


def test_a_delivery_left_to_redelivery_because_its_copy_faulted_was_ended_by_the_fault():
    """Seed 400174: a forged request's alert could not be queued (applied, its
    answer lost), so the agent carried it on as the copy `retry/seq-28/1` and
    completed the original. Four of the copy's five deliveries met settlement
    faults; on the other, the alert's answer was lost again and the next copy
    `retry/seq-28/2` was refused, so the gate could only abandon it, and the
    broker dead-lettered the copy MaxDeliveryCountExceeded. Every delivery was
    ended by a fault. A delivery the handler abandons of its own accord (seeds
    5113, 100220: no copy tried) still makes the broker's verdict a defect, and
    so does one whose copy send that failed was another message's."""
    import json

    from adapters.settlement import ORIGINAL_ID_PROPERTY
    from sim.bus import rules_for
    from sim.hostile import Hostile

    sim = _run(1, 1)
    sim.bus.after_send = None  # nothing delivers: the test does
    queue = "agent-requests"
    requests = sim.bus.queue(queue)
    requests.messages.clear()
    alerts = sim.bus.queue("alerts")
    assert rules_for(queue).max_delivery == 5

    def failures(root: int, faulted_copy: str | None) -> list[str]:
        """Forgery `forged/{root}` carried on as `retry/seq-{root}/1`, whose
        delivery 2 abandons after the send of `faulted_copy` (if any) faulted
        and whose other deliveries end in a lost lock."""
        mid, copy_id = f"forged/{root}", f"retry/seq-{root}/1"
        hostile = Hostile(sim, 1)
        hostile.forged[mid] = (queue, "fence-999")
        sim.bus.send(queue, b"{}", mid, fault_free=True)
        requests.messages.pop()  # completed: carried on by its copy
        sim.bus.send(queue, b"{}", copy_id, {ORIGINAL_ID_PROPERTY: mid}, fault_free=True)
        body = json.dumps({"MessageId": copy_id}).encode()
        alerts.sent.append(Msg(f"alert/{root}", body, {}, root, sim.world.clock.now))
        for delivery in range(1, 6):
            msg = sim.bus.receivable(queue)
            assert msg is not None
            assert msg.message_id == copy_id
            assert msg.lock_token is not None
            if delivery == 2:
                if faulted_copy is not None:
                    sim.bus.copy_send_faulted(queue, faulted_copy)
                sim.bus.settle(queue, msg, msg.lock_token, "abandon")
            else:
                sim.bus.release(queue, msg, msg.lock_token, "lock lost at settlement")
        (dead,) = [m for m in requests.dead if m.message_id == copy_id]
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        sim.violations.clear()
        hostile.check()
        return [c for c, _ in sim.violations]

    assert failures(28, "retry/seq-28/2") == []
    assert failures(29, None) == ["forged message refused"]  # abandoned of its own accord
    assert failures(30, "retry/seq-31/2") == ["forged message refused"]  # another lineage's copy
    assert failures(32, "retry/seq-32/3") == ["forged message refused"]  # a later retry's copy


def test_a_bad_submission_the_broker_dead_lettered_after_every_faulted_delivery_ended_there():
    """Seed 2006810 (one order): a malformed submission's five deliveries each
    ended in a fault (crashes, a dropped link at dead-lettering, a lost lock),
    so Service Bus dead-lettered it MaxDeliveryCountExceeded with no copy
    after it. The lineage ended in the dead-letter queue, not completed as if
    valid; the same message completed with no copy still is."""
    from sim.system import INGRESS_OF

    sim = _run(1, 1)
    key = next(iter(sim.orders))
    mid = f"{key}/malformed"
    sim.bad[mid] = "malformed"
    ingress = sim.bus.queue(INGRESS_OF[sim.orders[key][0]])
    msg = Msg(mid, b"{", {}, 900, sim.world.clock.now, delivery_count=5)
    ingress.sent.append(msg)
    assert "4 bad submission dead-lettered" in _checks(sim)  # completed: taken as valid
    msg.dead_letter_reason = "MaxDeliveryCountExceeded"
    msg.dead_letter_description = "delivered 5 times"
    ingress.dead.append(msg)
    sim.bus.faulted[mid] = {1, 2, 3, 4}
    # One delivery ended unfaulted: the handler's own verdict was due.
    assert "4 bad submission dead-lettered with a reason" in _checks(sim)
    sim.bus.faulted[mid].add(5)
    checks = _checks(sim)
    assert "4 bad submission dead-lettered" not in checks
    assert "4 bad submission dead-lettered with a reason" not in checks


def test_a_schedule_is_no_fixed_point_while_no_host_can_hold_the_singleton_lock():
    """Seed 2004759 (one order): a lost lease left no Starter running until
    41 s after faults stopped, and the schedule was called done with the
    Failed status and its alert still in the outbox. The settle time counts
    from when the lock can be held again."""
    sim = _run(1, 1)
    sim.world.clock.now += timedelta(days=1)  # every deadline and write long past
    assert sim.fixed_point()
    sim.lease_free_at = sim.world.clock.now - timedelta(seconds=1)
    assert not sim.fixed_point()
    sim.lease_free_at = sim.world.clock.now - timedelta(hours=1)
    assert sim.fixed_point()


def test_a_schedule_is_no_fixed_point_until_the_starter_ran_after_an_instance_ended():
    """Seed 100036 (one order): a deferred compensation's NotBefore passed
    while its instance still ran (a stalled episode); the instance ended 66 s
    later, and the schedule was called done at that moment, before the
    Starter's next run could restart the compensation. The settle time
    counts from the last instance's end too."""
    sim = _run(1, 1)
    sim.world.clock.now += timedelta(days=1)  # every deadline and write long past
    assert sim.fixed_point()
    sim.durable.last_ended = sim.world.clock.now - timedelta(seconds=1)
    assert not sim.fixed_point()
    sim.durable.last_ended = sim.world.clock.now - timedelta(hours=1)
    assert sim.fixed_point()


def test_a_submission_the_broker_dead_lettered_after_every_faulted_delivery_owes_no_alert():
    """Seed 4004254 (two orders): a back-off copy's five deliveries each ended
    in a fault (crashes, abandons after its next copy's refused schedule), so
    Service Bus dead-lettered it MaxDeliveryCountExceeded and no handler was
    left to alert: the platform's dead-letter rule reports it. One delivery
    that ended unfaulted, or the handler's own dead letter, still owes one."""
    from adapters.settlement import ORIGINAL_ID_PROPERTY
    from sim.system import INGRESS_OF

    sim = _run(1, 1)
    oid = next(iter(sim.orders))
    app, client_id = sim.orders[oid]
    del sim.state_c.docs[(oid, oid)]  # never accepted
    sim.bus.queue("alerts").sent.clear()
    ingress = sim.bus.queue(INGRESS_OF[app])
    copy = Msg("retry/seq-10/3/seq-13.1", b"{}", {}, 900, sim.world.clock.now, delivery_count=5)
    copy.props[ORIGINAL_ID_PROPERTY] = client_id
    copy.dead_letter_reason = "MaxDeliveryCountExceeded"
    copy.dead_letter_description = "delivered 5 times"
    ingress.dead.append(copy)
    sim.bus.faulted[copy.message_id] = {1, 2, 3, 4}
    assert "dead-lettered silently" in _checks(sim)
    sim.bus.faulted[copy.message_id].add(5)
    assert "dead-lettered silently" not in _checks(sim)
    copy.dead_letter_reason = "ProcessingFailed"  # the handler's own verdict: it alerts
    assert "dead-lettered silently" in _checks(sim)


def test_a_document_a_dead_delivery_left_after_its_message_was_settled_is_an_orphan():
    """Seed 3005811: a changed resend of a Rejected order was delivered twice
    at once; one delivery dead-lettered it OrderConflict, the other wrote
    the orders DB again and its host died before taking the document back.
    Nothing comes for that document until the order is sent again (Submit
    then takes it back): not a kept order. A document whose writer finished,
    or whose message was delivered again after the write, still counts."""
    sim = _run(1, 1)
    key = sim.order_ids[0]
    doc = sim.state_c.docs[(key, key)]
    doc["ProcessState"] = "Rejected"
    sim.orders_c.docs[(key, key)] = {"id": key, "Total": "60.00"}
    queue = "orders-webshop"
    now = sim.world.clock.now
    msg = Msg("ORD-X/resend-changed", b"{}", {}, 900, now, lock_token=77)
    sim.delivery_of[77] = (f"{queue} {msg.message_id}", now)
    sim.lineage_starts[f"{queue} {msg.message_id}"] = [now]
    sim.orders_writer[key] = (77, now + timedelta(seconds=1))
    assert "rejected order not kept" in _checks(sim)  # its writer finished
    sim.unfinished.add(77)
    assert "rejected order not kept" not in _checks(sim)
    # A later delivery of that message would have taken it back: it counts.
    sim.lineage_starts[f"{queue} {msg.message_id}"].append(now + timedelta(seconds=2))
    assert "rejected order not kept" in _checks(sim)


def test_a_rejected_order_whose_every_message_the_broker_ended_owes_no_status():
    """Seed 9000535 (50 orders): the order's five deliveries met four crashes
    and a lost abandon; one wrote the Rejected record (and the orders-DB
    document was left) before its host died, and the broker dead-lettered the
    message MaxDeliveryCountExceeded. No handler finished with the order: the
    platform's dead-letter rule reports it, a resend tells the client. A
    delivery that was not ended by a fault, or a resend that completed, is
    still owed its status and its clean-up."""
    from sim.system import INGRESS_OF

    sim = _run(1, 1)
    key = sim.order_ids[0]
    _, own = sim.orders[key]
    ingress = sim.bus.queue(INGRESS_OF[sim.orders[key][0]])
    sim.state_c.docs[(key, key)]["ProcessState"] = "Rejected"
    assert (key, key) in sim.orders_c.docs
    owed = {"terminal status reaches the reply queue", "rejected order not kept"}
    assert owed <= set(_checks(sim))  # the message completed: a handler finished with it

    first = next(m for m in ingress.sent if m.message_id == own)
    first.dead_letter_reason = "MaxDeliveryCountExceeded"
    first.delivery_count = 5
    ingress.dead.append(first)
    sim.bus.faulted[own] = {1, 2, 3, 4}
    assert owed <= set(_checks(sim))  # one delivery was not ended by a fault
    sim.bus.faulted[own].add(5)
    assert not owed & set(_checks(sim))

    resend = Msg(f"{own}/resend", first.body, {}, 900, sim.world.clock.now)
    ingress.sent.append(resend)  # completed: its handler owed the status
    assert owed <= set(_checks(sim))


def test_a_document_whose_lineage_then_ended_in_dead_letters_no_handler_finished_is_an_orphan():
    """The fault surface's seed 77 (3 orders, `--target
    adapters/orders_db.py:129:cosmos_outage`): a changed resend of a Rejected
    order wrote its copy to the orders DB, and its next deliveries, 0.1 s
    apart on a full ingress queue (no back-off copy), met Cosmos out while
    taking it back, until the gate dead-lettered it RetriesExhausted with its
    alert. No handler finished with it; the order's next send takes the
    copy back (Submit's _unless_in_the_way): not a kept order. While the
    message is not so ended (completed, or dead-lettered by a handler's own
    verdict), the document still counts."""
    from sim.system import INGRESS_OF

    sim = _run(1, 1)
    key = sim.order_ids[0]
    app, own = sim.orders[key]
    sim.state_c.docs[(key, key)]["ProcessState"] = "Rejected"
    sim.orders_c.docs[(key, key)] = {"id": key, "Total": "60.00"}
    queue = INGRESS_OF[app]
    now = sim.world.clock.now
    body = next(m for m in sim.bus.queue(queue).sent if m.message_id == own).body
    msg = Msg(f"{own}/resend-changed", body, {}, 900, now, lock_token=77, delivery_count=5)
    sim.bus.queue(queue).sent.append(msg)
    lineage = f"{queue} {msg.message_id}"
    sim.delivery_of[77] = (lineage, now)
    sim.unfinished.add(77)
    sim.orders_writer[key] = (77, now + timedelta(seconds=0.01))
    sim.lineage_starts[lineage] = [now, now + timedelta(seconds=0.1)]  # delivered again after
    assert "rejected order not kept" in _checks(sim)  # completed: a handler finished with it
    msg.dead_letter_reason = "MaxDeliveryCountExceeded"
    sim.bus.queue(queue).dead.append(msg)
    sim.bus.faulted[msg.message_id] = {1, 2, 3, 4}
    assert "rejected order not kept" in _checks(sim)  # one delivery ended unfaulted
    sim.bus.faulted[msg.message_id].add(5)
    assert "rejected order not kept" not in _checks(sim)
    msg.dead_letter_reason = "OrderConflict"  # the handler's own verdict, the copy left
    assert "rejected order not kept" in _checks(sim)


def test_a_breaker_refusal_is_judged_when_the_agent_met_the_breaker_not_when_its_reply_was_sent():
    """Seed 879 (3 orders): an undo's agent made five calls to shipping, the
    last ones failing, met the breaker those failures opened, and its reply
    went out eight simulated days later (its process paused across a long
    outage). The failures are inside the breaker's window of the refusal,
    which the reply's last recorded call dates, not of the send."""
    import json

    sim = _run(1, 1)
    failed = sim.world.clock.now
    sim.remote.failures["shipping"] = [failed]
    error = "circuit open for shipping: /shipping/cancel not called again after 5 calls"
    call = {"At": (failed + timedelta(seconds=1)).isoformat(), "Ms": 200, "Outcome": "transient"}
    later = failed + timedelta(days=8)
    reply = Msg("r/reply", json.dumps({"Error": error, "Calls": [call]}).encode(), {}, 901, later)
    reply.sent_at = later
    sim.bus.queue("agent-responses").sent.append(reply)
    assert "a breaker opens only on a failing service" not in _checks(sim)

    reply.body = json.dumps({"Error": error}).encode()  # no call dates it: the send does
    assert "a breaker opens only on a failing service" in _checks(sim)
