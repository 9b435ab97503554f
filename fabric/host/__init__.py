"""A host: the sessions it holds and everything they run on, behind one face (`face.Host`).

`face` is the face a client's request meets, one method per request; `local` is the in-process
host a single server serves (`fabric.server`); its parts, each with one job: `tenancy` (whose a
session is, and their limits), `runs` (running cells and who follows them), `upkeep` (retention
and gc) and `moves` (what a cluster's front door asks of a host).
"""
