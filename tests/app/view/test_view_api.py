"""glassllm view's API functions (no server) and its HTTP surface (a real server, no browser)."""

import http.client
import importlib
import io
import json
import os
import pathlib
import re
import shutil
import threading

import numpy as np
import pytest
from view_helpers import make_run

import glassllm
from glassllm.app.config import SampleConfig
from glassllm.app.sample import EXPLAIN_TOP, SampleJob, TokenChoice, format_choice
from glassllm.app.view import api, make_server
from glassllm.app.view.fields import ApiError
from glassllm.app.view.run import Run
from glassllm.models.inspect import LENS_TOP


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("view") / "out")


@pytest.fixture(scope="module")
def run(out_dir):
    return Run(out_dir)


def error_of(fn, *args):
    with pytest.raises(ApiError) as info:
        fn(*args)
    return info.value.status, info.value.message


# ---------------------------------------------------------------------- sampling


@pytest.mark.parametrize("top_k", [None, 5])
def test_generate_prints_what_glassllm_sample_explain_prints(run, out_dir, top_k):
    options = dict(max_new_tokens=40, temperature=0.9, top_k=top_k, seed=7)
    answer = api.generate(run, {"prompt": "def ", **options})
    out = io.StringIO()
    config = SampleConfig(
        checkpoint=str(out_dir / "ckpt.safetensors"),
        prompt="def ",
        num_samples=1,
        explain=True,
        **options,
    )
    job = SampleJob.prepare(config)
    texts = job.run(out)
    explain_line = re.compile(r"^ {0,4}\d+  .*\d%  \| ")  # format_choice's, not sample text
    expected = [line for line in out.getvalue().splitlines() if explain_line.match(line)]
    mine = [
        format_choice(
            TokenChoice(t["step"], t["repr"], t["p"], [(a["repr"], a["p"]) for a in t["top"]])
        )
        for t in answer["tokens"]
    ]
    assert mine == expected
    assert "".join(t["text"] for t in answer["prompt"] + answer["tokens"]) == texts[0]
    assert "--explain" in answer["command"] and "--num-samples 1" in answer["command"]


def test_alternatives_are_the_sampled_distribution(run):
    answer = api.generate(run, {"prompt": "def ", "max_new_tokens": 20, "top_k": 3, "seed": 3})
    for token in answer["tokens"]:
        ps = [a["p"] for a in token["top"]]
        assert 1 <= len(ps) <= 3 and ps == sorted(ps, reverse=True)
        assert sum(ps) == pytest.approx(1.0, abs=1e-5)  # top-k 3: the whole distribution
        assert token["id"] in [a["id"] for a in token["top"]]
        assert token["p"] == next(a["p"] for a in token["top"] if a["id"] == token["id"])


def test_branch_continues_from_ids(run):
    first = api.generate(run, {"prompt": "def ", "max_new_tokens": 10, "seed": 1})
    prefix = [t["id"] for t in first["prompt"] + first["tokens"][:5]]
    alternative = first["tokens"][5]["top"][-1]["id"]
    branch = api.generate(run, {"ids": prefix + [alternative], "max_new_tokens": 10, "seed": 1})
    assert [t["id"] for t in branch["prompt"]] == prefix + [alternative]
    assert len(branch["tokens"]) == 10 and "command" not in branch


