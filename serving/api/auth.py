"""Optional bearer API keys for every app: a plain ASGI middleware (streams and client-disconnect
cancellation pass through), 401 in OpenAI's error shape, health probes exempt.

Keys are kept only as SHA-256 digests and compared with `hmac.compare_digest`, so the check takes
the same time whatever the key; no key is ever logged."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.api.errors import error_body
from serving.config import ConfigError, PlatformConfig
from serving.config.access import DEFAULT_TENANT, AuthConfig, TenantConfig
from serving.state.tenancy import Principal, current_principal

# Routes that answer without a key: probes (`llm-serving up`, Kubernetes, Serve) must see health.
EXEMPT_PATHS = frozenset({"/health"})


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class KeyRing:
    """The accepted keys, as digests, each with its tenant. No key: auth is off, and every request
    is the default tenant's."""

    digests: tuple[bytes, ...] = ()
    tenants: tuple[str, ...] = ()  # the tenant of each digest (default when shorter)
    settings: tuple[TenantConfig, ...] = ()  # what each listed tenant may do and hold

    @classmethod
    def of(cls, keys: Iterable[str], tenant: str = DEFAULT_TENANT) -> KeyRing:
        return cls.of_tenants({tenant: keys})

    @classmethod
    def of_tenants(
        cls, keys: Mapping[str, Iterable[str]], settings: Iterable[TenantConfig] = ()
    ) -> KeyRing:
        """Keys by tenant; a key of two tenants is a ConfigError (naming them, not the key)."""
        owner: dict[bytes, str] = {}
        for tenant, tenant_keys in keys.items():
            for key in dict.fromkeys(k.strip() for k in tenant_keys):
                if not key:
                    continue
                if owner.setdefault(digest(key), tenant) != tenant:
                    raise ConfigError(
                        f"auth.tenants: a key of {tenant} is also a key of "
                        f"{owner[digest(key)]}; a key belongs to one tenant"
                    )
        return cls(tuple(owner), tuple(owner.values()), tuple(settings))

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    def tenant_of(self, key: str) -> str | None:
        presented = digest(key)
        found: str | None = None
        for index, known in enumerate(self.digests):  # no early exit: timing tells no key
            if hmac.compare_digest(presented, known):
                found = self.tenants[index] if index < len(self.tenants) else DEFAULT_TENANT
        return found

    def accepts(self, key: str) -> bool:
        return self.tenant_of(key) is not None

    def principal(self, tenant: str) -> Principal:
        found = next((s for s in self.settings if s.name == tenant), None)
        return Principal(found or TenantConfig(name=tenant))


def configured_keys(auth: AuthConfig, environ: Mapping[str, str]) -> KeyRing:
    """The keys of the config and of the environment variables it names (comma-separated): those
    of auth.api_keys/api_keys_env are the default tenant's, each tenant's its own."""

    def from_env(name: str | None) -> list[str]:
        return environ.get(name, "").split(",") if name else []

    keys = {DEFAULT_TENANT: [*auth.api_keys, *from_env(auth.api_keys_env)]}
    for tenant in auth.tenants:
        if tenant.name != DEFAULT_TENANT:
            keys[tenant.name] = [*tenant.api_keys, *from_env(tenant.api_keys_env)]
    return KeyRing.of_tenants(keys, auth.tenants)


def key_ring(auth: AuthConfig) -> KeyRing:
    return configured_keys(auth, os.environ)


def check_runtime_adapter_keys(config: PlatformConfig, keys: KeyRing) -> None:
    """Runtime adapters make paths servable: never without API keys. The config's own checks
    cannot see the environment's keys: the model router checks them when it starts, and `up` and
    `apply` check them before Ray starts (the CLI has the same config and environment)."""
    allowing = [f"models[{i}]" for i, m in enumerate(config.models) if m.runtime_adapters]
    if allowing and not keys.enabled:
        raise ConfigError(
            f"{allowing[0]}.runtime_adapters needs API keys: set auth.api_keys or the variable "
            f"auth.api_keys_env names ({config.auth.api_keys_env or 'unset'}), empty here"
        )


def bearer_token(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def route_path(scope: Scope) -> str:
    """The path inside the app: Serve passes the route prefix as root_path (and in the path)."""
    path, root = scope.get("path", "/"), scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"


def unauthorized(message: str) -> JSONResponse:
    # OpenAI answers a bad key with type invalid_request_error, code invalid_api_key.
    body = error_body(message, 401, code="invalid_api_key", kind="invalid_request_error")
    return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})


class APIKeyAuth:
    """ASGI middleware: HTTP requests need `Authorization: Bearer KEY` with a key of `keys`; the
    key's tenant becomes the request's principal (serving/state/tenancy.py). With no key
    configured every request passes, as the default tenant."""

    def __init__(self, app: ASGIApp, keys: KeyRing, exempt: frozenset[str] = EXEMPT_PATHS) -> None:
        self.app = app
        self.keys = keys
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) in self.exempt:
            await self.app(scope, receive, send)
            return
        if not self.keys.enabled:
            await self.as_principal(self.keys.principal(DEFAULT_TENANT), scope, receive, send)
            return
        token = bearer_token(Headers(scope=scope))
        tenant = None if token is None else self.keys.tenant_of(token)
        if tenant is not None:
            await self.as_principal(self.keys.principal(tenant), scope, receive, send)
            return
        if token is None:
            response = unauthorized(
                "You didn't provide an API key: send it in an Authorization header using Bearer "
                "auth (Authorization: Bearer YOUR_KEY)."
            )
        else:
            response = unauthorized("Incorrect API key provided.")  # never echo the key
        await response(scope, receive, send)

    async def as_principal(
        self, principal: Principal, scope: Scope, receive: Receive, send: Send
    ) -> None:
        token = current_principal.set(principal)
        try:
            await self.app(scope, receive, send)
        finally:
            current_principal.reset(token)
