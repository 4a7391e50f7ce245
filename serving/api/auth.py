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
from serving.config.access import AuthConfig

# Routes that answer without a key: probes (`llm-serving up`, Kubernetes, Serve) must see health.
EXEMPT_PATHS = frozenset({"/health"})


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class KeyRing:
    """The accepted keys, as digests. Empty: auth is off."""

    digests: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, keys: Iterable[str]) -> KeyRing:
        return cls(tuple(digest(key) for key in dict.fromkeys(k.strip() for k in keys) if key))

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    def accepts(self, key: str) -> bool:
        presented = digest(key)
        found = False
        for known in self.digests:  # no early exit: timing does not tell which key matched
            found |= hmac.compare_digest(presented, known)
        return found


def configured_keys(auth: AuthConfig, environ: Mapping[str, str]) -> KeyRing:
    """The keys of the config plus those of its environment variable (comma-separated)."""
    from_env = environ.get(auth.api_keys_env, "") if auth.api_keys_env else ""
    return KeyRing.of([*auth.api_keys, *from_env.split(",")])


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
    """ASGI middleware: HTTP requests need `Authorization: Bearer KEY` with a key of `keys`."""

    def __init__(self, app: ASGIApp, keys: KeyRing, exempt: frozenset[str] = EXEMPT_PATHS) -> None:
        self.app = app
        self.keys = keys
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) in self.exempt:
            await self.app(scope, receive, send)
            return
        token = bearer_token(Headers(scope=scope))
        if token is None:
            response = unauthorized(
                "You didn't provide an API key: send it in an Authorization header using Bearer "
                "auth (Authorization: Bearer YOUR_KEY)."
            )
        elif not self.keys.accepts(token):
            response = unauthorized("Incorrect API key provided.")  # never echo the key
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)
