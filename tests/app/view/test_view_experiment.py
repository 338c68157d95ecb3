"""The Experiment tab's endpoints (glassllm/app/view/experiment_api.py): each answer equals
glassllm.interp's on the same inputs; bounds and bad tokens are refused as JSON errors."""

import http.client
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from view_helpers import make_run

from glassllm import interp
from glassllm.app.view import experiment_api as xp
from glassllm.app.view import make_server
from glassllm.app.view.fields import ApiError
from glassllm.app.view.run import Run

CLEAN, CORRUPTED = "def f1(x", "def f2(x"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return Run(make_run(tmp_path_factory.mktemp("experiment") / "out"))


def ids(run, text):
    return run.tokenizer.encode(text)


def one(run, text):
    (token,) = ids(run, text)
    return token


def error_of(fn, *args):
    with pytest.raises(ApiError) as info:
        fn(*args)
    return info.value.status, info.value.message


def assert_grids_are(answer, run, experiment):
    """The answer's two grids (resid_pre x position, z x head) equal the library's `experiment`."""
    clean, corrupted = ids(run, CLEAN), ids(run, CORRUPTED)
    for key, point, index in (("resid", "resid_pre", "pos"), ("heads", "z", "head")):
        expected = experiment(
            run.model, clean, corrupted, point, index, answer=one(run, ","), wrong=one(run, ")")
        )
        assert answer[key]["values"] == expected.values.tolist()
        assert answer["clean_metric"] == expected.clean_metric
        assert answer["corrupted_metric"] == expected.corrupted_metric


def test_patch_equals_activation_patch_for_both_sweeps(run):
    body = {"clean": CLEAN, "corrupted": CORRUPTED, "answer": ",", "wrong": one(run, ")")}
    answer = xp.patch(run, body)
    assert_grids_are(answer, run, interp.activation_patch)
    clean = ids(run, CLEAN)
    L, H = run.model.config.n_layer, run.model.config.n_head
    assert np.shape(answer["resid"]["values"]) == (L, len(clean))
    assert np.shape(answer["heads"]["values"]) == (L, H)
    assert answer["resid"]["positions"] == list(CLEAN)
    assert answer["heads"]["heads"] == [f"H{h}" for h in range(H)]
    assert abs(answer["resid"]["checks"]["full_patch_gap"]) < 1e-4


def test_attribution_patch_equals_the_library_for_both_grids(run):
    body = {"clean": CLEAN, "corrupted": CORRUPTED, "answer": ",", "wrong": ")"}
    answer = xp.patch(run, {**body, "method": "attribution"})
    assert answer["method"] == "attribution"
    assert_grids_are(answer, run, interp.attribution_patch)
    measured = xp.patch(run, body)
    for key in ("resid", "heads"):
        assert answer[key]["checks"] == {"linear": 0.0}
        # an estimate, not the sweep: near it on this tiny model, not equal
        assert np.shape(answer[key]["values"]) == np.shape(measured[key]["values"])
        assert answer[key]["values"] != measured[key]["values"]
    assert "interp.attribution_patch" in answer["source"]


def test_one_layer_per_request_is_that_row_of_the_whole_sweep(run):
    body = {"clean": CLEAN, "corrupted": CORRUPTED, "answer": ",", "wrong": ")"}
    whole = xp.patch(run, body)
    assert whole["layer"] is None and whole["n_layer"] == run.model.config.n_layer
    for layer in range(run.model.config.n_layer):
        part = xp.patch(run, {**body, "layer": layer})
        assert part["layer"] == layer and part["n_layer"] == whole["n_layer"]
        assert part["checkpoint"] == whole["checkpoint"] == list(run._stamp)
        for key in ("resid", "heads"):
            assert part[key]["layers"] == [layer]
            assert part[key]["values"] == [whole[key]["values"][layer]]  # the same batches
        # patching all of a layer's resid_pre is the clean run, at any layer
        assert abs(part["resid"]["checks"]["full_patch_gap"]) < 1e-4
        assert part["clean_metric"] == whole["clean_metric"]


