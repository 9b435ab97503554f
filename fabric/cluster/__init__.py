"""Many hosts: a front door (`door`) over the host agents of a Ray cluster (`host`),
placing sessions by locality (`placement`)."""
