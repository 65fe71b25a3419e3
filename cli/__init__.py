"""`python -m cli`: the client and operator tool (post orders, watch a reply
queue, inspect and repair orders, tail alerts and dead letters)."""