@pytest.mark.parametrize(
    "where", [{"point": "resid_pre", "layer": 1, "pos": 5}, {"point": "z", "layer": 0, "head": 1}]
)
def test_patch_cell_equals_patched_logits(run, where):
    body = {"clean": CLEAN, "corrupted": CORRUPTED, "answer": ",", "wrong": ")", **where}
    answer = xp.patch_cell(run, body)
    logits = interp.patched_logits(
        run.model,
        ids(run, CLEAN),
        ids(run, CORRUPTED),
        where["point"],
        where["layer"],
        pos=where.get("pos"),
        head=where.get("head"),
    )
    assert answer["value"] == float(logits[one(run, ",")]) - float(logits[one(run, ")")])
    logits = logits.astype(np.float64)  # the endpoint's softmax is in float64
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    top = answer["patched"]
    assert [t["id"] for t in top] == list(np.argsort(-probs, kind="stable")[: len(top)])
    assert top[0]["p"] == pytest.approx(probs.max(), rel=1e-12)
    # the sweep's cell and the clicked cell agree (the body's layer: the sweep of that row)
    sweep = xp.patch(run, body)["resid" if where["point"] == "resid_pre" else "heads"]
    column = where.get("pos", where.get("head"))
    assert sweep["layers"] == [where["layer"]]
    assert sweep["values"][0][column] == pytest.approx(answer["value"], abs=1e-4)


def test_ablate_equals_the_library_and_samples_beside_the_base(run):
    body = {
        "prompt": CLEAN,
        "heads": [[0, 1]],
        "neurons": [[1, 3]],
        "layers": [["mlp", 0]],
        "how": "mean",
        "max_new_tokens": 8,
        "seed": 5,
    }
    answer = xp.ablate(run, body)
    prompt = ids(run, CLEAN)
    expected = interp.ablate(run.model, prompt, [(0, 1)], [(1, 3)], [("mlp", 0)], "mean", [prompt])
    assert answer["kl"] == expected.kl > 0
    assert answer["parts"] == ["L0H1", "L1N3", "L0 mlp"]
    assert answer["ablated"][0]["p"] == pytest.approx(expected.probs.max(), rel=1e-12)
    assert answer["base"][0]["id"] == int(np.argmax(expected.base_probs))
    # the unablated continuation is generate's, from the same seed
    rng = np.random.default_rng(5)
    plain = run.model.generate(np.asarray([prompt]), 8, 0.8, rng=rng)[0, len(prompt) :]
    assert [t["id"] for t in answer["base_continuation"]] == plain.tolist()
    hooks = interp.ablation_hooks(run.model, [(0, 1)], [(1, 3)], [("mlp", 0)], "mean", [prompt])
    with run.model.hooks(hooks):
        ablated = run.model.generate(np.asarray([prompt]), 8, 0.8, rng=np.random.default_rng(5))
    assert [t["id"] for t in answer["ablated_continuation"]] == ablated[0, len(prompt) :].tolist()


def test_resample_ablation_equals_the_library_on_the_reference_prompt(run):
    body = {"prompt": CLEAN, "heads": [[1, 0]], "layers": [["attn", 0]], "how": "resample"}
    answer = xp.ablate(run, {**body, "reference": CORRUPTED, "max_new_tokens": 6, "seed": 2})
    prompt, reference = ids(run, CLEAN), ids(run, CORRUPTED)
    expected = interp.ablate(
        run.model, prompt, [(1, 0)], [], [("attn", 0)], "resample", [reference]
    )
    assert answer["how"] == "resample" and answer["kl"] == expected.kl > 0
    assert answer["parts"] == ["L1H0", "L0 attn"]
    assert [t["id"] for t in answer["ablated"]] == list(
        np.argsort(-expected.probs, kind="stable")[: xp.DISTRIBUTION_TOP]
    )
    assert answer["ablated"][0]["p"] == pytest.approx(expected.probs.max(), rel=1e-12)
    assert [t["id"] for t in answer["reference"]] == reference
    # no ablated continuation (the reference has no value past the prompt); the base one stays
    assert answer["ablated_continuation"] is None
    plain = run.model.generate(np.asarray([prompt]), 6, 0.8, rng=np.random.default_rng(2))
    assert [t["id"] for t in answer["base_continuation"]] == plain[0, len(prompt) :].tolist()
    # resampling from the prompt itself changes nothing
    same = xp.ablate(run, {**body, "reference": CLEAN, "max_new_tokens": 0})
    assert same["kl"] == 0.0


def test_steer_equals_generate_steered(run):
    body = {"positive": "class", "negative": "def  ", "prompt": "def f", "layer": 1}
    answer = xp.steer(run, {**body, "strength": 4, "max_new_tokens": 10, "seed": 3})
    vector = interp.steering_vector(run.model, ids(run, "class"), ids(run, "def  "), 1)
    assert answer["norm"] == vector.norm and answer["act_norm"] == vector.act_norm
    prompt = np.asarray([ids(run, "def f")])
    for key, alpha in (("steered_continuation", 4.0), ("base_continuation", 0.0)):
        out = interp.generate_steered(
            run.model, prompt, vector, alpha, 10, temperature=0.8, rng=np.random.default_rng(3)
        )
        assert [t["id"] for t in answer[key]] == out[0, prompt.shape[1] :].tolist()
    assert answer["steered_continuation"] != answer["base_continuation"]


