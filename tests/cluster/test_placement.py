"""The placement policy, as plain data: where a session's next cell runs."""

from hypothesis import given
from hypothesis import strategies as st

from fabric.cluster.placement import HostView, place
from fabric.cluster.scaling import demand


def hosts(*views: tuple[str, int, int, int]) -> list[HostView]:
    return [HostView(name, slots, running, sessions) for name, slots, running, sessions in views]


def test_a_session_stays_on_the_host_of_its_worker_while_a_lease_is_free_there() -> None:
    cluster = hosts(("a", 2, 1, 3), ("b", 2, 0, 0))
    decision = place(cluster, "a", {"b": 10 << 20})
    assert (decision.host, decision.reason) == ("a", "kept")


def test_a_full_host_gives_way_to_the_host_holding_most_of_the_closure() -> None:
    cluster = hosts(("a", 1, 1, 1), ("b", 1, 0, 0), ("c", 1, 0, 0))
    decision = place(cluster, "a", {"b": 5, "c": 9})
    assert (decision.host, decision.reason, decision.held) == ("c", "locality", 9)


def test_with_no_bytes_anywhere_the_least_loaded_host_with_a_free_lease_takes_it() -> None:
    cluster = hosts(("a", 4, 3, 2), ("b", 4, 1, 5), ("c", 1, 1, 0))
    decision = place(cluster, None, {})
    assert (decision.host, decision.reason) == ("b", "least-loaded")


def test_every_lease_held_queues_the_cell_but_a_session_may_still_open() -> None:
    cluster = hosts(("a", 1, 1, 1), ("b", 1, 1, 1))
    assert place(cluster, "a", {}).reason == "queued"
    assert place(cluster, "a", {}, lease=False).host == "a"
    assert place(cluster, None, {}, lease=False).host in ("a", "b")


def test_a_host_past_its_oversubscription_takes_no_new_session() -> None:
    cluster = hosts(("a", 1, 0, 2), ("b", 1, 1, 0))
    assert place(cluster, None, {"a": 100}, oversubscribe=2).reason == "queued"
    assert place(cluster, "a", {}, oversubscribe=2).host == "a"  # its own sessions stay


def test_a_draining_host_keeps_no_session_and_takes_none() -> None:
    cluster = [HostView("a", 2, 0, 1, draining=True), HostView("b", 2, 0, 0)]
    assert place(cluster, "a", {"a": 100}).host == "b"


views = st.builds(HostView, name=st.sampled_from("abcde"), slots=st.integers(1, 4),
                  running=st.integers(0, 6), sessions=st.integers(0, 30),
                  draining=st.booleans())


@given(st.lists(views, max_size=5, unique_by=lambda h: h.name),
       st.sampled_from([None, "a", "b", "z"]),
       st.dictionaries(st.sampled_from("abcde"), st.integers(0, 1 << 30)),
       st.integers(1, 8), st.booleans())
def test_a_decision_is_always_a_host_that_may_take_the_cell(
        cluster: list[HostView], current: str | None, held: dict[str, int],
        oversubscribe: int, lease: bool) -> None:
    decision = place(cluster, current, held, oversubscribe, lease)
    chosen = next((h for h in cluster if h.name == decision.host), None)
    if decision.host is None:
        assert not any((h.free() or not lease) and not h.draining
                       and (h.name == current or h.takes(oversubscribe)) for h in cluster)
        return
    assert chosen is not None and not chosen.draining
    assert chosen.free() or not lease
    assert chosen.name == current or chosen.takes(oversubscribe)
    if decision.reason == "locality":  # no other eligible host holds more
        assert decision.held == held[chosen.name] > 0


def test_the_autoscaler_is_asked_for_every_slot_in_use_and_each_waiting_cell() -> None:
    assert demand(running=3, waiting=0, gpus=False) == []  # nothing waits: no floor
    assert demand(running=3, waiting=2, gpus=False) == [{"llfabric_slots": 1.0}] * 5
    assert demand(running=0, waiting=1, gpus=True) == [{"GPU": 1.0}]
