"""The order workflow orchestration's dispatcher: one instance per attempt
(instance id `{OrderID}:{Attempt}`), whose `context.version` (host.json
`defaultVersion` when it started) picks the file that runs it. One file per
version (docs/adr/018d-one-file-per-workflow-version.md):

- orchestrators/workflow_v2_4.py: 2.4, the live version, what new instances run;
- orchestrators/workflow_v2_3.py, workflow_v2_2.py, workflow_v2_1.py, workflow_v2_0.py,
  workflow_v1_1.py, workflow_v1_0.py: frozen,
  kept until no running instance needs them.

An instance without a version was started before versions existed: it runs
1.0, never the newest. Every version replays its recorded histories
unchanged (tests/fixtures/histories, tests/unit/orchestrators/test_history_corpus.py)."""

from __future__ import annotations

from orchestrators import (
    workflow_v1_0,
    workflow_v1_1,
    workflow_v2_0,
    workflow_v2_1,
    workflow_v2_2,
    workflow_v2_3,
    workflow_v2_4,
)

WORKFLOW_NAME = "order_workflow"
CURRENT_VERSION = workflow_v2_4.VERSION
# What an instance without a version runs: the code of its time, not the newest.
UNVERSIONED = "1.0"

VERSIONS = {
    module.VERSION: module.run
    for module in (
        workflow_v1_0,
        workflow_v1_1,
        workflow_v2_0,
        workflow_v2_1,
        workflow_v2_2,
        workflow_v2_3,
        workflow_v2_4,
    )
}


class UnknownWorkflowVersion(Exception):
    pass


def order_workflow(context):
    version = context.version or UNVERSIONED
    runner = VERSIONS.get(version)
    if runner is None:
        raise UnknownWorkflowVersion(
            f"instance {context.instance_id} has version {version!r}; this build knows "
            f"{', '.join(sorted(VERSIONS))}"
        )
    return (yield from runner(context))
