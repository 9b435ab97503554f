"""What runs inside zygotes and workers: the cell loop, its IPython shell, the zygote fork
server, the dormant template and the cold start. Nothing here imports the server side
(`fabric.pool`, `fabric.session`, `fabric.server`): a worker loads only what a cell needs.
The server reaches this package through `control` (the zygote channel) and `wake`."""
