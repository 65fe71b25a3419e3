"""A Functions app with only the Agents' blueprint, for running the trigger
as registered (triggers.agents.blueprint over the composition root) under
devstack.host."""

import azure.functions as func

import bootstrap
from triggers.agents import blueprint

app = func.FunctionApp()
app.register_functions(blueprint(bootstrap.build()))
