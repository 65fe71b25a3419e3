"""Creates the internal-queue keys in the deployment's Key Vault when they are
absent: azure.yaml's `postprovision` hook, so the first `azd up` works with
no key given (docs/deploying.md, "The keys").

    python -m deploy.keys                  # the azd environment's vault (INTERNAL_VAULT_NAME)
    python -m deploy.keys --shards [NAME]  # every shard's vault (infra/shards.bicep's deployment)

main.bicep points AGENT_SIGNING_KEYS and REPLY_TOKEN_KEYS at the secrets
agent-signing-keys and reply-token-keys of its vault (its own, or
keyVaultName) unless they are given, and grants azd's principal Key Vault
Secrets Officer on its own vault. Each absent secret gets one new key (32
random bytes, base64url: the form domain.signing reads); a present one is left
as it is, so a second `azd up` rotates nothing (rotation: ADR 017e). A refused
read or write is retried while the new role assignment propagates (up to
--propagation seconds, each wait said). When it created a secret it restarts
the function app, which resolves its Key Vault references again at start.

Only the standard library and the az CLI (it runs before any venv exists);
the secret reaches az through a file only its owner can read, never the
command line."""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

SECRETS = ("agent-signing-keys", "reply-token-keys")
KEY_BYTES = 32
DEFAULT_PROPAGATION = 600.0


class Refused(Exception):
    """The vault refused the caller (a role assignment not yet in effect)."""


class Failed(Exception):
    """Anything else az reported."""


class Vault(Protocol):
    def has(self, name: str) -> bool: ...

    def create(self, name: str, value: str) -> None: ...


def new_key() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode().rstrip("=")


@dataclass
class AzVault:
    """One vault through the az CLI, as the signed-in deployer."""

    name: str
    az: str = "az"
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run

    def _az(self, *args: str) -> str:
        if shutil.which(self.az) is None:
            raise Failed("the Azure CLI (az) is not installed")
        done = self.run(
            [self.az, *args, "--only-show-errors", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode == 0:
            return done.stdout
        text = (done.stderr or done.stdout).strip()
        if "SecretNotFound" in text:
            raise LookupError(text)
        if "Forbidden" in text or "AuthorizationFailed" in text:
            raise Refused(text.splitlines()[-1])
        raise Failed(text.splitlines()[-1] if text else f"az {args[0]} failed")

    def has(self, name: str) -> bool:
        try:
            self._az("keyvault", "secret", "show", "--vault-name", self.name, "--name", name)
        except LookupError:
            return False
        return True

    def create(self, name: str, value: str) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "value")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(value)
            self._az(
                "keyvault", "secret", "set", "--vault-name", self.name, "--name", name,
                "--file", path, "--encoding", "utf-8", "--content-type", "internal-queue-keys",
            )  # fmt: skip


@dataclass
class Keys:
    vault: Vault
    say: Callable[[str], None] = print
    propagation: float = DEFAULT_PROPAGATION
    pause: float = 15.0
    sleep: Callable[[float], None] = time.sleep
    started: float = field(default_factory=time.monotonic)

    def ensure(self, names: tuple[str, ...] | list[str] = SECRETS) -> list[str]:
        """Creates each absent secret; returns the names it created."""
        created = []
        for name in names:
            if self._allowed(f"reading {name}", partial(self.vault.has, name)):
                self.say(f"keys: {name} present, left as it is")
                continue
            self._allowed(f"creating {name}", partial(self.vault.create, name, new_key()))
            self.say(f"keys: {name} created (one new key)")
            created.append(name)
        return created

    def _allowed(self, what: str, action: Callable[[], object]) -> object:
        while True:
            try:
                return action()
            except Refused as error:
                waited = time.monotonic() - self.started
                if waited >= self.propagation:
                    raise Refused(f"{what} still refused after {waited:.0f} s: {error}") from None
                self.say(
                    f"keys: waiting for Key Vault Secrets Officer to propagate ({what} refused "
                    f"after {waited:.0f} s; Azure RBAC takes up to {self.propagation:.0f} s)"
                )
                self.sleep(self.pause)


def restart_app(env: Mapping[str, str], say: Callable[[str], None]) -> None:
    name, group = env.get("AZURE_FUNCTION_APP_NAME"), env.get("AZURE_RESOURCE_GROUP")
    if not name or not group or shutil.which("az") is None:
        say("keys: restart the function app yourself so it reads the new keys")
        return
    done = subprocess.run(
        ["az", "functionapp", "restart", "-g", group, "-n", name, "--only-show-errors"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode == 0:
        say(f"keys: restarted {name}, which resolves its Key Vault references at start")
    else:
        say(f"keys: restart {name} yourself ({done.stderr.strip()})")


def main(
    argv: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--propagation", type=float, default=DEFAULT_PROPAGATION)
    parser.add_argument(
        "--shards",
        metavar="DEPLOYMENT",
        nargs="?",
        const="shards",
        help="every shard of infra/shards.bicep's subscription deployment (default name: shards)",
    )
    args = parser.parse_args(argv)
    if args.shards:
        try:
            shards = shard_environments(args.shards, run)
        except Failed as error:
            print(f"keys: FAIL deployment {args.shards}: {error}")
            return 1
        failed = [i for i, shard in enumerate(shards) if _one(shard, args.propagation) != 0]
        if failed:
            print(f"keys: FAIL shards {', '.join(map(str, failed))}; run the command again")
        return 1 if failed else 0
    return _one(_azd_env() if env is None else env, args.propagation)


def shard_environments(
    deployment: str, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> list[dict[str, str]]:
    """Each shard's vault, keys and app: the output SHARD_VAULTS of
    infra/shards.bicep's subscription deployment."""
    if shutil.which("az") is None:
        raise Failed("the Azure CLI (az) is not installed")
    done = run(
        ["az", "deployment", "sub", "show", "--name", deployment, "--query",
         "properties.outputs.SHARD_VAULTS.value", "--only-show-errors", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise Failed((done.stderr or done.stdout).strip() or "az deployment sub show failed")
    shards = json.loads(done.stdout or "null")
    if not isinstance(shards, list) or not shards:
        raise Failed("no output SHARD_VAULTS: is it a deployment of infra/shards.bicep?")
    return shards


def _one(env: Mapping[str, str], propagation: float) -> int:
    vault = env.get("INTERNAL_VAULT_NAME")
    if not vault:
        print("keys: FAIL INTERNAL_VAULT_NAME is not set: run after `azd provision`")
        return 1
    names = [n for n in (env.get("INTERNAL_VAULT_ENTRIES") or ",".join(SECRETS)).split(",") if n]
    try:
        created = Keys(AzVault(vault), propagation=propagation).ensure(names)
    except (Refused, Failed) as error:
        print(f"keys: FAIL vault {vault}: {error}")
        print(
            "keys: the deployer needs Key Vault Secrets Officer on the vault (main.bicep grants "
            "it to AZURE_PRINCIPAL_ID on its own vault; an existing vault's owner grants it)"
        )
        return 1
    if created:
        restart_app(env, print)
    return 0


def _azd_env() -> dict[str, str]:
    env = dict(os.environ)
    if "INTERNAL_VAULT_NAME" not in env and shutil.which("azd"):
        done = subprocess.run(
            ["azd", "env", "get-values", "--output", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode == 0:
            env = {**json.loads(done.stdout), **env}
    return env


if __name__ == "__main__":
    sys.exit(main())
