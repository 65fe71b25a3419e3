"""Checks a subscription and an azd environment before `azd provision`, so a
first deployment does not stop half-way (or, worse, deploy an app that can
never process an order). azure.yaml runs it as the `preprovision` hook; it
also runs alone:

    python -m deploy.preflight                 # the az CLI's subscription, the azd environment's values
    python -m deploy.preflight --stub FILE     # a subscription described in a JSON file (tests/deploy/)

It checks, in order: that az is signed in; the parameters azd will pass
(AZURE_LOCATION, AZURE_RESOURCE_GROUP, REMOTE_SERVICE_URL a public https URL,
DURABLE_BACKEND); that every Key Vault reference among them
(`@Microsoft.KeyVault(...)`, e.g. AGENT_SIGNING_KEYS) can be read and holds
usable keys; the resource providers the template deploys to, registering
the missing ones when the caller may; that at least one client application
has an identity (a service principal); each operator's principal type, read
from Microsoft Graph, written back to OPERATOR_PRINCIPAL_IDS as `id:Type`
(azd's own principal typed by AZURE_PRINCIPAL_TYPE, else by Graph, else by
`az account show`, and listed once);
that the region offers Flex Consumption (and the Durable Task Scheduler, when
chosen); and that the region's Flex memory quota leaves room for this app's
maximum scale-out. Each failure is one line, `preflight: FAIL <what>: <what
to do>`; it exits 1 when any check failed. A subscription-level read that
Azure refuses (a deployer with rights on the resource group only) is a
`preflight: WARN` line instead: that check was skipped, nothing more.

Only the standard library: it runs before any venv exists. Azure is reached
through the `Subscription` interface: `AzureCli` calls the az CLI (and
Microsoft Graph through `az rest`), `StubSubscription` reads a JSON
description, which is how `make test` exercises every failure path."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
PARAMETERS = ROOT / "infra" / "main.parameters.json"

# Resource providers of every resource type main.bicep deploys
# (tests/deploy/test_preflight.py checks the list against the templates).
PROVIDERS = (
    "Microsoft.Web",
    "Microsoft.Storage",
    "Microsoft.ServiceBus",
    "Microsoft.DocumentDB",
    "Microsoft.OperationalInsights",
    "Microsoft.Insights",
    "Microsoft.ManagedIdentity",
    "Microsoft.KeyVault",
    "Microsoft.Network",
)
SCHEDULER_PROVIDER = "Microsoft.DurableTask"
# domain.ids.SMOKE_APP_ID (the preflight imports nothing of the app: it runs
# before any venv exists; tests/deploy/test_preflight.py checks they agree).
SMOKE_APP_ID = "smoke"
BACKENDS = ("azureStorage", "durableTaskScheduler")
PRINCIPAL_TYPES = ("User", "Group", "ServicePrincipal")
GRAPH_TYPES = {
    "#microsoft.graph.user": "User",
    "#microsoft.graph.group": "Group",
    "#microsoft.graph.servicePrincipal": "ServicePrincipal",
}
# "Regional subscription memory quotas" (Flex Consumption plan hosting):
# all Flex apps of a subscription in one region share 512,000 MB by default;
# past it they stop scaling out. FLEX_MEMORY_QUOTA_MB says when yours was raised.
DEFAULT_FLEX_MEMORY_QUOTA_MB = 512_000
# main.bicep's defaults (maximumInstanceCount, instanceMemoryMB).
DEFAULT_MAX_INSTANCES = 40
DEFAULT_INSTANCE_MEMORY_MB = 2048


class NotFound(Exception):
    """The directory has no object with that id."""


class Unavailable(Exception):
    """The question could not be asked (no permission, no network, no CLI)."""


class Refused(Unavailable):
    """Azure refused the read (AuthorizationFailed): the caller lacks the right
    at that scope, e.g. holds roles on the resource group only."""


def _refused(message: str) -> bool:
    return "AuthorizationFailed" in message or "does not have authorization" in message


# App Service's Key Vault reference forms (Use Key Vault references as app
# settings): SecretUri=https://V.vault.azure.net/secrets/S[/version], or
# VaultName=V;SecretName=S[;SecretVersion=X].
_KV_REFERENCE = re.compile(r"^@Microsoft\.KeyVault\((?P<body>.*)\)$", re.DOTALL)
_SECRET_URI = re.compile(
    r"^https://(?P<vault>[A-Za-z0-9-]{3,24})\.vault\.(?P<suffix>[a-z0-9.]+)/secrets/"
    r"(?P<name>[A-Za-z0-9-]{1,127})(?:/(?P<version>[0-9a-fA-F]{32}))?/?$"
)


@dataclass(frozen=True)
class KeyVaultReference:
    vault: str
    name: str
    version: str = ""
    dns_suffix: str = "azure.net"

    @property
    def uri(self) -> str:
        tail = f"/{self.version}" if self.version else ""
        return f"https://{self.vault}.vault.{self.dns_suffix}/secrets/{self.name}{tail}"


def parse_key_vault_reference(value: str) -> KeyVaultReference | str | None:
    """None when `value` is no Key Vault reference; the reference; or, for
    a malformed one, what is wrong with it."""
    found = _KV_REFERENCE.match(value.strip())
    if found is None:
        return None if not value.strip().startswith("@Microsoft.KeyVault") else "no closing ')'"
    parts = dict(
        (k.strip(), v.strip())
        for k, _, v in (p.partition("=") for p in found.group("body").split(";") if p.strip())
    )
    if "SecretUri" in parts:
        uri = _SECRET_URI.match(parts["SecretUri"])
        if uri is None:
            return "SecretUri is not https://<vault>.vault.azure.net/secrets/<name>[/<version>]"
        return KeyVaultReference(
            uri.group("vault"), uri.group("name"), uri.group("version") or "", uri.group("suffix")
        )
    if parts.get("VaultName") and parts.get("SecretName"):
        return KeyVaultReference(
            parts["VaultName"], parts["SecretName"], parts.get("SecretVersion", "")
        )
    return "neither SecretUri nor VaultName and SecretName"


# The key settings' shape (domain/signing.py, which the preflight cannot
# import: it runs before any venv): 1-4 comma-separated base64 keys of at
# least 32 bytes each.
KEY_SETTINGS = ("AGENT_SIGNING_KEYS", "REPLY_TOKEN_KEYS")
MIN_KEY_BYTES = 32
MAX_KEYS = 4


def key_problem(text: str) -> str | None:
    """None when `text` is usable key setting text, else why not (never the key)."""
    import base64
    import binascii

    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        return "no key given"
    if len(keys) > MAX_KEYS:
        return f"{len(keys)} keys given; at most {MAX_KEYS} at once"
    for position, key in enumerate(keys, 1):
        padded = key + "=" * (-len(key) % 4)
        try:
            raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError):
            return f"key {position} is not base64"
        if len(raw) < MIN_KEY_BYTES:
            return f"key {position} has {len(raw)} bytes; at least {MIN_KEY_BYTES} are needed"
    return None


class Subscription(Protocol):
    """What the preflight asks Azure."""

    def account(self) -> dict[str, Any]:
        """The signed-in account: id (subscription), tenantId, user {name, type}."""
        ...

    def provider_states(self) -> dict[str, str]:
        """Resource provider namespace -> registrationState."""
        ...

    def register_provider(self, namespace: str) -> str:
        """Registers one; returns its new state, raises Unavailable when refused."""
        ...

    def principal_type(self, object_id: str) -> str:
        """User, Group or ServicePrincipal, from Microsoft Graph."""
        ...

    def flex_locations(self) -> list[str]:
        """Regions (names such as swedencentral) that offer Flex Consumption."""
        ...

    def scheduler_locations(self) -> list[str]:
        """Regions (display names or names) of Microsoft.DurableTask/schedulers."""
        ...

    def flex_apps(self) -> list[dict[str, Any]]:
        """The subscription's Flex Consumption apps: location, maximumInstanceCount,
        instanceMemoryMB, tags."""
        ...

    def key_vault_secret(self, reference: KeyVaultReference) -> str:
        """The secret's value; NotFound when the vault has no such secret,
        Unavailable (Refused) when it cannot be read."""
        ...


def region_key(name: str) -> str:
    return re.sub(r"[\s_-]", "", name).lower()


@dataclass
class AzureCli:
    """The az CLI as the signed-in user (`az login`)."""

    az: str = "az"
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run

    def _json(self, *args: str) -> Any:
        if shutil.which(self.az) is None:
            raise Unavailable("the Azure CLI (az) is not installed")
        done = self.run(
            [self.az, *args, "--only-show-errors", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            message = lines[-1] if lines else f"az {args[0]} failed"
            raise (Refused if _refused(done.stderr or done.stdout) else Unavailable)(message)
        return json.loads(done.stdout or "null")

    def account(self) -> dict[str, Any]:
        return self._json("account", "show")

    def provider_states(self) -> dict[str, str]:
        rows = self._json(
            "provider", "list", "--query", "[].{namespace:namespace, state:registrationState}"
        )
        return {row["namespace"]: row["state"] for row in rows}

    def register_provider(self, namespace: str) -> str:
        self._json("provider", "register", "--namespace", namespace)
        return self._json("provider", "show", "-n", namespace, "--query", "registrationState")

    def principal_type(self, object_id: str) -> str:
        url = f"https://graph.microsoft.com/v1.0/directoryObjects/{object_id}"
        try:
            found = self._json("rest", "--method", "get", "--url", url)
        except Unavailable as error:
            if "Not Found" in str(error) or "Request_ResourceNotFound" in str(error):
                raise NotFound(object_id) from error
            raise
        kind = GRAPH_TYPES.get(found.get("@odata.type", ""))
        if kind is None:
            raise Unavailable(f"directory object of type {found.get('@odata.type')!r}")
        return kind

    def flex_locations(self) -> list[str]:
        return [row["name"] for row in self._json("functionapp", "list-flexconsumption-locations")]

    def scheduler_locations(self) -> list[str]:
        types = self._json("provider", "show", "-n", SCHEDULER_PROVIDER, "--query", "resourceTypes")
        return next((t["locations"] for t in types if t["resourceType"] == "schedulers"), [])

    def flex_apps(self) -> list[dict[str, Any]]:
        sub = self.account()["id"]
        url = (
            f"https://management.azure.com/subscriptions/{sub}/providers/Microsoft.Web/sites"
            "?api-version=2024-04-01"
        )
        apps = []
        for site in self._json("rest", "--method", "get", "--url", url).get("value", []):
            scale = ((site.get("properties") or {}).get("functionAppConfig") or {}).get(
                "scaleAndConcurrency"
            )
            if scale:
                apps.append(
                    {
                        "location": site["location"],
                        "maximumInstanceCount": scale.get("maximumInstanceCount", 100),
                        "instanceMemoryMB": scale.get("instanceMemoryMB", 2048),
                        "tags": site.get("tags") or {},
                    }
                )
        return apps

    def key_vault_secret(self, reference: KeyVaultReference) -> str:
        try:
            return self._json(
                "keyvault", "secret", "show", "--id", reference.uri, "--query", "value"
            )
        except Unavailable as error:
            if "SecretNotFound" in str(error) or "was not found" in str(error):
                raise NotFound(reference.uri) from error
            if "Forbidden" in str(error) or "ForbiddenByRbac" in str(error):
                raise Refused(str(error)) from error
            raise


@dataclass
class StubSubscription:
    """A subscription described in JSON (keys as the methods' names; see
    tests/deploy/subscriptions/)."""

    data: dict[str, Any]
    registered: list[str] = field(default_factory=list)

    def _value(self, key: str) -> Any:
        if key in self.data.get("refused", {}):
            raise Refused(self.data["refused"][key])
        if key in self.data.get("unavailable", {}):
            raise Unavailable(self.data["unavailable"][key])
        return self.data[key]

    def account(self) -> dict[str, Any]:
        return self._value("account")

    def provider_states(self) -> dict[str, str]:
        return dict(self._value("providers"))

    def register_provider(self, namespace: str) -> str:
        if not self.data.get("canRegisterProviders", False):
            raise Unavailable(
                f"(AuthorizationFailed) no permission to perform "
                f"'Microsoft.Resources/subscriptions/providers/register/action' for {namespace}"
            )
        self.registered.append(namespace)
        self.data["providers"][namespace] = "Registering"
        return "Registering"

    def principal_type(self, object_id: str) -> str:
        directory = self._value("directory")
        if object_id not in directory:
            raise NotFound(object_id)
        return GRAPH_TYPES[directory[object_id]]

    def flex_locations(self) -> list[str]:
        return list(self._value("flexLocations"))

    def scheduler_locations(self) -> list[str]:
        return list(self._value("schedulerLocations"))

    def flex_apps(self) -> list[dict[str, Any]]:
        return list(self._value("flexApps"))

    def key_vault_secret(self, reference: KeyVaultReference) -> str:
        vault = self.data.get("keyVaults", {}).get(reference.vault)
        if vault is None:
            raise Unavailable(f"vault {reference.vault} not found (DNS: no such host)")
        if vault.get("refused"):
            raise Refused(
                f"(Forbidden) ForbiddenByRbac: caller may not get secrets of {reference.vault}"
            )
        if reference.name not in vault.get("secrets", {}):
            raise NotFound(reference.uri)
        return str(vault["secrets"][reference.name])


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    failed: int = 0
    warned: int = 0
    out: Callable[[str], None] = print

    def ok(self, text: str) -> None:
        self._say(f"preflight: ok   {text}")

    def warn(self, what: str, todo: str) -> None:
        self.warned += 1
        self._say(f"preflight: WARN {what}: {todo}")

    def fail(self, what: str, todo: str) -> None:
        self.failed += 1
        self._say(f"preflight: FAIL {what}: {todo}")

    def _say(self, line: str) -> None:
        self.lines.append(line)
        self.out(line)


def _is_public_https(url: str) -> str | None:
    """None when url is a public https URL, else what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme != "https":
        return f"{url!r} is not an https URL"
    host = (parts.hostname or "").lower()
    if not host:
        return f"{url!r} has no host"
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        return f"{url!r} names a local host"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None if "." in host else f"{url!r} has no domain"
    return None if address.is_global else f"{url!r} is a loopback or private address"


