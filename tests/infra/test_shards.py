"""infra/shards.bicep (docs/adr/020e-task-hub-shards.md): the production
profile as shardCount whole deployments of main.bicep, the count the capacity
model states, each shard told its index."""

from __future__ import annotations

import json

from bench.capacity import Model
from tests.infra.bicep_model import INFRA, MAIN, parse

SHARDS = INFRA / "shards.bicep"
SHARDS_PARAMETERS = INFRA / "shards.production.parameters.json"
PRODUCTION = INFRA / "main.production.parameters.json"


def _given(path) -> dict:
    return {k: v["value"] for k, v in json.loads(path.read_text())["parameters"].items()}


def _shard_module() -> dict:
    module = parse(SHARDS)["modules"]["shards"]
    assert module["detail"]["path"] == "main.bicep"
    return module["config"]


def test_one_deployment_of_main_per_shard_in_a_resource_group_of_its_own():
    config = _shard_module()
    loop = config["loop_type"]["detail"]
    assert loop["item_name"] == "i"
    assert loop["array_name"]["function"]["parameters"] == {"start_index": 0, "count": "shardCount"}
    params = config["config"]["params"]
    assert params["shardIndex"] == "i"
    assert params["shardCount"] == "shardCount"
    assert params["environmentName"] == "${environmentName}-s${i}"  # unique names per shard
    assert config["config"]["scope"]["operator"]["operands"] == {
        "operand_1": "shardGroups",
        "operand_2": "i",
    }
    groups = parse(SHARDS)["resources"]["shardGroups"]
    assert groups["config"]["loop_type"]["detail"]["array_name"]["function"]["parameters"] == {
        "start_index": 0,
        "count": "shardCount",
    }


def test_every_shard_is_the_production_profile_read_from_its_file():
    """Each value of main.production.parameters.json reaches every shard as
    `production.<name>.value`, so the profile has one file and cannot drift."""
    text = SHARDS.read_text()
    assert (
        "var production = loadJsonContent('main.production.parameters.json', '$.parameters')"
        in text
    )
    params = _shard_module()["config"]["params"]
    for name in _given(PRODUCTION):
        assert params.get(name) == {
            "operator": {
                "type": "property_accessor",
                "operands": {
                    "operand_1": "production",
                    "operand_2": {
                        "operator": {
                            "type": "property_accessor",
                            "operands": {"operand_1": name, "operand_2": "value"},
                        }
                    },
                },
            }
        }, f"{name} of the production profile is not passed to the shards as its file says"


def test_each_shard_has_keys_of_its_own_in_its_own_vault():
    """ADR 017e: a message copied from one shard's queues to another's does not verify there.
    Each shard is main.bicep with its default keys: Key Vault references to the secrets of
    the vault it creates and grants its app (no vault created beside keys kept elsewhere, no
    reference to a vault the app is not granted on); `python -m deploy.keys --shards` creates
    them from the output SHARD_VAULTS, one entry per shard with main.bicep's own outputs."""
    params = _shard_module()["config"]["params"]
    for name in ("agentSigningKeys", "replyTokenKeys", "keyVaultName"):
        assert name not in params
    main_outputs = parse(MAIN)["outputs"]
    output = parse(SHARDS)["outputs"]["SHARD_VAULTS"]["value"]
    assert output["loop_type"]["detail"]["array_name"]["function"]["parameters"] == {
        "start_index": 0,
        "count": "shardCount",
    }
    for name, value in output["config"].items():
        operands = value["operator"]["operands"]
        assert operands["operand_1"]["operator"]["operands"] == {
            "operand_1": "shards",
            "operand_2": "i",
        }
        assert operands["operand_2"]["operator"]["operands"] == {
            "operand_1": "outputs",
            "operand_2": name,
        }
        assert name in main_outputs
    assert set(output["config"]) == {
        "INTERNAL_VAULT_NAME",
        "INTERNAL_VAULT_ENTRIES",
        "AZURE_FUNCTION_APP_NAME",
        "AZURE_RESOURCE_GROUP",
    }


def test_the_shard_count_is_the_one_the_capacity_model_states_for_10000_orders_per_s():
    """`python -m bench.capacity --rate 10000 --profile production` prints the
    fewest shards with every component at or under 80 %: the file deploys that many."""
    assert _given(SHARDS_PARAMETERS) == {"shardCount": Model(10_000, "production").shards}


def test_one_deployment_takes_every_order_by_default():
    declared = parse(MAIN)["parameters"]
    assert declared["shardCount"]["default"] == 1
    assert declared["shardIndex"]["default"] == 0
    assert "shardCount" not in _given(INFRA / "main.parameters.json")