@pytest.mark.parametrize("method", ["gradient_x_input", "integrated_gradients"])
def test_attribute_equals_dla_and_saliency(run, method):
    body = {"prompt": CLEAN, "answer": ",", "wrong": ")", "method": method, "n_steps": 16}
    answer = xp.attribute(run, body)
    prompt, a, w = ids(run, CLEAN), one(run, ","), one(run, ")")
    dla = interp.direct_logit_attribution(run.model, prompt, a, w)
    assert answer["dla"] == dla.as_dict()
    if method == "gradient_x_input":
        saliency = interp.gradient_x_input(run.model, prompt, answer=a, wrong=w)
    else:
        saliency = interp.integrated_gradients(run.model, prompt, answer=a, wrong=w, n_steps=16)
        assert abs(answer["saliency"]["gap"]) < 1e-3
    assert answer["saliency"]["values"] == saliency.values.tolist()
    assert answer["saliency"]["tokens"] == list(CLEAN)


@pytest.mark.parametrize(
    "fn, body, message",
    [
        (
            xp.patch,
            {"clean": CLEAN, "corrupted": CORRUPTED, "answer": "de", "wrong": ")"},
            "answer 'de' is 2 tokens, not one",
        ),
        (
            xp.patch,
            {"clean": CLEAN, "corrupted": CORRUPTED, "answer": 46, "wrong": ")"},
            "answer must be a token id in [0, 46)",
        ),
        (
            xp.patch,
            {"clean": CLEAN, "corrupted": CORRUPTED, "answer": True, "wrong": ")"},
            "answer must be a token id or the text of one token",
        ),
        (
            xp.patch,
            {"clean": CLEAN, "corrupted": "def", "answer": ",", "wrong": ")"},
            "must be as many tokens, got 8 and 3",
        ),
        (
            xp.patch,
            {"clean": "x" * 33, "corrupted": "x" * 33, "answer": ",", "wrong": ")"},
            "clean is 33 tokens; an experiment takes 1 to 32",
        ),
        (xp.patch, {"clean": "", "corrupted": "", "answer": ",", "wrong": ")"}, "clean is empty"),
        (
            xp.patch_cell,
            {
                "clean": CLEAN,
                "corrupted": CORRUPTED,
                "answer": ",",
                "wrong": ")",
                "point": "resid_pre",
                "layer": 0,
                "pos": 8,
            },
            "pos must be between 0 and 7",
        ),
        (
            xp.patch_cell,
            {
                "clean": CLEAN,
                "corrupted": CORRUPTED,
                "answer": ",",
                "wrong": ")",
                "point": "../etc",
                "layer": 0,
            },
            "point must be 'resid_pre' or 'z'",
        ),
        (xp.ablate, {"prompt": CLEAN}, "nothing to ablate"),
        (xp.ablate, {"prompt": CLEAN, "heads": [[0, 2]]}, "a head must be an integer in [0, 2)"),
        (xp.ablate, {"prompt": CLEAN, "heads": [[0, 0]] * 65}, "at most 64"),
        (xp.ablate, {"prompt": CLEAN, "layers": [["ln", 0]]}, "['attn' | 'mlp', layer]"),
        (
            xp.ablate,
            {"prompt": CLEAN, "heads": [[0, 0]], "how": "median"},
            "how must be 'zero', 'mean' or 'resample'",
        ),
        (
            xp.ablate,
            {"prompt": CLEAN, "heads": [[0, 0]], "how": "resample"},
            "reference must be a string",
        ),
        (
            xp.ablate,
            {"prompt": CLEAN, "heads": [[0, 0]], "how": "resample", "reference": ""},
            "reference is empty",
        ),
        (
            xp.ablate,
            {"prompt": CLEAN, "heads": [[0, 0]], "how": "resample", "reference": "x" * 33},
            "reference is 33 tokens; an experiment takes 1 to 32",
        ),
        (
            xp.ablate,
            {"prompt": CLEAN, "heads": [[0, 0]], "how": "resample", "reference": "def"},
            "as many tokens as the prompt, got 3 and 8",
        ),
        (
            xp.patch,
            {"clean": CLEAN, "corrupted": CORRUPTED, "answer": ",", "wrong": ")", "method": "x"},
            "method must be 'activation' or 'attribution'",
        ),
        (
            xp.patch,
            {"clean": CLEAN, "corrupted": CORRUPTED, "answer": ",", "wrong": ")", "layer": 2},
            "layer must be between 0 and 1",
        ),
        (
            xp.patch,
            {"clean": CLEAN, "corrupted": CORRUPTED, "answer": ",", "wrong": ")", "layer": "0"},
            "layer must be an integer",
        ),
        (
            xp.patch,
            {
                "clean": CLEAN,
                "corrupted": "def",
                "answer": ",",
                "wrong": ")",
                "method": "attribution",
            },
            "must be as many tokens, got 8 and 3",
        ),
        (
            xp.ablate,
            {"prompt": CLEAN, "heads": [[0, 0]], "max_new_tokens": 101},
            "max_new_tokens must be between 0 and 100",
        ),
        (
            xp.steer,
            {"positive": "d", "negative": "e", "prompt": "f", "layer": 2},
            "layer must be between 0 and 1",
        ),
        (
            xp.steer,
            {"positive": "d", "negative": "e", "prompt": "f", "layer": 0, "strength": float("inf")},
            "strength must be a finite number",
        ),
        (
            xp.attribute,
            {"prompt": CLEAN, "answer": ",", "wrong": ")", "method": "lime"},
            "method must be",
        ),
        (
            xp.attribute,
            {
                "prompt": CLEAN,
                "answer": ",",
                "wrong": ")",
                "method": "integrated_gradients",
                "n_steps": 65,
            },
            "n_steps must be between 1 and 64",
        ),
    ],
)
def test_bad_requests_are_refused_naming_the_problem(run, fn, body, message):
    status, text = error_of(fn, run, body)
    assert status == 400 and message in text