@dataclass(frozen=True)
class Principal:
    object_id: str
    declared: str  # '' when not given


def parse_operator_entries(value: str) -> tuple[list[Principal], list[str]]:
    """OPERATOR_PRINCIPAL_IDS entries `id` or `id:Type`, as main.bicep reads them."""
    principals, errors = [], []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        object_id, _, declared = (part.strip() for part in entry.partition(":"))
        if declared and declared not in PRINCIPAL_TYPES:
            errors.append(entry)
            continue
        principals.append(Principal(object_id, declared))
    return principals, errors


def client_applications(env: Mapping[str, str]) -> list[dict[str, str]]:
    """main.parameters.json's clientApplications with azd's ${VAR} substituted."""
    apps = json.loads(PARAMETERS.read_text())["parameters"]["clientApplications"]["value"]

    def substitute(text: str) -> str:
        return re.sub(
            r"\$\{([A-Z0-9_]+)(?:=([^}]*))?\}",
            lambda m: env.get(m.group(1)) or (m.group(2) or ""),
            text,
        )

    return [{key: substitute(value) for key, value in app.items()} for app in apps]


def run_checks(
    subscription: Subscription,
    env: Mapping[str, str],
    report: Report,
    set_env: Callable[[str, str], None],
) -> None:
    # Signed in, or nothing else can be asked.
    try:
        account = subscription.account()
    except Unavailable as error:
        report.fail("az is not signed in", f"run `az login` (and `azd auth login`) first ({error})")
        return
    report.ok(f"subscription {account.get('id')} (tenant {account.get('tenantId')})")

    # Parameters azd passes to main.bicep.
    location = (env.get("AZURE_LOCATION") or "").strip()
    if not location:
        report.fail(
            "AZURE_LOCATION is not set",
            "azd env set AZURE_LOCATION <region with Flex Consumption, e.g. swedencentral>",
        )
    if not (env.get("AZURE_RESOURCE_GROUP") or "").strip():
        report.fail(
            "AZURE_RESOURCE_GROUP is not set",
            "azd env set AZURE_RESOURCE_GROUP rg-<name> (the template is resource-group scoped; azd creates the group)",
        )
    url = (env.get("REMOTE_SERVICE_URL") or "").strip()
    if not url:
        report.fail(
            "REMOTE_SERVICE_URL is not set",
            "azd env set REMOTE_SERVICE_URL https://<the remote service the agents call>",
        )
    elif (problem := _is_public_https(url)) is not None:
        report.fail(
            f"REMOTE_SERVICE_URL {problem}",
            "set the remote service's public https URL (azd env set REMOTE_SERVICE_URL https://...)",
        )
    else:
        report.ok(f"REMOTE_SERVICE_URL {url}")
    if not (env.get("ALERT_EMAIL_ADDRESSES") or "").strip():
        report.ok(
            "note: ALERT_EMAIL_ADDRESSES is empty, so the alerts fire and reach nobody "
            "(azd env set ALERT_EMAIL_ADDRESSES ops@example.com,...)"
        )
    backend = (env.get("DURABLE_BACKEND") or "azureStorage").strip()
    if backend not in BACKENDS:
        report.fail(
            f"DURABLE_BACKEND {backend!r} is not a backend",
            "azd env set DURABLE_BACKEND azureStorage (or durableTaskScheduler)",
        )

    check_key_settings(subscription, env, report)

    # Resource providers.
    needed = [*PROVIDERS, *([SCHEDULER_PROVIDER] if backend == "durableTaskScheduler" else [])]
    try:
        states = subscription.provider_states()
    except Refused as error:
        report.warn(
            "resource providers not checked: reading them at the subscription was refused",
            f"with rights on the resource group only, ask a subscription Owner to register {', '.join(needed)} ({error})",
        )
        states = None
    except Unavailable as error:
        report.fail(
            "resource providers could not be listed", f"check `az provider list` works ({error})"
        )
        states = None
    if states is not None:
        refused = 0
        for namespace in needed:
            state = states.get(namespace, "NotRegistered")
            if state in ("Registered", "Registering"):
                continue
            try:
                new_state = subscription.register_provider(namespace)
            except Unavailable:
                refused += 1
                report.fail(
                    f"resource provider {namespace} is {state} and you may not register it",
                    f"ask a subscription Owner or Contributor to run `az provider register --namespace {namespace}`",
                )
            else:
                report.ok(f"registered resource provider {namespace} ({new_state})")
        if not refused:
            report.ok("resource providers registered: " + ", ".join(needed))

    # Client applications: at least one that can send, each a service principal.
    apps = client_applications(env)
    for app in apps:
        if app["appId"] == SMOKE_APP_ID:
            report.fail(
                f"client application {SMOKE_APP_ID!r} is the smoke application's name",
                "rename it in infra/main.parameters.json: the smoke application's orders "
                "are answered by a no-op and never reach the remote service",
            )
    with_identity = [app for app in apps if app.get("principalId")]
    if not with_identity:
        names = ", ".join(
            f"{re.sub(r'[^A-Z0-9]', '_', app['appId'].upper())}_PRINCIPAL_ID" for app in apps
        )
        report.fail(
            "no client application has an identity, so no order can be sent",
            f"azd env set one of {names} to the object id of the client's managed identity or service principal",
        )
    for app in with_identity:
        try:
            kind = subscription.principal_type(app["principalId"])
        except NotFound:
            report.fail(
                f"client {app['appId']}: no directory object {app['principalId']}",
                "use the object (principal) id of its managed identity or service principal, not its client id",
            )
            continue
        except Unavailable:
            report.ok(
                f"client {app['appId']}: {app['principalId']} (type not readable; assigned as ServicePrincipal)"
            )
            continue
        if kind != "ServicePrincipal":
            report.fail(
                f"client {app['appId']}: {app['principalId']} is a {kind}, not a service principal",
                "give the client application a managed identity or service principal and use its object id",
            )
        else:
            report.ok(f"client {app['appId']}: service principal {app['principalId']}")

    check_operators(subscription, env, report, set_env, account)

    # Region: Flex Consumption, and the scheduler when chosen.
    if location:
        try:
            flex = {region_key(r) for r in subscription.flex_locations()}
        except Refused as error:
            report.warn(
                f"region {location} not checked for Flex Consumption: the read was refused",
                f"check it in `az functionapp list-flexconsumption-locations` yourself ({error})",
            )
            flex = None
        except Unavailable as error:
            report.fail(
                "Flex Consumption regions could not be listed",
                f"run `az functionapp list-flexconsumption-locations` ({error})",
            )
            flex = None
        if flex is not None and region_key(location) not in flex:
            report.fail(
                f"region {location} does not offer Flex Consumption",
                "azd env set AZURE_LOCATION to one of `az functionapp list-flexconsumption-locations -o table`",
            )
        elif flex is not None:
            report.ok(f"region {location} offers Flex Consumption")
        if backend == "durableTaskScheduler":
            try:
                scheduler = {region_key(r) for r in subscription.scheduler_locations()}
            except Refused as error:
                report.warn(
                    f"region {location} not checked for the Durable Task Scheduler: the read was refused",
                    f"check `az provider show -n {SCHEDULER_PROVIDER}` yourself ({error})",
                )
                scheduler = None
            except Unavailable as error:
                report.fail(
                    "Durable Task Scheduler regions could not be listed",
                    f"check `az provider show -n {SCHEDULER_PROVIDER}` ({error})",
                )
                scheduler = None
            if scheduler is not None and region_key(location) not in scheduler:
                report.fail(
                    f"region {location} does not offer the Durable Task Scheduler",
                    "choose a region that offers both, or azd env set DURABLE_BACKEND azureStorage",
                )
            elif scheduler is not None:
                report.ok(f"region {location} offers the Durable Task Scheduler")

        # Flex memory quota of the region.
        quota = int(env.get("FLEX_MEMORY_QUOTA_MB") or DEFAULT_FLEX_MEMORY_QUOTA_MB)
        mine = DEFAULT_MAX_INSTANCES * DEFAULT_INSTANCE_MEMORY_MB
        try:
            others = [
                a
                for a in subscription.flex_apps()
                if region_key(a["location"]) == region_key(location)
                and (a.get("tags") or {}).get("azd-env-name") != env.get("AZURE_ENV_NAME")
            ]
        except Refused as error:
            report.warn(
                f"Flex memory quota of {location} not checked: listing the subscription's apps was refused",
                f"this app may scale to {mine} MB of the region's {quota} MB; ask a subscription "
                f"Reader what the others use ({error})",
            )
            others = None
        except Unavailable as error:
            report.fail(
                "the subscription's Flex apps could not be listed",
                f"check `az functionapp list` works ({error})",
            )
            others = None
        if others is not None:
            used = sum(a["maximumInstanceCount"] * a["instanceMemoryMB"] for a in others)
            if used + mine > quota:
                report.fail(
                    f"Flex memory quota of {location}: {len(others)} other app(s) may scale to {used} MB, "
                    f"this one to {mine} MB, the quota is {quota} MB",
                    "lower maximumInstanceCount (here or on the others), use another region, or request more "
                    "quota (then azd env set FLEX_MEMORY_QUOTA_MB <new quota>)",
                )
            else:
                report.ok(
                    f"Flex memory quota of {location}: {used + mine} of {quota} MB at full scale-out"
                )


