"""Checks a subscription and an azd environment before `azd provision`, so a
first deployment does not stop half-way (or, worse, deploy an app that can
never process an order). azure.yaml runs it as the `preprovision` hook; it
also runs alone:

    python -m deploy.preflight                 # the az CLI's subscription, the azd environment's values
    python -m deploy.preflight --stub FILE     # a subscription described in a JSON file (tests/deploy/)

It checks, in order: that az is signed in; the parameters azd will pass
(AZURE_LOCATION, AZURE_RESOURCE_GROUP, REMOTE_SERVICE_URL a public https URL,
DURABLE_BACKEND); the resource providers the template deploys to, registering
the missing ones when the caller may; that at least one client application
has an identity (a service principal); each operator's principal type, read
from Microsoft Graph, written back to OPERATOR_PRINCIPAL_IDS as `id:Type`;
that the region offers Flex Consumption (and the Durable Task Scheduler, when
chosen); and that the region's Flex memory quota leaves room for this app's
maximum scale-out. Each failure is one line, `preflight: FAIL <what>: <what
to do>`; it exits 1 when any check failed.

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
)
SCHEDULER_PROVIDER = "Microsoft.DurableTask"
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
            message = (done.stderr or done.stdout).strip().splitlines()
            raise Unavailable(message[-1] if message else f"az {args[0]} failed")
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


@dataclass
class StubSubscription:
    """A subscription described in JSON (keys as the methods' names; see
    tests/deploy/subscriptions/)."""

    data: dict[str, Any]
    registered: list[str] = field(default_factory=list)

    def _value(self, key: str) -> Any:
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


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    failed: int = 0
    out: Callable[[str], None] = print

    def ok(self, text: str) -> None:
        self._say(f"preflight: ok   {text}")

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

    # Resource providers.
    needed = [*PROVIDERS, *([SCHEDULER_PROVIDER] if backend == "durableTaskScheduler" else [])]
    try:
        states = subscription.provider_states()
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

    # Operators: each principal with its own type.
    me = (env.get("AZURE_PRINCIPAL_ID") or "").strip()
    my_type = (env.get("AZURE_PRINCIPAL_TYPE") or "User").strip()
    operators, bad = parse_operator_entries(env.get("OPERATOR_PRINCIPAL_IDS") or "")
    for entry in bad:
        report.fail(
            f"OPERATOR_PRINCIPAL_IDS entry {entry!r} has an unknown type",
            "write each entry as <object id>, or <object id>:User, :Group or :ServicePrincipal",
        )
    resolved: dict[str, str] = {}
    everyone = ([Principal(me, my_type)] if me else []) + operators
    for index, who in enumerate(everyone):
        try:
            actual = subscription.principal_type(who.object_id)
        except NotFound:
            report.fail(
                f"operator {who.object_id} is not in the tenant's directory",
                "use the object id of the user, group or service principal (az ad user show --id <upn> --query id)",
            )
            continue
        except Unavailable as error:
            if who.declared:
                resolved[who.object_id] = who.declared
                report.ok(
                    f"operator {who.object_id}: {who.declared} (as declared; Graph not readable)"
                )
            else:
                report.fail(
                    f"operator {who.object_id}: its type could not be read from Microsoft Graph ({error})",
                    f"write it in OPERATOR_PRINCIPAL_IDS as {who.object_id}:User, :Group or :ServicePrincipal",
                )
            continue
        if who.declared and who.declared != actual:
            setting = "AZURE_PRINCIPAL_TYPE" if me and index == 0 else "OPERATOR_PRINCIPAL_IDS"
            report.fail(
                f"operator {who.object_id} is a {actual}, declared {who.declared}",
                f"correct {setting} (the role assignment would fail with UnmatchedPrincipalType)",
            )
            continue
        if resolved.get(who.object_id, actual) != actual:
            report.fail(
                f"operator {who.object_id} is listed with two types",
                "list it once in OPERATOR_PRINCIPAL_IDS",
            )
            continue
        resolved[who.object_id] = actual
        report.ok(f"operator {who.object_id}: {actual}")
    typed = ",".join(
        f"{p.object_id}:{resolved[p.object_id]}" for p in operators if p.object_id in resolved
    )
    if (
        operators
        and len(typed.split(",")) == len(operators)
        and typed != (env.get("OPERATOR_PRINCIPAL_IDS") or "")
    ):
        set_env("OPERATOR_PRINCIPAL_IDS", typed)
        report.ok(f"OPERATOR_PRINCIPAL_IDS={typed} (types from Microsoft Graph)")

    # Region: Flex Consumption, and the scheduler when chosen.
    if location:
        try:
            flex = {region_key(r) for r in subscription.flex_locations()}
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
    print("preflight: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
