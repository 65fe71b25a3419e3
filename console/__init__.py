"""The operator console: server-rendered pages served by HTTP functions of the
app itself (console.functions registers them on its own blueprint)."""
