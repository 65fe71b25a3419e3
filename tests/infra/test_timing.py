"""Timing on Flex Consumption: the durable group is always ready, Durable polls
its queues often, and the claim and step deadlines deployed to Azure leave
room for the plan's start-up latency (infra/README.md, "Timing on Flex").

The expected deadlines are computed here from host.json, the local template
and main.bicep's parameter defaults, independently of main.bicep's formula."""

from __future__ import annotations

import json
import re

from tests.infra.bicep_model import (
    HOST_JSON,
    INFRA,
    MAIN,
    main_defaults,
    main_timing,
    module_params,
    parse,
    template_settings,
)

API = INFRA / "app" / "api.bicep"
FLEX = INFRA / "core" / "host" / "flex-function.bicep"


def host_poll_seconds() -> int:
    storage = json.loads(HOST_JSON.read_text())["extensions"]["durableTask"]["storageProvider"]
    hours, minutes, seconds = (int(x) for x in storage["maxQueuePollingInterval"].split(":"))
    return (hours * 60 + minutes) * 60 + seconds


def expected_azure_timeouts(startup: int | None = None) -> tuple[int, int]:
    d = main_defaults()
    startup = d["flexStartupSeconds"] if startup is None else startup
    poll, margin = host_poll_seconds(), d["deadlineMarginSeconds"]
    # Claim: the orchestration start waits for a control-queue poll and a
    # work-item poll, and for one scale-out beyond the always-ready instance.
    claim = max(int(template_settings()["CLAIM_TIMEOUT_SECONDS"]), startup + 2 * poll + margin)
    # Step: agent cold start, remote work, bridge cold start, one poll for the event.
    step = max(
        int(template_settings()["STEP_TIMEOUT_SECONDS"]),
        2 * startup + d["agentWorkSeconds"] + poll + margin,
    )
    return claim, step


def test_durable_polls_its_queues_every_few_seconds():
    """The Azure Storage provider backs off up to maxQueuePollingInterval (30 s
    by default) when idle; every second of it delays an orchestration's start."""
    assert 1 <= host_poll_seconds() <= 5
    assert main_timing()["durableQueuePollingSeconds"] == host_poll_seconds()


def test_durable_group_is_always_ready():
    params = module_params(parse(MAIN), "api")
    assert params["alwaysReady"] == [
        {"name": "durable", "instanceCount": "durableAlwaysReadyInstances"}
    ]
    decorators = parse(MAIN)["parameters"]["durableAlwaysReadyInstances"]["decorators"]
    assert {"type": "min_value", "argument": 1} in decorators or {
        "type": "minValue",
        "argument": 1,
    } in decorators, decorators
    assert main_defaults()["durableAlwaysReadyInstances"] >= 1
    assert module_params(parse(API), "functionApp")["alwaysReady"] == "alwaysReady"
    scale = parse(FLEX)["resources"]["site"]["config"]["properties"]["functionAppConfig"][
        "scaleAndConcurrency"
    ]
    assert scale["alwaysReady"] == "alwaysReady"


def test_deployed_deadlines_cover_the_startup_latency():
    timing = main_timing()
    assert (
        timing["azureClaimTimeoutSeconds"],
        timing["azureStepTimeoutSeconds"],
    ) == expected_azure_timeouts()
    params = module_params(parse(MAIN), "api")
    assert params["claimTimeoutSeconds"] == "azureClaimTimeoutSeconds"
    assert params["stepTimeoutSeconds"] == "azureStepTimeoutSeconds"
    messaging = module_params(parse(MAIN), "messaging")
    assert messaging["claimTimeoutSeconds"] == "azureClaimTimeoutSeconds"
    assert messaging["stepTimeoutSeconds"] == "azureStepTimeoutSeconds"


def test_deadlines_follow_a_slower_start():
    slow = main_timing({"flexStartupSeconds": 90})
    assert (
        slow["azureClaimTimeoutSeconds"],
        slow["azureStepTimeoutSeconds"],
    ) == expected_azure_timeouts(90)
    assert slow["azureStepTimeoutSeconds"] > main_timing()["azureStepTimeoutSeconds"]


def test_deadlines_never_drop_below_the_configured_ones():
    fast = main_timing({"flexStartupSeconds": 1, "agentWorkSeconds": 1})
    assert fast["azureClaimTimeoutSeconds"] == main_defaults()["claimTimeoutSeconds"]
    assert fast["azureStepTimeoutSeconds"] == main_defaults()["stepTimeoutSeconds"]


def test_readme_states_the_timing_arithmetic():
    readme = (INFRA / "README.md").read_text()
    claim, step = expected_azure_timeouts()
    section = readme.split("## Timing on Flex", 1)[1].split("\n## ", 1)[0]
    assert f"= {claim} s" in section, (claim, step)
    assert f"= {step} s" in section, (claim, step)
    assert f"flexStartupSeconds` = {main_defaults()['flexStartupSeconds']}" in section


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_bundle_range_starts_where_orchestration_versioning_does():
    """host.json sets defaultVersion/versionMatchStrategy (orchestration
    versioning, extension bundle 4.26.0 and later); a range starting lower lets
    the platform pick a bundle that ignores them."""
    bundle = json.loads(HOST_JSON.read_text())["extensionBundle"]
    assert bundle["id"] == "Microsoft.Azure.Functions.ExtensionBundle"
    match = re.fullmatch(r"\[(\d+\.\d+\.\d+), 5\.0\.0\)", bundle["version"])
    assert match, bundle["version"]
    assert _version(match.group(1)) >= (4, 26, 0)