def test_a_sweep_past_the_cell_bound_is_refused(run, monkeypatch):
    monkeypatch.setattr(xp, "MAX_PATCH_CELLS", 2 * (8 + 2) - 1)
    body = {"clean": CLEAN, "corrupted": CORRUPTED, "answer": ",", "wrong": ")"}
    status, text = error_of(xp.patch, run, body)
    assert status == 400 and "would patch 20 cells" in text
    # a layer per request is 10 cells, within the bound; the attribution estimate has no cells
    assert xp.patch(run, {**body, "layer": 1})["resid"]["layers"] == [1]
    assert xp.patch(run, {**body, "method": "attribution"})["method"] == "attribution"
    monkeypatch.setattr(xp, "MAX_PATCH_CELLS", 9)
    status, text = error_of(xp.patch, run, {**body, "layer": 0})
    assert status == 400 and "would patch 10 cells" in text


def test_the_server_routes_them_and_answers_errors_as_json(run):
    server = make_server(run.out_dir, port=0)
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        patch = {"clean": CLEAN, "corrupted": CORRUPTED, "answer": ",", "wrong": ")"}
        for path, body, status, key in (
            ("attribute", {"prompt": CLEAN, "answer": ",", "wrong": ")"}, 200, "dla"),
            ("attribute", {"prompt": CLEAN, "answer": "def", "wrong": ")"}, 400, "3 tokens"),
            ("patch", {**patch, "layer": 1}, 200, "resid"),
            ("patch", {**patch, "method": "attribution"}, 200, "heads"),
            ("patch", {**patch, "layer": -1}, 400, "layer must be between 0 and 1"),
            ("patch", {**patch, "method": "../etc/passwd"}, 400, "method must be"),
        ):
            headers = {"Content-Type": "application/json"}
            connection.request("POST", f"/api/experiment/{path}", json.dumps(body), headers)
            response = connection.getresponse()
            answer = json.loads(response.read())
            assert response.status == status
            assert key in (answer if status == 200 else answer["error"])
        connection.request("GET", "/experiment.js")
        response = connection.getresponse()
        assert response.status == 200 and b"initExperiment" in response.read()
    finally:
        server.shutdown()
        server.server_close()


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        ["", "d", "de", "def f1(x", "def f2(x", "\u0665", "x" * 40, "zq", "#3"]
        + ["activation", "attribution", "resample", "mean"]
    ),
    st.lists(st.one_of(st.integers(-1, 3), st.sampled_from(["attn", "mlp", "x"])), max_size=3),
    st.lists(st.lists(st.integers(-1, 3), max_size=3), max_size=3),
)
FIELDS = [
    "clean", "corrupted", "answer", "wrong", "point", "layer", "pos", "head", "prompt", "heads",
    "neurons", "layers", "how", "max_new_tokens", "seed", "temperature", "positive", "negative",
    "strength", "method", "n_steps", "reference",
]  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    route=st.sampled_from(sorted(xp.ROUTES)),
    body=st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=8),
)
def test_any_body_is_an_answer_or_an_api_error(run, route, body):
    body.setdefault("max_new_tokens", 2)
    body.setdefault("n_steps", 2)
    try:
        answer = xp.ROUTES[route][0](run, body)
    except ApiError as err:
        assert err.status in (400, 422) and err.message
    else:
        assert isinstance(answer, dict)
