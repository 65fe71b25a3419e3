"""In Azure the app authenticates as its user-assigned identity and nothing
else: adapters.settings.azure_credential picks ManagedIdentityCredential with
the client id infra/app/api.bicep sets (AZURE_CLIENT_ID); elsewhere it falls
back to DefaultAzureCredential for people running the CLI."""

from __future__ import annotations

import asyncio

from azure.identity.aio import DefaultAzureCredential, ManagedIdentityCredential

from adapters.settings import azure_credential, load_settings
from tests.infra.bicep_model import INFRA, parse, variable

LOCAL = {
    "CosmosDbConnection__accountEndpoint": "https://example.documents.azure.com:443/",
    "ServiceBusConnection__fullyQualifiedNamespace": "example.servicebus.windows.net",
}


def _close(credential) -> None:
    asyncio.run(credential.close())


def test_settings_read_the_client_id_the_template_sets():
    assert (
        variable(parse(INFRA / "app" / "api.bicep"), "baseSettings")["AZURE_CLIENT_ID"]
        == "identityClientId"
    )
    assert load_settings({**LOCAL, "AZURE_CLIENT_ID": "1111"}).managed_identity_client_id == "1111"
    assert load_settings(LOCAL).managed_identity_client_id is None


def test_in_azure_the_user_assigned_identity_is_used(monkeypatch):
    # What App Service and Functions set in a site with a managed identity.
    monkeypatch.setenv("IDENTITY_ENDPOINT", "http://127.0.0.1:9/msi/token")
    monkeypatch.setenv("IDENTITY_HEADER", "test-header")
    credential = azure_credential("1111")
    try:
        assert isinstance(credential, ManagedIdentityCredential)
        # The identity the token request will name; azure-identity keeps it on
        # its internal client, the only place it is visible without a request.
        assert credential._credential._client._identity_config == {"client_id": "1111"}
    finally:
        _close(credential)


def test_outside_azure_the_default_chain_is_used():
    for client_id, env in (("1111", {}), (None, {"IDENTITY_ENDPOINT": "http://x"})):
        credential = azure_credential(client_id, env)
        try:
            assert isinstance(credential, DefaultAzureCredential)
        finally:
            _close(credential)