def test_distribution_is_the_models_next_token_logits(run):
    ids = run.tokenizer.encode("class Box1:")
    answer = api.distribution(run, {"ids": ids})
    with glassllm.no_grad():
        logits = run.model(np.array([ids]))[0].data[0, -1]
    np.testing.assert_allclose(answer["logits"], logits, atol=1e-6)
    long = api.distribution(run, {"ids": ids * 5})
    assert long["cropped"] is True


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"prompt": ""}, "the prompt is empty"),
        ({"prompt": "日本"}, "cannot be encoded"),
        ({"prompt": "def ", "max_new_tokens": 501}, "max_new_tokens must be between 0 and 500"),
        ({"prompt": "def ", "max_new_tokens": "5"}, "max_new_tokens must be an integer"),
        ({"prompt": "def ", "temperature": 0}, "temperature must be between"),
        ({"prompt": "def ", "temperature": "nan"}, "temperature must be a number"),
        ({"prompt": "def ", "temperature": 1e308 * 10}, "finite"),
        ({"prompt": "def ", "top_k": 0}, "top_k must be between 1"),
        ({"prompt": "def ", "seed": -1}, "seed must be between 0"),
        ({"ids": [0, 10_000]}, "token ids in [0,"),
        ({"ids": []}, "non-empty list"),
        ({"ids": [True]}, "token ids"),
        ({"prompt": 5}, "prompt must be a string"),
    ],
)
def test_generate_rejects_bad_fields(run, body, fragment):
    status, message = error_of(api.generate, run, body)
    assert status == 400 and fragment in message


# ---------------------------------------------------------------------- inside the model


def test_inspect_is_the_forward_with_causal_attention(run):
    answer = api.inspect(run, {"prompt": "def f1(x, y):\n    return"})
    steps = len(answer["tokens"])
    assert answer["logits_diff"] == 0.0 and answer["attention_check"] < 1e-6
    assert answer["cropped"] is False and answer["n_layer"] == 2 and answer["n_head"] == 2
    attention = np.array(answer["attention"])
    assert attention.shape == (2, 2, steps, steps)
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-5)
    assert np.all(attention[..., np.triu(np.ones((steps, steps), dtype=bool), 1)] == 0)
    assert answer["lens"]["rows"] == ["embed", "block 0", "block 1"]
    assert np.array(answer["lens"]["top_ids"]).shape == (3, steps, 5)
    assert np.array(answer["lens"]["p_next"]).shape == (3, steps - 1)
    # The last lens row is the model's own prediction.
    dist = api.distribution(run, {"ids": [t["id"] for t in answer["tokens"]]})
    assert answer["lens"]["top_ids"][-1][-1][0] == int(np.argmax(dist["logits"]))
    assert np.array(answer["mlp"]["top_units"]).shape == (2, steps, 8)
    assert all(0 <= f <= 1 for f in answer["mlp"]["active_fraction"])
    assert "attention.py" in answer["sources"]["attention"]


def test_inspect_crops_to_block_size_and_serves_layers_and_neurons(run):
    text = "def f1(x, y):\n    return x * 1 + y  # line 1\n"
    answer = api.inspect(run, {"prompt": text})
    assert answer["cropped"] is True and len(answer["tokens"]) == 32
    ids = [t["id"] for t in answer["tokens"]]
    seen = run.inspection(ids)
    layer = api.attention(run, {"ids": ids, "layer": 1})
    np.testing.assert_allclose(layer["heads"], seen.attention[1], atol=1e-6)
    unit = api.neuron(run, {"ids": ids, "layer": 0, "index": 17})
    np.testing.assert_allclose(unit["values"], seen.mlp[0, :, 17], atol=1e-5)
    assert error_of(api.attention, run, {"ids": ids, "layer": 2})[0] == 400
    assert error_of(api.neuron, run, {"ids": ids, "layer": 0, "index": 128})[0] == 400
    assert error_of(api.attention, run, {"ids": ids * 2, "layer": 0})[0] == 400


# ---------------------------------------------------------------------- run, logs, graph


def test_info_and_log(run, out_dir):
    info = api.info(run, {})
    assert info["checkpoint"]["iteration"] == 60
    assert len(info["checkpoint"]["vocab"]) == run.model.config.vocab_size
    brief = api.info(run, {"brief": "1"})
    assert (
        "vocab" not in brief["checkpoint"]
        and brief["checkpoint"]["stamp"] == info["checkpoint"]["stamp"]
    )
    everything = api.log(run, {})
    assert [e["iter"] for e in everything["evals"]] == [0, 20, 40, 60]
    # every 2nd step, the steps after evaluations (1, 21, 41) with histograms, and the last
    # evaluation's (60) histograms on a line of their own
    assert len(everything["stats"]) == 30 + 3 + 1
    assert set(everything["stats"][-1]) == {"iter", "hist"}
    assert [e["iter"] for e in api.log(run, {"since": "20"})["evals"]] == [40, 60]
    assert error_of(api.log, run, {"since": "x"})[0] == 400


