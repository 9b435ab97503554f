"""A worker process that speaks the worker wire and misbehaves on cue, for the session's tests.

    python fake_worker.py ENDPOINT STORE FAULT

It says hello and answers loads; a cell's run goes as FAULT says:
  ok       a clean cell: started, an output, done with an empty save (its ambient blob stored)
  garbage  a frame that is no message of the wire, after `started`
  die      exits with status 3 after `started`, mid-run
  silent   `started`, then nothing, ever (not even to an interrupt)
  missing  done with a save naming a blob that is not in the store
  flushing as ok, but says its state is only written (`flushing`) and waits for a file
           `flushed` beside the store before it is done
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from pathlib import Path

import zmq

from fabric import protocol
from fabric.snapshot import Store
from fabric.snapshot.commit import Report
from fabric.worker.messages import (
    TO_WORKER,
    CellOutput,
    Done,
    Exit,
    Flushing,
    Hello,
    Load,
    Loaded,
    RunCell,
    Started,
    WorkerMessage,
    decode,
)


def main(endpoint: str, store_root: str, fault: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a silent cell ignores its interrupt too
    socket = zmq.Context().socket(zmq.PAIR)
    socket.connect(endpoint)

    def send(message: WorkerMessage) -> None:
        socket.send(protocol.pack(message.to_wire()))

    send(Hello(os.getpid()))
    while True:
        message = decode(protocol.unpack(socket.recv()), TO_WORKER)
        if isinstance(message, Exit):
            return
        if isinstance(message, Load):
            send(Loaded())
        elif isinstance(message, RunCell):
            send(Started())
            run(send, socket, Store(Path(store_root)), fault)


def run(send, socket: zmq.Socket, store: Store, fault: str) -> None:
    if fault == "garbage":
        socket.send(protocol.pack({"op": "done", "status": 7}))
    elif fault == "die":
        os._exit(3)
    elif fault == "silent":
        time.sleep(3600)
    else:
        send(CellOutput({"output_type": "stream", "name": "stdout", "text": "fake\n"}))
        if fault == "flushing":
            send(Flushing())
            while not (store.root.parent / "flushed").exists():
                time.sleep(0.01)
        ambient = "0" * 32 if fault == "missing" else store.put(pickle.dumps({}))
        send(Done("ok", saved=Report(groups=[], kept=[], imports={}, refs={}, packages={},
                                     ambient=ambient, owned=[], unsaved={})))


if __name__ == "__main__":
    main(*sys.argv[1:4])
