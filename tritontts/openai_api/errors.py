"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tritontts.json_body import JsonBodyError

M = TypeVar("M", bound=BaseModel)
INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = INVALID_REQUEST,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        return JSONResponse(self.body(), status_code=self.status, headers=headers or None)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def unavailable(message: str, retry_after_s: int | None = None) -> ApiError:
    return ApiError(503, message, code="triton_unavailable", type=SERVER_ERROR, retry_after_s=retry_after_s)


def overloaded(message: str, retry_after_s: int, status: int = 503) -> ApiError:
    """Too much load right now: 503 when Triton's queue turned the request away, 429 when this API's own
    concurrency limit did; both say when to retry."""
    code = "rate_limit_exceeded" if status == 429 else "server_overloaded"
    return ApiError(status, message, code=code, type=SERVER_ERROR, retry_after_s=retry_after_s)


def _validation_error(error: RequestValidationError) -> ApiError:
    first = error.errors()[0] if error.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "form")]
    kind = first.get("type", "")
    if kind in ("json_invalid", "model_attributes_type", "dict_type"):
        return bad_request(
            f"the request body must be a JSON object: {first.get('msg', '')}", code="invalid_json"
        )
    param = location[0] if location else None
    if kind == "missing":
        return bad_request(f"'{param}' is required", param, code="missing_required_parameter")
    return bad_request(f"'{'.'.join(location)}': {first.get('msg', 'is invalid')}", param)


def validated(model: type[M], data: dict[str, Any]) -> M:
    """`data` as a request body `model`; a RequestValidationError (answered as a 400 naming the field) if not."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = [e | {"loc": ("body", *e.get("loc", ()))} for e in err.errors()]
        raise RequestValidationError(errors) from None


_STATUS_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(JsonBodyError)
    async def json_error(_: Request, error: JsonBodyError) -> JSONResponse:
        return bad_request(error.message, error.param, code="invalid_json").response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        return _validation_error(error).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return ApiError(
            error.status_code, str(error.detail), code=_STATUS_CODES.get(error.status_code)
        ).response()
