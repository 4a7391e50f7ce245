"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` for every failure."""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error the client should see, with the HTTP status and OpenAI error fields."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.headers = headers
        self.kind = kind  # the OpenAI `type`; None: derived from the status


def error_body(
    message: str,
    status: int,
    param: str | None = None,
    code: str | None = None,
    kind: str | None = None,
) -> dict:
    kind = kind or ERROR_TYPES.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    body = error_body(err.message, err.status, err.param, err.code, err.kind)
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def validation_error(err: RequestValidationError) -> APIError:
    """The first problem of a request body, with its field path as `param`."""
    first = err.errors()[0] if err.errors() else {"loc": (), "msg": "invalid request"}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return APIError("request body is not valid JSON", code="invalid_json")
    if first.get("type") == "extra_forbidden":
        return APIError(f"unrecognized request argument: {param}", param=param)
    where = f"{param}: " if param else ""
    return APIError(f"{where}{first.get('msg', 'invalid value')}", param=param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(err))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, err: StarletteHTTPException) -> JSONResponse:
        message = str(err.detail) if err.detail else HTTPStatus(err.status_code).phrase
        return error_response(APIError(message, status=err.status_code))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, err: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_response(APIError("internal server error", status=500, code="internal"))
