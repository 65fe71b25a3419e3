"""adapters.cosmos_client: client construction, dev-only container creation,
and the translation of SDK errors into the domain's vocabulary."""

from __future__ import annotations

import time

import pytest
from azure.core.credentials import AccessToken
from azure.cosmos.aio import CosmosClient
from azure.cosmos.exceptions import CosmosHttpResponseError

from adapters.cosmos_client import (
    STATE_COMPOSITE_INDEXES,
    RequestCharges,
    _environment_proxies,
    build_client,
    ensure_orders_container,
    ensure_state_container,
    translate_error,
)
from adapters.settings import CosmosAccount
from domain.errors import (
    ConflictError,
    NotFoundError,
    PermanentError,
    StaleError,
    TransientError,
)


async def test_containers_are_created_once_with_key_index_and_ttl(
    cosmos_client: CosmosClient, cosmos_database: str
) -> None:
    first = await ensure_state_container(cosmos_client, cosmos_database, "orderState")
    again = await ensure_state_container(cosmos_client, cosmos_database, "orderState")
    assert again.id == first.id
    props = await first.read()
    assert props["partitionKey"]["paths"] == ["/id"]
    assert props["defaultTtl"] == -1
    assert props["indexingPolicy"]["compositeIndexes"] == STATE_COMPOSITE_INDEXES

    orders = await ensure_orders_container(cosmos_client, f"{cosmos_database}-orders", "orders")
    assert (await orders.read())["partitionKey"]["paths"] == ["/id"]


@pytest.mark.parametrize("verify_tls", [True, False])
async def test_tls_verification_follows_the_setting(
    cosmos_account: CosmosAccount, verify_tls: bool
) -> None:
    # The SDK skips verification for localhost/127.0.0.1 on its own, so the
    # local server cannot show a refused certificate; check the client's policy.
    account = CosmosAccount(cosmos_account.endpoint, cosmos_account.key, verify_tls=verify_tls)
    client = build_client(account, throttle_retries=2)
    try:
        policy = client.client_connection.connection_policy
        assert policy.DisableSSLVerification is (not verify_tls)
        assert policy.RetryOptions.MaxRetryAttemptCount == 2
        assert isinstance([d async for d in client.list_databases()], list)  # it connects
    finally:
        await client.close()


async def test_the_client_resolves_the_proxy_once_not_per_request(
    cosmos_account: CosmosAccount, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy that would refuse every connection, bypassed for the local server: requests
    # still reach the server, with the transport no longer reading the environment itself.
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("no_proxy", raising=False)
    assert _environment_proxies(cosmos_account.endpoint) == {}
    client = build_client(cosmos_account)
    try:
        transport = client.client_connection.pipeline_client._pipeline._transport
        assert transport._use_env_settings is False
        assert isinstance([d async for d in client.list_databases()], list)
    finally:
        await client.close()

    monkeypatch.delenv("NO_PROXY")
    assert _environment_proxies("https://account.documents.azure.com:443/") == {
        "https": "http://127.0.0.1:9"
    }
    monkeypatch.setenv("NO_PROXY", ".documents.azure.com")
    assert _environment_proxies("https://account.documents.azure.com:443/") == {}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (404, NotFoundError),
        (409, ConflictError),
        (412, StaleError),
        (408, TransientError),
        (429, TransientError),
        (449, TransientError),
        (503, TransientError),
        (400, PermanentError),
        (401, PermanentError),
        (403, PermanentError),
        (413, PermanentError),
    ],
)
def test_sdk_errors_translate_to_the_domain_vocabulary(status: int, expected: type) -> None:
    charges = RequestCharges()
    error = translate_error(
        CosmosHttpResponseError(status_code=status, message="m"), "op", charges, "read"
    )
    assert type(error) is expected
    assert charges.by_kind["read"].failures == 1


def test_a_non_sdk_error_is_not_translated() -> None:
    with pytest.raises(TypeError):
        translate_error(ValueError("ours"), "op")


class StaticToken:
    """A token credential of our own: the local server ignores the token, so
    this shows the identity path (no key anywhere) builds a working client."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    async def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken("local-token", int(time.time()) + 3600)

    async def close(self) -> None:
        pass


async def test_an_account_without_a_key_authenticates_with_its_credential(
    cosmos_account: CosmosAccount,
) -> None:
    keyless = CosmosAccount(cosmos_account.endpoint, None, verify_tls=False)
    credential = StaticToken()
    async with build_client(keyless, credential=credential) as client:
        assert isinstance([d async for d in client.list_databases()], list)
    assert credential.scopes  # the SDK asked it for a token
