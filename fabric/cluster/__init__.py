"""Many hosts: a front door (`door`) over the host actors of a Ray cluster (`host`),
placing sessions by locality (`placement`, carried out by `moves`), watching its hosts
(`membership`) and calling each through its links as a host (`remote`)."""