def check_key_settings(subscription: Subscription, env: Mapping[str, str], report: Report) -> None:
    """Every Key Vault reference among the settings is read, as the app will
    read it; the key settings hold usable keys. An empty key setting is the
    template's vault (deploy/keys.py generates its secrets after provision)."""
    for setting in KEY_SETTINGS:
        if not (env.get(setting) or "").strip():
            report.ok(
                f"{setting} not set: the template's Key Vault holds it "
                "(deploy/keys.py creates it after provision when absent)"
            )
    for setting in sorted(env):
        value = env.get(setting) or ""
        reference = parse_key_vault_reference(value)
        if reference is None:
            if setting in KEY_SETTINGS and value.strip() and (problem := key_problem(value)):
                report.fail(
                    f"{setting} {problem}",
                    "leave it empty for the template's vault, or give a Key Vault reference",
                )
            continue
        if isinstance(reference, str):
            report.fail(
                f"{setting} is a malformed Key Vault reference ({reference})",
                "write @Microsoft.KeyVault(SecretUri=https://<vault>.vault.azure.net/secrets/<name>/)",
            )
            continue
        _check_reference(subscription, setting, reference, report)


def _check_reference(
    subscription: Subscription, setting: str, reference: KeyVaultReference, report: Report
) -> None:
    where = f"{setting}: the Key Vault reference to {reference.uri}"
    try:
        secret = subscription.key_vault_secret(reference)
    except NotFound:
        report.fail(
            f"{where} names a secret the vault does not hold",
            f"create secret {reference.name} in vault {reference.vault}, or leave {setting} empty "
            "for the template's vault",
        )
        return
    except Refused as error:
        report.fail(
            f"{where} cannot be read by you ({error})",
            f"to let the preflight check it, hold Key Vault Secrets User on vault {reference.vault}; "
            "the app's identity gets that role from the template (keyVaultName)",
        )
        return
    except Unavailable as error:
        report.fail(
            f"{where} cannot be read ({error})",
            f"check the vault name: az keyvault secret show --id {reference.uri}",
        )
        return
    if setting in KEY_SETTINGS and (problem := key_problem(secret)):
        report.fail(
            f"{where} does not hold usable keys ({problem})",
            "store 1-4 comma-separated base64 keys of 32 random bytes or more (ADR 017e)",
        )
        return
    report.ok(f"{setting}: Key Vault reference to {reference.vault}/{reference.name} readable")