def test_garbled_log_lines_are_skipped_and_new_ones_appear(tmp_path, out_dir):
    extra = '{"iter": 80, "train_loss": 1.0, "val_loss": 1.1}\n{"iter": 9'
    (tmp_path / "log.jsonl").write_text((out_dir / "log.jsonl").read_text() + extra)
    run = Run(tmp_path)  # a log and no checkpoint: dashboard only
    assert [e["iter"] for e in api.log(run, {})["evals"]] == [0, 20, 40, 60, 80]
    assert api.info(run, {})["checkpoint"] is None
    status, message = error_of(api.generate, run, {"prompt": "def "})
    assert status == 409 and "no checkpoint yet" in message


def test_checkpoint_is_reloaded_when_its_file_changes(tmp_path):
    out = make_run(tmp_path / "out", steps=4, eval_interval=2)
    run = Run(out)
    assert api.info(run, {})["checkpoint"]["iteration"] == 4
    first = api.generate(run, {"prompt": "def ", "max_new_tokens": 5})
    make_run(out, steps=6, eval_interval=2, resume=True)  # the run goes on: an atomic save
    assert api.info(run, {})["checkpoint"]["iteration"] == 6
    assert api.generate(run, {"prompt": "def ", "max_new_tokens": 5}) != first
    (out / "ckpt.safetensors").write_bytes(b"not a checkpoint")
    info = api.info(run, {})
    assert info["checkpoint"]["iteration"] == 6 and "ckpt.safetensors" in info["reload_error"]


def test_a_checkpoint_replaced_while_it_is_read_is_read_again(tmp_path, monkeypatch):
    from glassllm.app.view import run as run_module
    from glassllm.checkpoint import CheckpointError

    out = make_run(tmp_path / "out", steps=4, eval_interval=2)
    newer = make_run(tmp_path / "newer", steps=6, eval_interval=2, seed=5)
    run = Run(out)
    shutil.copy(out / "ckpt.safetensors", tmp_path / "copy")
    real, calls = run_module.SavedRun.read, []

    def racing(path):
        calls.append(path)
        if len(calls) == 1:  # the trainer's atomic save lands in the middle of this read
            os.replace(newer / "ckpt.safetensors", path)
            raise CheckpointError(f"{path} is not a readable safetensors checkpoint (truncated)")
        return real(path)

    monkeypatch.setattr(run_module.SavedRun, "read", racing)
    os.replace(tmp_path / "copy", out / "ckpt.safetensors")  # a save: the file changed
    with run.lock:
        run.refresh()
    assert len(calls) == 2 and run.reload_error is None
    assert run.metadata["iteration"] == 6
    with run.lock:
        run.refresh()  # unchanged since: not read again
    assert len(calls) == 2


