"""The operator console: server-rendered pages served by HTTP functions of the
app itself (triggers.console registers them on its own blueprint)."""