ACCOUNT_TYPES = {"user": "User", "serviceprincipal": "ServicePrincipal"}


def check_operators(
    subscription: Subscription,
    env: Mapping[str, str],
    report: Report,
    set_env: Callable[[str, str], None],
    account: Mapping[str, Any],
) -> None:
    """Each operator with its own type, each once; azd's principal first."""
    me = (env.get("AZURE_PRINCIPAL_ID") or "").strip()
    my_declared = (env.get("AZURE_PRINCIPAL_TYPE") or "").strip()
    signed_in = ACCOUNT_TYPES.get(str((account.get("user") or {}).get("type", "")).lower(), "")
    operators, bad = parse_operator_entries(env.get("OPERATOR_PRINCIPAL_IDS") or "")
    for entry in bad:
        report.fail(
            f"OPERATOR_PRINCIPAL_IDS entry {entry!r} has an unknown type",
            "write each entry as <object id>, or <object id>:User, :Group or :ServicePrincipal",
        )
    listed: list[Principal] = []
    for who in operators:
        if who.object_id == me or any(p.object_id == who.object_id for p in listed):
            report.ok(f"operator {who.object_id} is listed twice: assigned once")
            continue
        listed.append(who)
    resolved: dict[str, str] = {}
    everyone = ([Principal(me, my_declared)] if me else []) + listed
    for index, who in enumerate(everyone):
        is_azd = bool(me) and index == 0
        kind = _operator_type(subscription, who, signed_in if is_azd else "", is_azd, report)
        if kind:
            resolved[who.object_id] = kind
    if me in resolved and resolved[me] != my_declared:
        set_env("AZURE_PRINCIPAL_TYPE", resolved[me])
        report.ok(f"AZURE_PRINCIPAL_TYPE={resolved[me]}")
    typed = ",".join(
        f"{p.object_id}:{resolved[p.object_id]}" for p in listed if p.object_id in resolved
    )
    if (
        operators
        and all(p.object_id in resolved for p in listed)
        and typed != (env.get("OPERATOR_PRINCIPAL_IDS") or "")
    ):
        set_env("OPERATOR_PRINCIPAL_IDS", typed)
        report.ok(f"OPERATOR_PRINCIPAL_IDS={typed} (types from Microsoft Graph)")


