"""The console in Azure: App Service authentication (Entra ID) in front of
every HTTP path but the host's key-protected ones, only the operators may
sign in, and the form-token key is one generated secret shared by every
instance (review items 5 and 7; docs/console.md)."""

from __future__ import annotations

import fnmatch
import json
import re

from tests.infra.bicep_model import INFRA, MAIN, ROOT, evaluate, module_params, parse, variable

FLEX = INFRA / "core" / "host" / "flex-function.bicep"
API = INFRA / "app" / "api.bicep"


def _auth() -> dict:
    resources = parse(FLEX)["resources"]
    (auth,) = [
        r["config"]
        for r in resources.values()
        if r["type"] == "Microsoft.Web/sites/config" and r["config"].get("name") == "authsettingsV2"
    ]
    assert auth["parent"] == "site"
    return auth["properties"]


def _excluded() -> list[str]:
    assert module_params(parse(API), "functionApp")["authExcludedPaths"] == "authExcludedPaths"
    return variable(parse(API), "authExcludedPaths")


def _branches(value) -> list:
    """Both values of a `cond ? a : b`, or the value itself."""
    if isinstance(value, dict) and value.get("operator", {}).get("type") == "conditional":
        ops = value["operator"]["operands"]
        return [ops["true_value"], ops["false_value"]]
    return [value]


def test_authentication_is_on_and_required():
    auth = _auth()
    assert auth["platform"] == {"enabled": True}
    validation = auth["globalValidation"]
    assert validation["requireAuthentication"] is True
    # Never anonymous, whether or not a client id was given.
    assert set(_branches(validation["unauthenticatedClientAction"])) <= {
        "Return401",
        "RedirectToLoginPage",
    }
    assert validation["excludedPaths"] == "authExcludedPaths"
    assert auth["httpSettings"]["requireHttps"] is True


def test_operators_sign_in_with_entra_id_of_this_tenant():
    aad = _auth()["identityProviders"]["azureActiveDirectory"]
    assert aad["registration"]["clientId"] == "authClientId"
    assert (
        aad["registration"]["openIdIssuer"]
        == "${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0"
    )
    assert "clientSecretSettingName" not in aad["registration"], "no client secret is stored"
    allowed = aad["validation"]["defaultAuthorizationPolicy"]["allowedPrincipals"]
    assert allowed == {"identities": "authAllowedIdentities", "groups": "authAllowedGroups"}
    # main.bicep: the client id from azd, and the operators as the allowed principals.
    params = module_params(parse(MAIN), "api")
    assert params["consoleAuthClientId"] == "consoleAuthClientId"
    given = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert given["consoleAuthClientId"]["value"] == "${CONSOLE_AUTH_CLIENT_ID}"
    api = module_params(parse(API), "functionApp")
    assert (api["authClientId"], api["authAllowedIdentities"], api["authAllowedGroups"]) == (
        "consoleAuthClientId",
        "consoleAllowedIdentities",
        "consoleAllowedGroups",
    )
    main = parse(MAIN)
    # Each operator where its type says: groups as groups, the others as identities.
    env = {
        "principalId": "me",
        "principalType": "User",
        "operatorPrincipalIds": "ops:Group,ci:ServicePrincipal,bare",
    }
    got = (
        evaluate(params["consoleAllowedIdentities"], env, main),
        evaluate(params["consoleAllowedGroups"], env, main),
    )
    assert got == (["me", "ci", "bare"], ["ops"])


def _covered(path: str) -> bool:
    """Whether an excluded-path entry lets `path` through (a trailing /* is a prefix)."""
    return any(fnmatch.fnmatchcase(path, pattern) or path == pattern for pattern in _excluded())


def test_only_the_hosts_key_protected_endpoints_skip_sign_in():
    assert sorted(_excluded()) == ["/admin/*", "/runtime/webhooks/durabletask/*"]
    assert _covered("/runtime/webhooks/durabletask/instances/O-1:1")
    assert _covered("/admin/host/status")
    for path in (
        "/api/console",
        "/api/console/orders/O-1",
        "/api/console/orders/O-1/resubmit",
        "/api/console/static/console.css",
        "/",
        "/api/anything",
    ):
        assert not _covered(path), path