def test_an_atomic_save_of_the_same_size_and_time_is_seen(tmp_path):
    """A save is a rename of a new file: a new inode, even where the clock is too coarse to
    change the modification time and the size stays the same."""
    out = make_run(tmp_path / "out", steps=2, eval_interval=2)
    run = Run(out)
    loaded = run.model
    checkpoint = out / "ckpt.safetensors"
    before = checkpoint.stat()
    shutil.copy(checkpoint, tmp_path / "saved")
    os.utime(tmp_path / "saved", ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(tmp_path / "saved", checkpoint)
    after = checkpoint.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert after.st_ino != before.st_ino
    with run.lock:
        run.refresh()
    assert run.model is not loaded and run.reload_error is None


def test_startup_errors(tmp_path):
    with pytest.raises(ValueError, match=r"no checkpoint or log in .* \(train first"):
        Run(tmp_path)
    (tmp_path / "ckpt.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="safetensors|checkpoint"):
        Run(tmp_path)


def test_graph_endpoints(run):
    names = [e["name"] for e in api.graph_examples(run, {})["examples"]]
    assert names == ["neuron", "cross_entropy", "layer_norm", "attention"]
    answer = api.graph(run, {"example": "neuron", "inputs": {"x2": 1.0}})
    w2 = next(n for n in answer["nodes"] if n["label"] == "w2")
    assert w2["grad"] != 0.0
    assert error_of(api.graph, run, {"example": "os.system"})[0] == 400
    assert error_of(api.graph, run, {"example": "neuron", "inputs": {"b": None}})[0] == 400
    assert error_of(api.graph, run, {"example": "neuron", "inputs": [1]})[0] == 400


# ---------------------------------------------------------------------- HTTP


@pytest.fixture(scope="module")
def server(out_dir):
    server = make_server(out_dir, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def request(server, method, path, body=None, headers=None, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    all_headers = {"Host": f"127.0.0.1:{server.port}"}
    if body is not None:
        raw = json.dumps(body).encode()
        all_headers["Content-Type"] = "application/json"
    all_headers.update(headers or {})
    conn.request(method, path, body=raw, headers=all_headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response, data


def test_static_files_by_allow_list_only(server):
    response, data = request(server, "GET", "/")
    assert response.status == 200 and b'<script type="module" src="/main.js">' in data
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert not any(h.lower().startswith("access-control") for h in response.headers)
    assert b"<script>" not in data and b"style=" not in data  # nothing inline
    for path in [
        "/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/static/../run.py",
        "/api.py",
        "/server.py",
        "//etc/passwd",
        "/main.js/..",
        "/api/log/../../x",
    ]:
        response, data = request(server, "GET", path)
        assert response.status == 404, path
        assert "error" in json.loads(data)
    response, data = request(server, "GET", "/api/log?path=/etc/passwd")
    assert response.status == 200 and set(json.loads(data)) == {"evals", "stats"}


def test_post_checks(server):
    ok, data = request(server, "POST", "/api/generate", {"prompt": "def ", "max_new_tokens": 3})
    assert ok.status == 200 and len(json.loads(data)["tokens"]) == 3
    cases = [
        (dict(raw=b'{"prompt": "a"}', headers={"Content-Type": "text/plain"}), 415),
        (dict(raw=b"[1, 2]", headers={"Content-Type": "application/json"}), 400),
        (dict(raw=b"{nope", headers={"Content-Type": "application/json"}), 400),
        (
            dict(
                raw=b'{"prompt": "def ", "temperature": NaN}',
                headers={"Content-Type": "application/json"},
            ),
            400,
        ),
        (
            dict(
                raw=json.dumps({"prompt": "x" * 100_000}).encode(),
                headers={"Content-Type": "application/json"},
            ),
            413,
        ),
        (dict(body={"prompt": "def "}, headers={"Origin": "http://evil.example"}), 403),
        (dict(body={"prompt": "def "}, headers={"Host": "evil.example"}), 403),
        (dict(body={"prompt": "def "}, headers={"Sec-Fetch-Site": "cross-site"}), 403),
    ]
    for kwargs, status in cases:
        response, data = request(server, "POST", "/api/generate", **kwargs)
        assert response.status == status, (kwargs, data)
        assert json.loads(data)["error"]
    same_origin = {"Origin": f"http://127.0.0.1:{server.port}"}
    response, _ = request(server, "POST", "/api/generate", {"prompt": "a"}, headers=same_origin)
    assert response.status == 200
    response, data = request(server, "GET", "/api/generate")
    assert response.status == 405
    response, data = request(server, "OPTIONS", "/api/generate")
    assert response.status == 405 and "Access-Control-Allow-Origin" not in response.headers
    response, data = request(server, "GET", "/api/nothing")
    assert response.status == 404 and json.loads(data)["error"]


def test_a_bug_is_a_500_and_the_server_keeps_serving(server, monkeypatch, capsys):
    def broken(_run, _request):
        raise KeyError("boom")

    monkeypatch.setitem(api.ROUTES, ("GET", "/api/info"), (broken, False))
    response, data = request(server, "GET", "/api/info")
    assert response.status == 500
    assert json.loads(data) == {"error": "internal error (see the terminal)"}
    assert "KeyError: 'boom'" in capsys.readouterr().err
    monkeypatch.undo()
    response, _ = request(server, "GET", "/api/info")
    assert response.status == 200


def test_port_in_use_and_host_warning(server, out_dir):
    with pytest.raises(ValueError, match=f"port {server.port} is in use; pass --port 0"):
        make_server(out_dir, port=server.port)


def test_host_header_rules(out_dir):
    loopback = make_server(out_dir, port=0)
    try:
        port = loopback.port
        assert loopback.host_allowed(f"127.0.0.1:{port}")
        assert loopback.host_allowed(f"localhost:{port}")
        assert not loopback.host_allowed(f"192.168.1.5:{port}")
        assert not loopback.host_allowed(f"evil.example:{port}")
        assert not loopback.host_allowed("127.0.0.1:1")
        assert not loopback.host_allowed("")
    finally:
        loopback.server_close()
    anywhere = make_server(out_dir, host="0.0.0.0", port=0)
    try:
        port = anywhere.port
        assert anywhere.host_allowed(f"192.168.1.5:{port}")
        assert anywhere.host_allowed(f"[fe80::1]:{port}")
        assert not anywhere.host_allowed(f"evil.example:{port}")  # a rebinding name
        assert not anywhere.host_allowed("192.168.1.5:1")
        assert anywhere.url == f"http://127.0.0.1:{port}/"
    finally:
        anywhere.server_close()


def test_a_browser_opens_only_with_a_display(monkeypatch):
    from glassllm.app.view import server as view_server

    monkeypatch.setattr(view_server.sys, "platform", "linux")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert view_server.has_display() is False
    monkeypatch.setenv("DISPLAY", ":0")
    assert view_server.has_display() is True


# ---------------------------------------------------------------------- hostile values

HOSTILE = [
    10**400,
    -(10**400),
    10**4000,
    1e308,
    -1e308,
    [],
    {},
    "x",
    None,
    True,
    [[[1.0]]],
    [10**400],
    {"a": 1},
]


@pytest.mark.parametrize(
    "endpoint, base, fields",
    [
        (
            api.generate,
            {"prompt": "def ", "max_new_tokens": 1},
            ["prompt", "ids", "max_new_tokens", "temperature", "top_k", "seed"],
        ),
        (api.distribution, {"prompt": "def "}, ["prompt", "ids"]),
        (api.attention, {"ids": [1, 2], "layer": 0}, ["ids", "layer"]),
        (api.neuron, {"ids": [1, 2], "layer": 0, "index": 0}, ["ids", "layer", "index"]),
    ],
)
def test_any_json_value_in_any_field_is_an_answer_or_a_400(run, endpoint, base, fields):
    for field in fields:
        for value in HOSTILE:
            try:
                endpoint(run, {**base, field: value})
            except ApiError as err:
                assert err.status == 400 and len(err.message) < 300, (field, value, err.message)


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_graph_inputs_of_any_json_value_are_an_answer_or_a_400(run, value):
    for name in ("x1", "b"):
        try:
            api.graph(run, {"example": "neuron", "inputs": {name: value}})
        except ApiError as err:
            assert err.status == 400 and name in err.message and len(err.message) < 300


def test_a_huge_integer_is_a_400_naming_the_field(run):
    status, message = error_of(api.generate, run, {"prompt": "def ", "temperature": 10**400})
    assert status == 400 and "temperature" in message
    status, message = error_of(
        api.graph, run, {"example": "layer_norm", "inputs": {"x": [1, 2, 3, 10**400]}}
    )
    assert status == 400 and "'x'" in message


def test_deeply_nested_json_is_a_400(server):
    raw = b'{"prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    response, data = request(
        server, "POST", "/api/generate", raw=raw, headers={"Content-Type": "application/json"}
    )
    assert response.status == 400 and "JSON" in json.loads(data)["error"]


# ---------------------------------------------------------------------- real models' sizes

HF_TINY = __import__("pathlib").Path(__file__).resolve().parents[2] / "fixtures" / "hf_gpt2_tiny"


def test_a_gpt2_directory_is_inspected_and_sampled(tmp_path):
    from conftest import optional

    from glassllm.models.inspect import inspect as inspect_model

    optional("tokenizers")
    run = Run(tmp_path, checkpoint=HF_TINY)
    vocab = run.model.config.vocab_size
    assert len(api.info(run, {})["checkpoint"]["vocab"]) == vocab
    answer = api.generate(
        run, {"prompt": "Hello world", "max_new_tokens": 6, "seed": 3, "top_k": 5}
    )
    assert len(answer["tokens"]) == 6
    for token in answer["tokens"]:
        assert token["id"] in [a["id"] for a in token["top"]]
        for choice in token["top"]:
            assert choice["repr"] == run.tokenizer.token_repr(choice["id"])
    seen = api.inspect(run, {"prompt": "Hello world, hello there"})
    ids = [t["id"] for t in seen["tokens"]]
    assert seen["logits_diff"] < 1e-5
    full = inspect_model(run.model, ids, full_lens=True).lens.full  # (L + 1, T, V)
    expected = np.argsort(-full, axis=-1, kind="stable")[..., :LENS_TOP]
    assert np.array_equal(seen["lens"]["top_ids"], expected)
    np.testing.assert_allclose(
        seen["lens"]["top_p"], np.take_along_axis(full, expected, -1), atol=1e-6
    )
    steps = len(ids)
    np.testing.assert_allclose(
        seen["lens"]["p_next"], full[:, np.arange(steps - 1), ids[1:]], atol=1e-6
    )


def test_vocabulary_maps_are_built_once_per_model(out_dir, monkeypatch):
    run = Run(out_dir)
    api.generate(run, {"prompt": "def ", "max_new_tokens": 3})
    calls = []
    for name in ("decode", "token_repr"):
        real = getattr(run.tokenizer, name)
        monkeypatch.setattr(
            run.tokenizer, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a)
        )
    api.generate(run, {"prompt": "def ", "max_new_tokens": 2})
    api.info(run, {})
    api.inspect(run, {"prompt": "def f"})
    # No calls from generation now (choices carry ids; the table words them): the
    # token table is built once per model, not once per request (46 tokens here).
    assert calls.count("token_repr") <= 2 * (1 + EXPLAIN_TOP) < run.model.config.vocab_size
    assert calls.count("decode") == 0


def test_the_inspection_cache_is_bounded_by_bytes(out_dir, monkeypatch):
    from glassllm.app.view import run as run_module

    run = Run(out_dir)
    one = run.inspection([1, 2, 3, 4, 5, 6, 7, 8]).nbytes
    monkeypatch.setattr(run_module, "INSPECTION_CACHE_BYTES", int(2.5 * one))
    for start in range(1, 6):
        run.inspection([start, 2, 3, 4, 5, 6, 7, 8])
    assert len(run._inspections) == 2
    assert run.inspection([5, 2, 3, 4, 5, 6, 7, 8]) is run.inspection([5, 2, 3, 4, 5, 6, 7, 8])
    monkeypatch.setattr(run_module, "INSPECTION_CACHE_BYTES", 1)
    latest = run.inspection(list(range(20)))  # larger than the budget: the latest stays
    assert list(run._inspections.values()) == [latest]


def test_inspect_of_a_large_vocabulary_keeps_memory_small():
    """A GPT-2-sized vocabulary: /api/inspect sorts no (L + 1, T, V) array."""
    import tracemalloc

    from glassllm.data import ByteTokenizer
    from glassllm.models import GPT, GPTConfig

    config = GPTConfig(vocab_size=50257, block_size=64, n_layer=8, n_head=2, n_embd=16)
    run = Run.of_model(GPT(config, rng=np.random.default_rng(0)), ByteTokenizer())
    ids = np.random.default_rng(1).integers(0, 256, 64).tolist()
    assert run.token(300)["repr"] == "<id 300 not in the tokenizer>"  # built once per model
    logits = 64 * 50257 * 4  # bytes of the (T, V) logits; the whole lens is 9 times that
    tracemalloc.start()
    try:
        answer = api.inspect(run, {"ids": ids})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array(answer["lens"]["top_ids"]).shape == (9, 64, LENS_TOP)
    # the inspection, the plain forward and their difference: a few (T, V), never (L + 1, T, V)
    assert peak < 4 * logits, f"peak {peak / 2**20:.1f} MiB"


# ---------------------------------------------------------------------- named sources

CITATION = re.compile(r"(glassllm/[\w/]+\.py)(?::\s*([A-Za-z_][\w.]*))?")
REPO = pathlib.Path(__file__).resolve().parents[3]


def check_citation(path, name):
    """``path`` exists and, when given, ``name`` (function or Class.attribute) is defined in it."""
    assert (REPO / path).is_file(), f"{path} does not exist"
    if name:
        module = importlib.import_module(path[:-3].replace("/", "."))
        target = module
        for part in name.split("."):
            assert hasattr(target, part), f"{path} defines no {name}"
            target = getattr(target, part)


def test_every_file_and_function_the_page_names_exists(run):
    view = REPO / "glassllm" / "app" / "view"
    texts = [p.read_text() for p in sorted((view / "static").iterdir()) if p.suffix != ".svg"]
    texts.append((view / "api.py").read_text())
    answers = [
        api.generate(run, {"prompt": "def ", "max_new_tokens": 1}),
        api.distribution(run, {"prompt": "def "}),
        api.inspect(run, {"prompt": "def "}),
        api.neuron(run, {"ids": [1, 2], "layer": 0, "index": 0}),
        api.graph_examples(run, {}),
        api.graph(run, {"example": "neuron"}),
    ]
    texts += [
        json.dumps(answer.get("source")) + json.dumps(answer.get("sources")) for answer in answers
    ]
    citations = {match for text in texts for match in CITATION.findall(text)}
    assert len(citations) >= 8
    for path, name in sorted(citations):
        check_citation(path, name)
    assert all(source for source in answers[2]["sources"].values())


@pytest.mark.parametrize(
    "name, value, accepted",
    [
        ("top_k", 2_000_000, True),  # beyond the vocabulary means all tokens, on every surface
        ("top_k", 10**9 + 1, False),
        ("top_k", 0, False),
        ("temperature", 1e-7, False),
        ("temperature", 1e-6, True),
        ("seed", -1, False),
    ],
)
def test_the_cli_and_the_viewer_share_the_sampling_bounds(run, out_dir, name, value, accepted):
    from glassllm.app.config import SampleConfig
    from glassllm.models.sampling import SamplingOptions

    body = {"prompt": "def ", "max_new_tokens": 1, name: value}
    config = SampleConfig(checkpoint=str(out_dir), max_new_tokens=1, **{name: value})
    if accepted:
        api.generate(run, body)
        config.validate()
        SamplingOptions(**{name: value})
    else:
        assert error_of(api.generate, run, body)[0] == 400
        with pytest.raises(ValueError, match=name.replace("_", "-")):
            config.validate()
        with pytest.raises(ValueError, match=name):
            SamplingOptions(**{name: value})


def test_the_page_shows_a_byte_that_splits_a_character_as_its_byte():
    from glassllm.app.view.run import _token_entry
    from glassllm.data import ByteTokenizer

    entry = _token_entry(ByteTokenizer(), 0xC3)  # the first byte of "é"
    assert entry == {"id": 0xC3, "text": "<0xC3>", "repr": "'\\xc3'"}
    assert _token_entry(ByteTokenizer(), ord("a"))["text"] == "a"
