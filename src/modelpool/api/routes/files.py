"""OpenAI's Files API (`/v1/files`): upload a batch input (JSONL), list, read, download and
delete. Each file is its key's (another key gets 404; the admin scope sees all)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse, JSONResponse

from modelpool.owner import owner_of
from modelpool.pool_api.batches import FileStorage
from modelpool.wire.contract import declared, text
from modelpool.wire.openai.batches import MAX_PAGE, ObjectId, file_json, page_json

router = APIRouter(prefix="/v1/files")
_UPLOAD_RULES = ("`file` is JSONL: one JSON object a line, within batch_api.max_lines and max_line_bytes",)


@router.post("", responses=declared((400, 413), rules=_UPLOAD_RULES))
async def upload_file(
    request: Request, file: Annotated[UploadFile, File()], purpose: Annotated[Literal["batch"], Form()]
) -> JSONResponse:
    record = await files_of(request).add(owner_of(request.scope), file.filename or "upload.jsonl", purpose, file.file)
    return JSONResponse(file_json(record))


@router.get("", responses=declared((400,)))
async def list_files(
    request: Request,
    purpose: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    after: Annotated[str | None, Query(max_length=64)] = None,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
) -> JSONResponse:
    found = files_of(request).list(owner_of(request.scope), purpose, limit, after, order)
    return JSONResponse(page_json(found, file_json))


@router.get("/{file_id}", responses=declared((400, 404)))
async def retrieve_file(file_id: ObjectId, request: Request) -> JSONResponse:
    return JSONResponse(file_json(files_of(request).get(file_id, owner_of(request.scope))))


@router.get("/{file_id}/content", response_class=FileResponse,
            responses=declared((400, 404), media={"application/octet-stream": text()}))  # fmt: skip
async def file_content(file_id: ObjectId, request: Request) -> FileResponse:
    store = files_of(request)
    record = store.get(file_id, owner_of(request.scope))
    return FileResponse(store.path(record), media_type="application/octet-stream", filename=record.filename)


@router.delete("/{file_id}", responses=declared((400, 404)))
async def delete_file(file_id: ObjectId, request: Request) -> JSONResponse:
    record = await files_of(request).delete(file_id, owner_of(request.scope))
    return JSONResponse({"id": record.id, "object": "file", "deleted": True})


def files_of(request: Request) -> FileStorage:
    store: FileStorage = request.app.state.files
    return store
