"""A Functions app with only the Agents' blueprint, for running the trigger
as registered (agents.functions.bp) under devstack.host."""

import azure.functions as func

from agents.functions import bp

app = func.FunctionApp()
app.register_functions(bp)
