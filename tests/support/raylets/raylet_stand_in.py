"""A raylet's command line with every agent port chosen, then the real raylet run with it:
`python raylet_stand_in.py REAL_RAYLET ARGS...` (see `told_raylets`).

A port Ray leaves at 0 is one the raylet waits a fixed 15 s for its agent to choose and write
down; this picks each such port here and writes it wherever the raylet, its agents and its
workers are told it, so the raylet waits for none of them.
"""

import os
import re
import socket
import sys

# each agent port: the raylet's flag for it, then every flag that names it to agents and workers
PORTS = (
    ("--metrics-agent-port", ("--metrics-agent-port", "--grpc-port")),
    ("--metrics_export_port", ("--metrics_export_port", "--metrics-export-port")),
    ("--runtime_env_agent_port", ("--runtime_env_agent_port", "--runtime-env-agent-port")),
    ("--dashboard_agent_listen_port", ("--listen-port",)),
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def told(args: list[str]) -> list[str]:
    joined = "\n".join(args)
    for flag, names in PORTS:
        given = re.search(rf"(?:^|\s)(?:{'|'.join(names)})=([1-9][0-9]*)", joined)
        port = given.group(1) if given else str(free_port())
        args = [re.sub(rf"(^|\s)({'|'.join(names)})=0(?![0-9])", rf"\g<1>\g<2>={port}", a)
                for a in args]
        if not any(a.startswith(f"{flag}=") for a in args):
            args.append(f"{flag}={port}")
    return args


if __name__ == "__main__":
    os.execv(sys.argv[1], [sys.argv[1], *told(sys.argv[2:])])
