"""Reading the model list is metadata, not inference: `GET /v1/models` and `/v1/models/{id}`
take nothing from a key's requests budget and are not counted in its usage, so a client
(the workbench's models page, every 2 s) may poll them; the inference routes stay limited."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelpool.config.schema import AuthConfig
from modelpool.server.auth import KeyRing
from tests.conftest import serving

SECRETS = {"APP": "sk-app", "OPS": "sk-ops"}
APP = {"Authorization": "Bearer sk-app"}
OPS = {"Authorization": "Bearer sk-ops"}


async def test_listing_models_spends_no_budget_and_counts_no_usage() -> None:
    auth: dict[str, Any] = {"keys": [
        {"name": "app", "key_env": "APP", "scopes": ["inference"], "requests_per_minute": 2},
        {"name": "ops", "key_env": "OPS", "scopes": ["admin"]},
    ]}  # fmt: skip
    keys = KeyRing.from_config(AuthConfig.model_validate(auth), SECRETS)
    async with serving({"starter_models": False, "auth": auth}, keys=keys) as (_, http):
        for _ in range(5):  # more than the limit
            listed = await http.get("/v1/models", headers=APP)
            assert listed.status_code == 200 and "x-ratelimit-remaining-requests" not in listed.headers
        assert (await http.get("/v1/models/nothing-here", headers=APP)).status_code == 404
        assert (await http.get("/v1/models", headers={"Authorization": "Bearer sk-wrong"})).status_code == 401
        report = (await http.get("/v1/admin/usage", headers=OPS)).json()["data"]
        usage = next(row for row in report if row["key"] == "app")
        assert (usage["requests"], usage["rate_limited"], usage["remaining"]["requests"]) == (0, 0, 2)

        # An inference route still takes from the budget, whatever it answers.
        body = {"model": "nothing-here", "input": "x"}
        statuses = [(await http.post("/v1/embeddings", json=body, headers=APP)).status_code for _ in range(3)]
        assert statuses == [404, 404, 429]
        assert (await http.get("/v1/models", headers=APP)).status_code == 200  # listing goes on meanwhile


async def test_a_files_metadata_is_read_freely_but_each_download_of_its_content_is_a_request(
    tmp_path: Path,
) -> None:
    auth: dict[str, Any] = {"keys": [{"name": "app", "key_env": "APP", "scopes": ["inference"],
                                      "requests_per_minute": 3}]}  # fmt: skip
    keys = KeyRing.from_config(AuthConfig.model_validate(auth), SECRETS)
    cli = {"starter_models": False, "auth": auth, "batch_api": {"dir": str(tmp_path)}}
    async with serving(cli, keys=keys) as (_, http):
        line = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
        form = {"data": {"purpose": "batch"}, "files": {"file": ("in.jsonl", line)}}
        upload = await http.post("/v1/files", **form, headers=APP)  # type: ignore[arg-type]
        assert upload.status_code == 200, upload.text  # a request: 2 left
        file_id = upload.json()["id"]
        for _ in range(5):  # metadata, as often as a client likes
            assert (await http.get(f"/v1/files/{file_id}", headers=APP)).status_code == 200
        downloads = [(await http.get(f"/v1/files/{file_id}/content", headers=APP)).status_code for _ in range(3)]
        assert downloads == [200, 200, 429]