def test_the_console_is_the_apps_only_http_function():
    """excludedPaths exempts no /api path: an HTTP function added outside the
    console would need a signed-in operator too. This fails when one appears,
    so whoever adds it decides (function key via an exclusion, or sign-in)."""
    product = [
        p
        for p in ROOT.glob("**/*.py")
        if not {".venv", "tests", "devstack", "node_modules"} & set(p.relative_to(ROOT).parts)
    ]
    routes = {
        p.relative_to(ROOT).as_posix()
        for p in product
        if re.search(r"\.route\(", p.read_text(errors="replace"))
    }
    assert routes == {"triggers/console.py"}, routes
    text = (ROOT / "triggers" / "console.py").read_text()
    assert set(re.findall(r'route="([^"/{]+)', text)) == {"console"}


def test_the_form_token_key_is_one_generated_secret():
    main = parse(MAIN)
    spec = main["parameters"]["consoleCsrfSecret"]
    assert {"type": "secure"} in spec["decorators"]
    # A fresh random value, not a hash of names anyone can read (uniqueString).
    assert spec["default"] == {"function": {"type": "new_guid"}}
    assert module_params(main, "api")["consoleCsrfSecret"] == "consoleCsrfSecret"
    api = parse(API)
    assert {"type": "secure"} in api["parameters"]["consoleCsrfSecret"]["decorators"]
    assert variable(api, "baseSettings")["CONSOLE_CSRF_SECRET"] == "consoleCsrfSecret"
    # The settings object carries it into the site module: secure there too,
    # so neither module's inputs show it in the deployment history.
    assert {"type": "secure"} in parse(FLEX)["parameters"]["appSettings"]["decorators"]


def test_the_console_is_off_in_azure_until_authentication_is_confirmed():
    """Flex Consumption's preview documentation said Easy Auth was not
    supported and let unauthenticated callers through; nothing since says it
    is enforced (infra/README.md, "The console in Azure"). So the console's own
    switch, CONSOLE_AUTH_CONFIRMED, is 'false' unless the deployer sets it after
    checking, and the app (console.security.console_enabled) answers 403 until then."""
    main = parse(MAIN)
    spec = main["parameters"]["consoleAuthConfirmed"]
    assert spec["default"] == "false"
    assert {"type": "allowed", "argument": ["true", "false"]} in spec["decorators"]
    given = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert given["consoleAuthConfirmed"]["value"] == "${CONSOLE_AUTH_CONFIRMED=false}"
    assert module_params(main, "api")["consoleAuthConfirmed"] == "consoleAuthConfirmed"
    api = parse(API)
    assert variable(api, "baseSettings")["CONSOLE_AUTH_CONFIRMED"] == "consoleAuthConfirmed"
    assert {"type": "allowed", "argument": ["true", "false"]} in api["parameters"][
        "consoleAuthConfirmed"
    ]["decorators"]
    # The app reads the same name, and only an exact "true" turns the console on.
    from adapters.settings import AZURE_HINTS
    from console import security

    assert security.AUTH_CONFIRMED_SETTING == "CONSOLE_AUTH_CONFIRMED"
    azure = {AZURE_HINTS[0]: "site"}
    assert not security.console_enabled(azure)
    assert not security.console_enabled({**azure, "CONSOLE_AUTH_CONFIRMED": "false"})
    assert security.console_enabled({**azure, "CONSOLE_AUTH_CONFIRMED": "true"})
    # outside Azure too: on only in local mode (the local stack sets it)
    assert not security.console_enabled({})
    assert security.console_enabled({"CONSOLE_LOCAL_MODE": "true"})
    assert not security.console_enabled({**azure, "CONSOLE_LOCAL_MODE": "true"})
    # The README states the finding and its source.
    readme = (INFRA / "README.md").read_text()
    assert "CONSOLE_AUTH_CONFIRMED" in readme
    assert (
        "https://learn.microsoft.com/azure/azure-functions/flex-consumption-plan#considerations"
        in readme
    )
