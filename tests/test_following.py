"""What a running cell's `Run` keeps for a later follower, and where its frames go."""

from __future__ import annotations

from fabric.errors import NotWaiting
from fabric.following import NO_STDIN, Run


class FakeSession:
    name = "s"

    def __init__(self, waiting: bool = False) -> None:
        self.waiting = waiting
        self.answers: list[tuple[str | None, str | None]] = []

    def answer(self, value: str | None, error: str | None) -> dict:
        if not self.waiting:
            raise NotWaiting("no cell is waiting for input")
        self.answers.append((value, error))
        self.waiting = False
        return {"answered": True}


def _stream(text: str, name: str = "stdout") -> dict:
    return {"type": "event", "event": "output",
            "output": {"output_type": "stream", "name": name, "text": text}}


def _run(limit: int = 1 << 20, session: FakeSession | None = None) -> tuple[Run, list]:
    sent: list[tuple[bytes, dict]] = []
    return Run(session or FakeSession(), lambda who, frame: sent.append((who, frame)),
               limit), sent


def _texts(sent: list, who: bytes) -> list[str]:
    return [f["output"]["text"] for w, f in sent if w == who and f.get("event") == "output"]


def test_a_follower_gets_what_was_kept_then_the_live_frames_then_the_reply() -> None:
    run, sent = _run()
    run.attach(b"a", "m1", follow=False)
    run.emit(_stream("one\n"))
    run.emit(_stream("two\n"))
    run.emit(_stream("oops\n", "stderr"))
    assert run.prune(lambda who: False)  # its client went away
    run.attach(b"b", "m9")
    run.emit(_stream("three\n"))
    assert run.finish({"type": "reply", "status": "ok"})
    assert _texts(sent, b"a") == ["one\n", "two\n", "oops\n"]
    # a stream's consecutive text is kept as one output
    assert _texts(sent, b"b") == ["one\ntwo\n", "oops\n", "three\n"]
    assert all(f["msg_id"] == "m9" for w, f in sent if w == b"b")
    assert sent[-1] == (b"b", {"type": "reply", "status": "ok", "followed": True,
                               "msg_id": "m9"})


def test_past_its_limit_the_newest_frames_are_kept_and_a_follower_is_told() -> None:
    run, sent = _run(limit=2000)
    for i in range(20):
        run.emit({**_stream(f"{i}" * 300, "stdout" if i % 2 else "stderr")})
    assert run.size <= 2000 and run.dropped > 0
    assert not run.finish({"type": "reply", "status": "ok"})  # nobody took it
    run.attach(b"late", "m2")
    notice, *outputs, reply = [f for _, f in sent]
    assert notice["event"] == "notice" and notice["topic"] == "dropped"
    assert f"{run.dropped} earlier outputs" in notice["text"]
    assert outputs[-1]["output"]["text"] == "19" * 300  # the newest, in order
    assert reply["followed"] is True


def test_input_while_nobody_follows_is_answered_as_no_stdin() -> None:
    session = FakeSession(waiting=True)
    run, sent = _run(session=session)
    run.emit({"type": "event", "event": "input_request", "prompt": "? "})
    assert session.answers == [(None, NO_STDIN)] and sent == []
    run.attach(b"a", "m1")
    assert sent == []  # an input request is never kept for a follower
    run.no_stdin()  # nothing waits: nothing to answer, no error
    assert len(session.answers) == 1