def _operator_type(
    subscription: Subscription, who: Principal, signed_in: str, is_azd: bool, report: Report
) -> str:
    """The principal's type, '' when it failed (a FAIL line said why)."""
    try:
        actual = subscription.principal_type(who.object_id)
    except NotFound:
        report.fail(
            f"operator {who.object_id} is not in the tenant's directory",
            "use the object id of the user, group or service principal (az ad user show --id <upn> --query id)",
        )
        return ""
    except Unavailable as error:
        if who.declared:
            report.ok(f"operator {who.object_id}: {who.declared} (as declared; Graph not readable)")
            return who.declared
        if signed_in:
            report.ok(
                f"operator {who.object_id}: {signed_in} (the signed-in account's type, "
                "az account show; Graph not readable)"
            )
            return signed_in
        report.fail(
            f"operator {who.object_id}: its type could not be read from Microsoft Graph ({error})",
            f"write it in OPERATOR_PRINCIPAL_IDS as {who.object_id}:User, :Group or :ServicePrincipal",
        )
        return ""
    if who.declared and who.declared != actual:
        setting = "AZURE_PRINCIPAL_TYPE" if is_azd else "OPERATOR_PRINCIPAL_IDS"
        report.fail(
            f"operator {who.object_id} is a {actual}, declared {who.declared}",
            f"correct {setting} (the role assignment would fail with UnmatchedPrincipalType)",
        )
        return ""
    report.ok(f"operator {who.object_id}: {actual}")
    return actual


def azd_env_set(name: str, value: str) -> None:
    if shutil.which("azd") is None:
        print(f"preflight: note azd is not installed; set {name}={value} yourself")
        return
    subprocess.run(["azd", "env", "set", name, value], check=True, timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stub", type=Path, help="a JSON subscription description instead of az")
    args = parser.parse_args(argv)
    report = Report()
    if args.stub:
        data = json.loads(args.stub.read_text())
        env = {k: str(v) for k, v in data.get("env", {}).items()}
        written: dict[str, str] = {}
        run_checks(StubSubscription(data), env, report, written.__setitem__)
        for name, value in written.items():
            print(f"preflight: would set {name}={value}")
    else:
        run_checks(AzureCli(), os.environ, report, azd_env_set)
    if report.failed:
        print(f"preflight: {report.failed} check(s) failed; nothing was provisioned")
        return 1
    if report.warned:
        print(f"preflight: all checks passed, {report.warned} skipped with a warning")
        return 0
    print("preflight: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
